"""A vision-language model, MiniMind-V style: a frozen image encoder, a projector, a chat LM
(notebook 13).

MiniMind-V (jingyaogong/minimind-v) gives MiniMind eyes without changing its transformer: a
frozen vision encoder (CLIP, later SigLIP2) turns the picture into patch features, a small MLP
*projector* maps them to the LM's hidden size, and those vectors take the place of
placeholder tokens in the prompt, so the LM reads the picture as a few extra "words". Only
the answer is supervised, as in SFT. Here:

* the encoder is the tiny CLIP's ``ImageEncoder`` (``minimind_lib.vision``), frozen;
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

>>> from minimind_lib.tokenizer import load_tokenizer
>>> tokenizer = load_tokenizer()
>>> ids = encode_image_chat(tokenizer, [{"role": "user", "content": "<image> What colour?"}], 4)
>>> ids.count(IMAGE_TOKEN_ID)    # the four slots made by position; the typed "<image>" is text
4
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from minimind_lib.checkpoint import load_model, load_weights, save_model, save_weights
from minimind_lib.evaluate import Answer, exact_match
from minimind_lib.files import VISION_CONFIG_FILE, VISION_FILE, atomic_write_text
from minimind_lib.model import (
    IGNORE_INDEX,
    CausalLMOutput,
    MiniMindConfig,
    MiniMindForCausalLM,
    causal_lm_loss,
    sample_next_token,
)
from minimind_lib.scenes import (
    HELD_OUT_PAIRS,
    LANGUAGES,
    QUESTION_KINDS,
    Scene,
    answers,
    check_shares,
    make_scene,
    questions,
    render,
    training_scene,
)
from minimind_lib.tokenizer import END_OF_TEXT, IM_END, BPETokenizer, chat_parts
from minimind_lib.train import RunOptions, TrainConfig, TrainSettings, require_positive, train
from minimind_lib.vision import (
    CLIP,
    ZERO_SHOT_TARGETS,
    CaptionDataset,
    CLIPConfig,
    ImageEncoder,
    clip_batch_loss,
    encode_scenes,
    to_pixels,
    zero_shot,
)

#: The id of an image slot in a prompt: negative, so no text can ever encode to it (LLaVA's
#: ``IMAGE_TOKEN_INDEX``). ``splice`` replaces each slot by one projected image vector.
IMAGE_TOKEN_ID = -200


# --- the settings -------------------------------------------------------------------------


@dataclass(frozen=True)
class VisionSettings:
    """The ``vision`` stage's hyper-parameters (``profile.vision``; ``--set vision.clip_steps=..``):
    the synthetic data, the tiny CLIP's size and training, the VLM's training.

    >>> VisionSettings().image_tokens     # 8 x 8 patches of 8 pixels, 2 x 2 merged, + 1 picture
    17
    """

    train_images: int = 8000  # training pictures (scenes of the training pairs)
    # the shares of the training pictures (CLIP's and the VLM's) in unnamed inks and in unnamed
    # shapes (scenes.training_scene): each names one of colour and shape without the other, so
    # neither is learnt as a hint about the other. Measured on the cpu profile, the VLM read
    # held-out shapes at 35-37% on a CLIP with 30% recoloured pictures, 5% without; adding
    # 30% reshaped ones to both trainings: zero-shot 66% -> 77%, VQA 81.8% -> 86.9% (one run)
    recoloured: float = 0.3
    reshaped: float = 0.3
    eval_images: int = 100  # held-out pictures; each is asked all ten questions
    # the tiny CLIP's sizes (--set vision.clip.embed_dim=..; vocab_size follows the tokenizer)
    clip: CLIPConfig = field(default_factory=CLIPConfig)
    clip_steps: int = 300
    clip_batch_size: int = 64
    clip_learning_rate: float = 2e-3
    # the VLM
    merge: int = 2  # the projector merges merge x merge patches into one LM token
    vlm_steps: int = 300
    vlm_batch_size: int = 16
    vlm_learning_rate: float = 1e-3
    train_lm: bool = True  # False: train the projector only (MiniMind-V's pretraining stage)
    warmup_steps: int = 20

    def __post_init__(self) -> None:
        require_positive(self, "train_images", "eval_images", "clip_steps", "clip_batch_size",
                         "clip_learning_rate", "merge", "vlm_steps", "vlm_batch_size",
                         "vlm_learning_rate", "warmup_steps")
        check_shares(self.recoloured, self.reshaped)
        if self.train_images < self.clip_batch_size:
            raise ValueError(f"VisionSettings.train_images ({self.train_images}) must be at least "
                             f"clip_batch_size ({self.clip_batch_size}): one batch of pictures")
        grid = self.clip.grid
        if grid % self.merge:
            raise ValueError(f"VisionSettings.merge ({self.merge}) must divide the patch grid "
                             f"({grid} patches per side)")

    def clip_config(self, vocab_size: int) -> CLIPConfig:
        """``clip`` for a tokenizer of ``vocab_size`` tokens."""
        return replace(self.clip, vocab_size=vocab_size)

    @property
    def image_tokens(self) -> int:
        """LM tokens per picture (``Projector.tokens_for``)."""
        return Projector.tokens_for(self.clip.grid, self.merge)

    def clip_training(self) -> TrainSettings:
        return TrainSettings(batch_size=self.clip_batch_size, seq_len=32,
                             learning_rate=self.clip_learning_rate, max_steps=self.clip_steps,
                             warmup_steps=min(self.warmup_steps, self.clip_steps - 1),
                             eval_every=self.clip_steps, save_every=self.clip_steps)

    def vlm_training(self) -> TrainSettings:
        return TrainSettings(batch_size=self.vlm_batch_size, seq_len=64,
                             learning_rate=self.vlm_learning_rate, max_steps=self.vlm_steps,
                             warmup_steps=min(self.warmup_steps, self.vlm_steps - 1),
                             eval_every=self.vlm_steps, save_every=self.vlm_steps)


# --- the prompt: text with image slots ------------------------------------------------------


def encode_image_chat(tokenizer: BPETokenizer, messages: Sequence[dict], image_tokens: int,
                      add_generation_prompt: bool = False,
                      image_turn: int | None = None) -> list[int]:
    """``tokenizer.encode_chat`` with ``image_tokens`` slots (``IMAGE_TOKEN_ID``) opening the
    content of message ``image_turn`` (default: the first user message), right after its
    ``<|im_start|>user\\n``. Roles are special ids and contents are never parsed for special
    tokens, exactly as in ``encode_chat``; the slots come from their position alone.

    >>> from minimind_lib.tokenizer import encode_chat, load_tokenizer
    >>> tok = load_tokenizer()
    >>> chat = [{"role": "user", "content": "What shape is it?"}]
    >>> ids = encode_image_chat(tok, chat, 3, add_generation_prompt=True)
    >>> [t for t in ids if t != IMAGE_TOKEN_ID] == encode_chat(tok, chat, True)
    True
    >>> print("".join("#" if t == IMAGE_TOKEN_ID else tok.decode([t]) for t in ids))
    <|im_start|>system
    You are a helpful assistant<|im_end|>
    <|im_start|>user
    ###What shape is it?<|im_end|>
    <|im_start|>assistant
    <BLANKLINE>
    """
    if image_turn is None:
        image_turn = next((i for i, m in enumerate(messages) if m.get("role") == "user"), -1)
    if not 0 <= image_turn < len(messages):
        raise ValueError(f"no message {image_turn} to put the image in (messages: {len(messages)})")
    parts = chat_parts(messages, add_generation_prompt)
    # chat_parts renders each turn as [<|im_start|>, "role\ncontent", <|im_end|>, "\n"], after a
    # default system turn when the conversation has none
    offset = 0 if messages[0]["role"] == "system" else 1
    target = 4 * (image_turn + offset) + 1
    ids: list[int] = []
    for k, (text, special) in enumerate(parts):
        if special:
            ids.append(tokenizer.token_to_id(text))
        elif k == target:
            message = messages[image_turn]
            ids += tokenizer.encode(f"{message['role']}\n", allowed_special=set())
            ids += [IMAGE_TOKEN_ID] * image_tokens
            ids += tokenizer.encode(message["content"], allowed_special=set())
        else:
            ids += tokenizer.encode(text, allowed_special=set())
    return ids


def vqa_example(tokenizer: BPETokenizer, question: str, answer: str,
                image_tokens: int) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of one question about a picture: the prompt with its image
    slots, then the answer and ``<|im_end|>``, the only supervised tokens (answer-only loss,
    as ``data.sft_example`` labels an SFT reply)."""
    prompt = encode_image_chat(tokenizer, [{"role": "user", "content": question}], image_tokens,
                               add_generation_prompt=True)
    reply = tokenizer.encode(answer, allowed_special=set()) + [tokenizer.token_to_id(IM_END)]
    return prompt + reply, [IGNORE_INDEX] * len(prompt) + reply


# --- the model ----------------------------------------------------------------------------

#: the initial scale of the projector's per-token position vectors. Once the image encoder's own
#: positions were large enough to be learnt (``vision.ENCODER_POSITION_STD``), the patch states
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
                labels: Tensor | None = None) -> CausalLMOutput:
        hidden, _ = self.lm.model(None, inputs_embeds=self.embed(input_ids, pixel_values))
        logits = self.lm.lm_head(hidden)  # (B, T, V)
        loss = None if labels is None else causal_lm_loss(logits, labels)
        return CausalLMOutput(logits, loss)

    def answer_loss(self, input_ids: Tensor, pixel_values: Tensor | None,
                    labels: Tensor) -> Tensor:
        """``forward(...).loss`` without the full (B, T, V) logits: the LM head runs only at the
        positions whose next token is supervised (the answer's few), a third of the step's
        compute saved at this size (the head is 256 x 6,400 of the LM's ~4.6M weights)."""
        hidden, _ = self.lm.model(None, inputs_embeds=self.embed(input_ids, pixel_values))
        targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)  # (B, T): token t+1
        keep = targets != IGNORE_INDEX  # (B, T)
        logits = self.lm.lm_head(hidden[keep]).float()  # (K, V), K supervised positions
        return F.cross_entropy(logits, targets[keep])

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


# --- training data -------------------------------------------------------------------------

QUESTIONS_PER_SCENE = len(QUESTION_KINDS) * len(LANGUAGES)


class VQADataset(Dataset):
    """Questions about pictures for ``train.train``: item ``k`` is question ``k % 10`` about
    scene ``k // 10`` (drawn on demand) of ``split``; of the training set
    (``scenes.training_scene``) when ``split`` is "train", with its ``recoloured`` and
    ``reshaped`` shares. A recoloured or reshaped scene has eight questions, not ten: its
    items 8 and 9 ask its first two again. ``collate`` pads a batch."""

    def __init__(self, tokenizer: BPETokenizer, images: int, *, seed: int, image_tokens: int,
                 split: str = "train", recoloured: float = 0.0, reshaped: float = 0.0) -> None:
        if images <= 0:
            raise ValueError(f"a VQA dataset needs at least one picture, got {images}")
        if split != "train" and (recoloured or reshaped):
            raise ValueError(f"recoloured and reshaped shares are for the training split, not "
                             f"{split!r}")
        self.tokenizer, self.images, self.seed = tokenizer, images, seed
        self.image_tokens, self.split = image_tokens, split
        self.recoloured, self.reshaped = check_shares(recoloured, reshaped)
        self.pad_id = tokenizer.token_to_id(END_OF_TEXT)

    def __len__(self) -> int:
        return self.images * QUESTIONS_PER_SCENE

    def scene(self, i: int) -> Scene:
        if self.split != "train":
            return make_scene(self.seed, self.split, i)
        return training_scene(self.seed, i, self.images, self.recoloured, self.reshaped)

    def __getitem__(self, k: int) -> dict:
        scene = self.scene(k // QUESTIONS_PER_SCENE)
        records = questions(scene)
        record = records[k % QUESTIONS_PER_SCENE % len(records)]
        ids, labels = vqa_example(self.tokenizer, record["question"], record["answer"],
                                  self.image_tokens)
        return {"image": render(scene), "ids": ids, "labels": labels}

    def collate(self, items: Sequence[dict]) -> dict:
        longest = max(len(it["ids"]) for it in items)
        ids = torch.full((len(items), longest), self.pad_id, dtype=torch.long)
        labels = torch.full((len(items), longest), IGNORE_INDEX, dtype=torch.long)
        for i, it in enumerate(items):
            ids[i, :len(it["ids"])] = torch.tensor(it["ids"])
            labels[i, :len(it["labels"])] = torch.tensor(it["labels"])
        return {"input_ids": ids, "labels": labels,
                "pixel_values": to_pixels(np.stack([it["image"] for it in items]))}


def vqa_loss(model: nn.Module, batch: dict) -> tuple[Tensor, dict]:
    """``train.train``'s ``loss_fn`` for the VLM: the answer-only cross-entropy."""
    return model.answer_loss(batch["input_ids"], batch["pixel_values"], batch["labels"]), {}


# --- answering and scoring -----------------------------------------------------------------


def vqa_records(seed: int, split: str, images: int) -> list[dict]:
    """All ten questions about each of the first ``images`` scenes of ``split``; each record
    holds its ``scene`` too."""
    return [{**q, "scene": scene} for scene in (make_scene(seed, split, i) for i in range(images))
            for q in questions(scene)]


@torch.inference_mode()
def answer_questions(vlm: VisionLanguageModel, tokenizer: BPETokenizer, records: Sequence[dict],
                     max_new_tokens: int = 8, batch_size: int = 64,
                     progress: bool = False) -> list[Answer]:
    """Greedy answers to ``records`` (``question`` about ``scene``), prompts of equal length
    batched together (no padding: each answer is what the model says to that prompt alone)."""
    end_turn, end_text = tokenizer.token_to_id(IM_END), tokenizer.token_to_id(END_OF_TEXT)
    prompts = [encode_image_chat(tokenizer, [{"role": "user", "content": r["question"]}],
                                 vlm.image_tokens, add_generation_prompt=True) for r in records]
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        by_length[len(p)].append(i)
    device, was_training = next(vlm.parameters()).device, vlm.training
    vlm.eval()
    out: list[Answer | None] = [None] * len(records)
    bar = tqdm(total=len(records), desc="answer", disable=not progress)
    for group in by_length.values():
        for k in range(0, len(group), batch_size):
            idx = group[k:k + batch_size]
            ids = torch.tensor([prompts[i] for i in idx], device=device)  # (B, T)
            pixels = to_pixels(np.stack([render(records[i]["scene"]) for i in idx])).to(device)
            steps = list(vlm.stream(ids, max_new_tokens, temperature=0, eos_token_id=end_turn,
                                    pixel_values=pixels))
            for i, row in zip(idx, torch.stack(steps, dim=1).tolist(), strict=True):
                stop = next((j for j, t in enumerate(row) if t in (end_turn, end_text)), len(row))
                out[i] = Answer(tokenizer.decode(row[:stop]),
                                ended=stop < len(row) and row[stop] == end_turn)
            bar.update(len(idx))
    bar.close()
    vlm.train(was_training)
    return out


@dataclass(frozen=True)
class VQAScore:
    """Exact-match over ``n`` questions, and what guessing among the possible answers scores."""

    n: int
    exact_match: float
    chance: float


def score_vqa(records: Sequence[dict], replies: Sequence[Answer]) -> dict[str, VQAScore]:
    """Scores over all questions ("all"), per kind ("colour", ...), per language ("en", "zh")
    and per kind and language ("colour/zh").

    >>> s = make_scene(0, "held_out", 0)
    >>> recs = [{**q, "scene": s} for q in questions(s)][:2]     # colour, shape (English)
    >>> score_vqa(recs, [Answer(recs[0]["answer"], True), Answer("nothing", True)])["all"]
    VQAScore(n=2, exact_match=0.5, chance=0.225)
    """
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r, a in zip(records, replies, strict=True):
        row = (float(exact_match(a.text, r["answer"])), 1 / len(answers(r["kind"], r["language"])))
        for key in ("all", r["kind"], r["language"], f"{r['kind']}/{r['language']}"):
            groups[key].append(row)
    return {key: VQAScore(len(rows), sum(x for x, _ in rows) / len(rows),
                          sum(c for _, c in rows) / len(rows)) for key, rows in groups.items()}


# --- training both, evaluating both --------------------------------------------------------


def train_clip(clip: CLIP, tokenizer: BPETokenizer, settings: VisionSettings, *, seed: int,
               options: RunOptions | None = None, out_dir: str | Path | None = None,
               resume: bool = False, precision: str = "auto", device: str | None = None,
               progress: bool = True,
               callbacks: Iterable[Callable[[dict], None]] = ()) -> list[dict]:
    """Train the tiny CLIP on ``settings.train_images`` captioned pictures; the metrics rows."""
    data = CaptionDataset(tokenizer, settings.train_images, seed=seed,
                          recoloured=settings.recoloured, reshaped=settings.reshaped,
                          max_text_len=clip.config.max_text_len)
    config = TrainConfig.from_stage(settings.clip_training(), options, out_dir=out_dir,
                                    precision=precision, device=device, seed=seed,
                                    progress=progress)
    return train(clip, data, config, loss_fn=clip_batch_loss, collate_fn=data.collate,
                 resume=resume, callbacks=list(callbacks))


def train_vlm(vlm: VisionLanguageModel, tokenizer: BPETokenizer, settings: VisionSettings, *,
              seed: int, options: RunOptions | None = None, out_dir: str | Path | None = None,
              resume: bool = False, precision: str = "auto", device: str | None = None,
              progress: bool = True,
              callbacks: Iterable[Callable[[dict], None]] = ()) -> list[dict]:
    """Train the projector (and the LM, when ``settings.train_lm``) on questions about the
    training pictures, answer-only; the encoder stays frozen. The metrics rows."""
    vlm.lm.requires_grad_(settings.train_lm)
    data = VQADataset(tokenizer, settings.train_images, seed=seed, image_tokens=vlm.image_tokens,
                      recoloured=settings.recoloured, reshaped=settings.reshaped)
    config = TrainConfig.from_stage(settings.vlm_training(), options, out_dir=out_dir,
                                    precision=precision, device=device, seed=seed,
                                    progress=progress)
    return train(vlm, data, config, loss_fn=vqa_loss, collate_fn=data.collate, resume=resume,
                 callbacks=list(callbacks))


def evaluate_clip(clip: CLIP, tokenizer: BPETokenizer, seed: int, images: int) -> dict:
    """Zero-shot accuracy and chance per target ("pair", "colour", ...), language and split:
    ``{"en": {"pair": {"held_out": .., "seen": .., "chance": ..}, ...}, "zh": ...}``."""
    scenes = {split: [make_scene(seed, split, i) for i in range(images)]
              for split in ("held_out", "seen")}
    embedded = {split: encode_scenes(clip, s) for split, s in scenes.items()}
    out: dict[str, dict] = {}
    for language in LANGUAGES:
        for target in ZERO_SHOT_TARGETS:
            row = {}
            for split, s in scenes.items():
                row[split], row["chance"] = zero_shot(clip, tokenizer, s, target, language,
                                                      images=embedded[split])
            out.setdefault(language, {})[target] = row
    return out


def evaluate_vqa(vlm: VisionLanguageModel, tokenizer: BPETokenizer, seed: int, images: int,
                 progress: bool = False) -> dict[str, dict[str, VQAScore]]:
    """Greedy exact-match on all ten questions about ``images`` pictures of each split:
    ``{"held_out": score_vqa(...), "seen": score_vqa(...)}``."""
    out = {}
    for split in ("held_out", "seen"):
        records = vqa_records(seed, split, images)
        out[split] = score_vqa(records, answer_questions(vlm, tokenizer, records,
                                                         progress=progress))
    return out


def vision_eval(zero: dict, vqa: dict[str, dict[str, VQAScore]], **extra: object) -> dict:
    """The ``vision`` stage's ``eval.json``: the four headline figures (zero-shot (colour, shape)
    accuracy of held-out pictures with English captions, and held-out VQA exact-match, each
    with its chance), then the details: ``zero_shot`` as ``evaluate_clip`` returns it, and
    ``vqa`` per split and group (kind, language, kind/language)."""
    held_out = vqa["held_out"]["all"]
    return {"zero_shot_accuracy": zero["en"]["pair"]["held_out"],
            "zero_shot_chance": zero["en"]["pair"]["chance"],
            "vqa_exact_match": held_out.exact_match, "vqa_chance": held_out.chance,
            "vqa_by_kind": {k: asdict(vqa["held_out"][k]) for k in QUESTION_KINDS},
            "held_out_pairs": [list(p) for p in HELD_OUT_PAIRS], **extra,
            "zero_shot": zero,
            "vqa": {split: {k: asdict(v) for k, v in scores.items()}
                    for split, scores in vqa.items()}}


def vision_table(result: dict) -> str:
    """``vision_eval``'s figures as two markdown tables: zero-shot per target, VQA per kind."""
    zero = result["zero_shot"]
    lines = ["zero-shot classification (held-out pairs | seen pairs | chance)", "",
             "| target | en | zh |", "|---|---|---|"]
    for target in ZERO_SHOT_TARGETS:
        cells = [f"{zero[lang][target]['held_out']:.1%} / {zero[lang][target]['seen']:.1%} / "
                 f"{zero[lang][target]['chance']:.1%}" for lang in LANGUAGES]
        lines.append(f"| {target} | " + " | ".join(cells) + " |")
    lines += ["", "VQA exact-match (greedy)", "", "| question | held-out pairs | seen pairs | "
              "chance | n |", "|---|---|---|---|---|"]
    for key in ("all", *QUESTION_KINDS, *LANGUAGES):
        held, seen = result["vqa"]["held_out"][key], result["vqa"]["seen"][key]
        lines.append(f"| {key} | {held['exact_match']:.1%} | {seen['exact_match']:.1%} | "
                     f"{held['chance']:.1%} | {held['n']} |")
    return "\n".join(lines)


# --- pictures over HTTP ----------------------------------------------------------------------


def data_url(image: np.ndarray) -> str:
    """An RGB picture (H, W, 3) uint8 as a PNG ``data:`` URL, the form OpenAI's chat API takes
    a local picture in (``{"type": "image_url", "image_url": {"url": ...}}``)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(image, dtype=np.uint8)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def image_from_data_url(url: str, size: int) -> np.ndarray:
    """The picture of a ``data:image/...;base64,...`` URL as (size, size, 3) uint8 RGB, resized
    when it is another size; anything else (a web link, broken base64, bytes that are no
    picture) is a ``ValueError`` saying which. Links are refused: the server fetches nothing.

    >>> picture = render(make_scene(0, "held_out", 0))
    >>> bool((image_from_data_url(data_url(picture), 64) == picture).all())
    True
    >>> image_from_data_url("https://example.com/cat.png", 64)
    Traceback (most recent call last):
    ...
    ValueError: image_url must be a data URL (data:image/png;base64,...); this server fetches ...
    """
    from PIL import Image, UnidentifiedImageError

    head, comma, payload = url.partition(",")
    if not (head.startswith("data:image/") and head.endswith(";base64") and comma):
        raise ValueError("image_url must be a data URL (data:image/png;base64,...); this server "
                         "fetches no links")
    try:
        raw = base64.b64decode(payload, validate=True)
    except binascii.Error as e:
        raise ValueError(f"image_url: the base64 data is damaged ({e})") from None
    try:
        with Image.open(io.BytesIO(raw)) as opened:
            picture = opened.convert("RGB")
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"image_url: the data is not a picture ({e})") from None
    if picture.size != (size, size):
        picture = picture.resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(picture, dtype=np.uint8)


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
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        clip_config, merge = CLIPConfig(**meta["clip"]), int(meta["merge"])
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"{path}: {type(e).__name__}: {e}") from None
    lm = load_model(directory)
    encoder = ImageEncoder(clip_config)
    projector = Projector.for_encoder(clip_config, lm.config.hidden_size, merge)
    load_weights(nn.ModuleDict({"encoder": encoder, "projector": projector}),
                 directory / VISION_FILE)
    return VisionLanguageModel(lm, encoder, projector).to(device).eval()

