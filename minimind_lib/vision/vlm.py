"""A vision-language model, MiniMind-V style: a frozen image encoder, a projector, a chat LM
(notebook 13).

MiniMind-V (jingyaogong/minimind-v) gives MiniMind eyes without changing its transformer: a
frozen vision encoder (CLIP, later SigLIP2) turns the picture into patch features, a small MLP
*projector* maps them to the LM's hidden size, and those vectors take the place of
placeholder tokens in the prompt, so the LM reads the picture as a few extra "words". Only
the answer is supervised, as in SFT. Here:

* the encoder is the tiny CLIP's ``ImageEncoder`` (``minimind_lib.vision.clip``), frozen;
* ``Projector`` merges each 2 x 2 block of patch features into one vector (MiniMind-V's
  projector merges 4 neighbouring tokens too) and maps it through Linear -> GELU -> Linear,
  then appends one *picture token* made from the CLIP embedding of the whole picture;
* the LM is a course chat model (``data/reference/sft``, or the student's own ``sft`` stage);
* ``encode_image_chat`` writes the prompt with ``image_tokens`` slots holding
  ``IMAGE_TOKEN_ID``, and ``splice`` replaces the slots' embeddings by the projected image.

**Why user text cannot forge an image slot.** MiniMind-V marks the slots with ordinary text
(196 ``@`` in its first version, ``<|image_pad|>`` later), so a user who types that text makes
slots the model will fill or misread. Here the slot is ``IMAGE_TOKEN_ID = -200`` (LLaVA's
``IMAGE_TOKEN_INDEX``): a negative number, which no tokenizer output can be, inserted by
position when the prompt is built, never parsed from text. Typing "<image>" or "@@@@" gives
ordinary text tokens, and the LM would refuse a -200 anyway (``MiniMindModel`` rejects ids
outside the vocabulary): only ``splice`` consumes the slots.

>>> from minimind_lib.tokenizer.bpe import load_tokenizer
>>> tokenizer = load_tokenizer()
>>> ids = encode_image_chat(tokenizer, [{"role": "user", "content": "<image> What colour?"}], 4)
>>> ids.count(IMAGE_TOKEN_ID)    # the four slots made by position; the typed "<image>" is text
4
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minimind_lib.core.atomic import atomic_write_text
from minimind_lib.core.checked_files import read_json
from minimind_lib.core.filenames import VISION_CONFIG_FILE, VISION_FILE
from minimind_lib.model.checkpoint import load_model, load_weights, save_model, save_weights
from minimind_lib.model.config import MiniMindConfig
from minimind_lib.model.decoder import (
    CausalLMOutput,
    MiniMindForCausalLM,
)
from minimind_lib.model.sampling import sample_next_token
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.chat import chat_parts, marker_id, template_of
from minimind_lib.vision.clip import (
    CLIP,
    CLIPConfig,
    ImageEncoder,
)

#: The id of an image slot in a prompt: negative, so no text can ever encode to it (LLaVA's
#: ``IMAGE_TOKEN_INDEX``). ``splice`` replaces each slot by one projected image vector.
IMAGE_TOKEN_ID = -200


# --- the prompt: text with image slots ------------------------------------------------------


def encode_image_chat(tokenizer: BPETokenizer, messages: Sequence[dict], image_tokens: int,
                      add_generation_prompt: bool = False,
                      image_turn: int | None = None) -> list[int]:
    """``tokenizer.encode_chat`` with ``image_tokens`` slots (``IMAGE_TOKEN_ID``) opening the
    content of message ``image_turn`` (default: the first user message), right after its
    ``<|im_start|>user\n``. Roles are special ids and contents are never parsed for special
    tokens, exactly as in ``encode_chat`` (in the tokenizer's template, ``template_of``); the
    slots come from their position alone.

    >>> from minimind_lib.tokenizer.chat import encode_chat
    >>> from minimind_lib.tokenizer.bpe import load_tokenizer
    >>> tok = load_tokenizer()
    >>> chat = [{"role": "user", "content": "What shape is it?"}]
    >>> ids = encode_image_chat(tok, chat, 3, add_generation_prompt=True)
    >>> [t for t in ids if t != IMAGE_TOKEN_ID] == encode_chat(tok, chat, True)
    True
    >>> print("".join("#" if t == IMAGE_TOKEN_ID else tok.decode([t]) for t in ids))
    <|im_start|>user
    ###What shape is it?<|im_end|>
    <|im_start|>assistant
    <think>
    <BLANKLINE>
    </think>
    <BLANKLINE>
    <BLANKLINE>
    """
    if image_turn is None:
        image_turn = next((i for i, m in enumerate(messages) if m.get("role") == "user"), -1)
    if not 0 <= image_turn < len(messages):
        raise ValueError(f"no message {image_turn} to put the image in (messages: {len(messages)})")
    # the slots' place: a mark opening the image turn's content (random per call, so no text
    # can hold it), found in the rendering and cut out of it
    mark = f"\x00{secrets.token_hex(16)}\x00"
    marked = [dict(m) for m in messages]
    marked[image_turn]["content"] = mark + str(messages[image_turn].get("content"))
    template = template_of(tokenizer)
    ids: list[int] = []
    for text, special in chat_parts(marked, add_generation_prompt, template=template):
        if special:
            ids.append(marker_id(tokenizer, text, template))
            continue
        head, found, tail = text.partition(mark)
        ids += tokenizer.encode(head, allowed_special=set())
        if found:
            ids += [IMAGE_TOKEN_ID] * image_tokens + tokenizer.encode(tail, allowed_special=set())
    return ids


# --- the model ----------------------------------------------------------------------------

#: the initial scale of the projector's per-token position vectors. Once the image encoder's own
#: positions were large enough to be learnt (``vision.clip.ENCODER_POSITION_STD``), the patch states
#: say where they are, and big vectors here only drown them: on one smoke CLIP, with the picture
#: token, VQA 80.8% at 0.5 -> 83.8% at 0.02 (colour 84% -> 94%); at 1.0 (before the picture
#: token) side 99% but colour 43%
POSITION_STD = 0.02


class Projector(nn.Module):
    """Patch features (B, N, D) and the picture's CLIP embedding (B, E) -> LM inputs
    (B, M + 1, C).

    * **Patch tokens**: each ``merge x merge`` block of neighbouring patches is concatenated
      (M = N / merge^2 tokens, 4x fewer at merge 2), then Linear -> GELU -> Linear to the LM's
      width (MiniMind-V's ``MMVisionProjector`` does the same with four consecutive tokens;
      Qwen2-VL's merger with 2 x 2 blocks, as here), plus a learned vector per token.
    * **One picture token**, last: the CLIP embedding (what zero-shot classification reads),
      L2-normalised and scaled to unit RMS, through its own Linear -> GELU -> Linear: a global
      view beside the patches, as LLaVA-NeXT adds a downscaled whole picture beside its tiles.
      The patch tokens alone taught the smoke VLM one kind of question at a time: with the
      encoder's positions learnt, side 100% but colour 20-35% (VQA 54.2%, 73.2%, two seeds);
      with this token, 83.8% (colour 94%) on the first of those CLIPs.

    >>> Projector(vision_width=8, hidden_size=16, grid=6, embed_dim=4)(
    ...     torch.zeros(2, 36, 8), torch.ones(2, 4)).shape
    torch.Size([2, 10, 16])
    """

    def __init__(self, vision_width: int, hidden_size: int, grid: int, merge: int = 2, *,
                 embed_dim: int) -> None:
        super().__init__()
        if grid % merge:
            raise ValueError(f"merge ({merge}) must divide the patch grid ({grid})")
        self.grid, self.merge = grid, merge
        self.mlp = nn.Sequential(nn.Linear(vision_width * merge * merge, hidden_size), nn.GELU(),
                                 nn.Linear(hidden_size, hidden_size))
        self.position = nn.Parameter(torch.randn(self.patch_tokens, hidden_size) * POSITION_STD)
        self.picture = nn.Sequential(nn.Linear(embed_dim, hidden_size), nn.GELU(),
                                     nn.Linear(hidden_size, hidden_size))

    @classmethod
    def for_encoder(cls, config: CLIPConfig, hidden_size: int, merge: int) -> Projector:
        """A new projector from an image encoder of ``config`` to an LM of ``hidden_size``."""
        return cls(config.vision_width, hidden_size, config.grid, merge,
                   embed_dim=config.embed_dim)

    @staticmethod
    def tokens_for(grid: int, merge: int) -> int:
        """LM tokens per picture: the ``(grid / merge)^2`` merged patches and the picture token."""
        return (grid // merge) ** 2 + 1

    @property
    def num_tokens(self) -> int:
        return self.tokens_for(self.grid, self.merge)

    @property
    def patch_tokens(self) -> int:
        return self.num_tokens - 1

    def merge_patches(self, features: Tensor) -> Tensor:
        """(B, g*g, D) -> (B, (g/m)^2, m*m*D): each block's patches side by side."""
        B, _, D = features.shape
        g, m = self.grid, self.merge
        x = features.reshape(B, g // m, m, g // m, m, D)  # (B, row block, row, col block, col, D)
        x = x.permute(0, 1, 3, 2, 4, 5)  # (B, row block, col block, row, col, D)
        return x.reshape(B, (g // m) ** 2, m * m * D)

    def picture_token(self, embedding: Tensor) -> Tensor:
        """(B, E) -> (B, 1, C): the CLIP embedding at unit RMS, projected."""
        unit = F.normalize(embedding, dim=-1) * embedding.shape[-1] ** 0.5
        return self.picture(unit)[:, None]

    def forward(self, features: Tensor, embedding: Tensor) -> Tensor:
        patches = self.mlp(self.merge_patches(features)) + self.position  # (B, M, C)
        return torch.cat([patches, self.picture_token(embedding)], dim=1)  # (B, M + 1, C)


def splice(embeds: Tensor, input_ids: Tensor, image_embeds: Tensor) -> Tensor:
    """``embeds`` (B, T, C) with row b's ``IMAGE_TOKEN_ID`` slots replaced, in order, by
    ``image_embeds[b]`` (B, M, C); every row must hold exactly M slots.

    >>> ids = torch.tensor([[7, IMAGE_TOKEN_ID, IMAGE_TOKEN_ID, 8]])
    >>> splice(torch.zeros(1, 4, 1), ids, torch.tensor([[[1.0], [2.0]]]))[0, :, 0].tolist()
    [0.0, 1.0, 2.0, 0.0]
    """
    slots = input_ids == IMAGE_TOKEN_ID  # (B, T)
    per_row = slots.sum(dim=1)  # (B,)
    if image_embeds.shape[:1] != embeds.shape[:1] or bool((per_row != image_embeds.shape[1]).any()):
        raise ValueError(f"image slots per row {per_row.tolist()} do not match the "
                         f"{tuple(image_embeds.shape[:2])} (pictures, tokens) given")
    out = embeds.clone()
    # subtle: boolean indexing walks (b, t) row-major, i.e. row b's slots in order, then b+1's
    out[slots] = image_embeds.reshape(-1, image_embeds.shape[-1]).to(out.dtype)
    return out


class VisionLanguageModel(nn.Module):
    """A chat LM that reads pictures: ``lm`` + frozen ``encoder`` + trainable ``projector``.

    ``forward(input_ids, pixel_values, labels)`` is the LM's forward with the projected picture
    spliced into the slots (no slots, no picture: the plain LM). ``config`` is the LM's.
    """

    def __init__(self, lm: MiniMindForCausalLM, encoder: ImageEncoder,
                 projector: Projector) -> None:
        super().__init__()
        self.lm, self.encoder, self.projector = lm, encoder, projector
        self.encoder.requires_grad_(False)  # frozen, as in MiniMind-V
        self.encoder.eval()

    @property
    def config(self) -> MiniMindConfig:
        return self.lm.config

    def num_parameters(self) -> int:
        """Parameters of the whole model: image encoder, projector and language model."""
        return sum(p.numel() for p in self.parameters())

    @property
    def image_tokens(self) -> int:
        return self.projector.num_tokens

    def train(self, mode: bool = True) -> VisionLanguageModel:
        super().train(mode)
        self.encoder.eval()  # frozen: never in training mode
        return self

    def image_embeddings(self, pixel_values: Tensor) -> Tensor:
        """(B, 3, H, W) -> (B, M, C): frozen features, trainable projection."""
        with torch.no_grad():
            features = self.encoder.patch_features(pixel_values)  # (B, N, D)
            embedding = self.encoder.pool(features)  # (B, E)
        return self.projector(features, embedding)

    def embed(self, input_ids: Tensor, pixel_values: Tensor | None) -> Tensor:
        """The LM's input vectors (B, T, C): token embeddings, image slots spliced."""
        has_slots = bool((input_ids == IMAGE_TOKEN_ID).any())
        if has_slots != (pixel_values is not None):
            raise ValueError("image slots in the prompt need pixel_values, and pixel_values "
                             "need image slots (encode_image_chat)")
        embeds = self.lm.model.embed_tokens(input_ids.clamp(min=0))  # slots are overwritten
        if pixel_values is None:
            return embeds
        return splice(embeds, input_ids, self.image_embeddings(pixel_values))

    def forward(self, input_ids: Tensor, pixel_values: Tensor | None = None,
                labels: Tensor | None = None, return_logits: bool = False) -> CausalLMOutput:
        """As ``MiniMindForCausalLM.forward``: with ``labels`` the loss and no logits (unless
        ``return_logits=True``)."""
        hidden, _ = self.lm.model(None, inputs_embeds=self.embed(input_ids, pixel_values))
        return CausalLMOutput(*self.lm.head_outputs(hidden, labels, return_logits))

    def answer_loss(self, input_ids: Tensor, pixel_values: Tensor | None,
                    labels: Tensor) -> Tensor:
        """``forward(...).loss``: the LM head runs only at the positions whose next token is
        supervised (the answer's few; ``MiniMindForCausalLM.head_loss`` drops the others), a
        third of the step's compute saved at this size (the head is 256 x 6,400 of the LM's
        ~4.6M weights)."""
        return self.forward(input_ids, pixel_values, labels).loss

    @torch.no_grad()
    def stream(self, input_ids: Tensor, max_new_tokens: int, temperature: float = 1.0,
               top_k: int | None = None, top_p: float | None = None,
               eos_token_id: int | None = None, generator: torch.Generator | None = None, *,
               pixel_values: Tensor | None = None) -> Iterable[Tensor]:
        """``MiniMindForCausalLM.stream`` for a prompt with a picture: the first step reads the
        spliced sequence, later steps one token each through the KV cache (always: the picture
        is in the cache, not in the ids)."""
        lm = self.lm
        if input_ids.shape[1] + max_new_tokens > lm.config.max_position_embeddings:
            raise ValueError(f"prompt ({input_ids.shape[1]}) + max_new_tokens ({max_new_tokens}) "
                             f"exceeds max_position_embeddings "
                             f"({lm.config.max_position_embeddings})")
        finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        hidden, cache = lm.model(None, inputs_embeds=self.embed(input_ids, pixel_values))
        for step in range(max_new_tokens):
            logits = lm.lm_head(hidden[:, -1]).float()  # (B, V)
            token = sample_next_token(logits, temperature, top_k, top_p, generator)  # (B,)
            if eos_token_id is not None:
                token = token.masked_fill(finished, eos_token_id)
                finished |= token == eos_token_id
            yield token
            if (eos_token_id is not None and bool(finished.all())) or step == max_new_tokens - 1:
                return
            hidden, cache = lm.model(token[:, None], cache)  # (B, 1, C)


def build_vlm(lm: MiniMindForCausalLM, clip: CLIP, merge: int = 2) -> VisionLanguageModel:
    """The VLM of a chat LM and a (trained) CLIP's image encoder, with a new projector."""
    projector = Projector.for_encoder(clip.config, lm.config.hidden_size, merge)
    return VisionLanguageModel(lm, clip.image_encoder, projector)


# --- a VLM folder --------------------------------------------------------------------------


def save_vlm(vlm: VisionLanguageModel, directory: str | Path) -> Path:
    """A VLM folder: the LM as a ``load_model`` folder (``model.safetensors``, ``config.json``),
    plus ``vision.safetensors`` (encoder + projector) and ``vision.json`` (their config),
    written last: a folder without it is read as a plain chat model."""
    directory = Path(directory)
    save_model(vlm.lm, directory)
    save_weights(nn.ModuleDict({"encoder": vlm.encoder, "projector": vlm.projector}),
                 directory / VISION_FILE)
    config = {"clip": asdict(vlm.encoder.config), "merge": vlm.projector.merge}
    atomic_write_text(directory / VISION_CONFIG_FILE, json.dumps(config, indent=2) + "\n")
    return directory


def is_vlm_folder(directory: str | Path) -> bool:
    return (Path(directory) / VISION_CONFIG_FILE).is_file()


def load_vlm(directory: str | Path, device: str | torch.device = "cpu") -> VisionLanguageModel:
    """The VLM ``save_vlm`` wrote; strict, like ``load_model``."""
    directory = Path(directory)
    path = directory / VISION_CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file ({directory} is not a VLM folder)")
    meta = read_json(path)
    try:
        clip_config, merge = CLIPConfig(**meta["clip"]), int(meta["merge"])
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"{path}: {type(e).__name__}: {e}") from None
    lm = load_model(directory)
    encoder = ImageEncoder(clip_config)
    projector = Projector.for_encoder(clip_config, lm.config.hidden_size, merge)
    load_weights(nn.ModuleDict({"encoder": encoder, "projector": projector}),
                 directory / VISION_FILE)
    return VisionLanguageModel(lm, encoder, projector).to(device).eval()
