"""A tiny CLIP: a ViT image encoder and a text encoder trained to agree (notebook 13).

CLIP (Radford et al. 2021, "Learning Transferable Visual Models From Natural Language
Supervision") learns from (image, caption) pairs alone. Each encoder maps its input to a unit
vector; in a batch of N pairs the N x N cosine similarities, times a learned scale
``exp(t)``, are logits, and the loss asks every image to pick its own caption among the N
and every caption its own image (``clip_loss``, the symmetric InfoNCE of the paper's
Figure 3). Nothing says what a "colour" or a "circle" is: the captions do.

* ``patchify`` cuts a picture into ``p x p`` patches, one token each (Dosovitskiy et al.
  2021, "An Image is Worth 16x16 Words", eq. 1);
* ``ImageEncoder``: patch embedding + learned positions -> the course's pre-norm ``Block``
  with the causal mask removed (``EncoderAttention``: every patch sees every patch) ->
  RMSNorm; the mean over patches, projected, is the image embedding. Its per-patch
  states are what the vision-language model reads (``minimind_lib.vision.vlm``);
* ``TextEncoder``: the course tokenizer and the course's decoder trunk (``MiniMindModel``,
  causal, RoPE); like CLIP's, it reads the caption's state at the end-of-text token;
* ``zero_shot``: classify pictures by the caption they are closest to, for classes the
  model never saw as labels (only inside captions).

>>> clip = CLIP(CLIPConfig(vocab_size=16, vision_layers=1, text_layers=1))
>>> pixels = torch.zeros(2, 3, 64, 64)
>>> ids, lengths = torch.tensor([[5, 0], [6, 7]]), torch.tensor([1, 2])
>>> clip(pixels, ids, lengths).shape    # image i vs caption j, scaled cosines
torch.Size([2, 2])
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minimind_lib.core.atomic import atomic_write_text
from minimind_lib.core.checked_files import read_json
from minimind_lib.core.filenames import CLIP_CONFIG_FILE, WEIGHTS_FILE
from minimind_lib.model.attention import Attention
from minimind_lib.model.checkpoint import load_weights, save_weights
from minimind_lib.model.config import MiniMindConfig
from minimind_lib.model.decoder import Block, MiniMindForCausalLM, MiniMindModel
from minimind_lib.model.layers import RMSNorm
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.special import END_OF_TEXT
from minimind_lib.vision.scenes import (
    COLOURS,
    COUNTS,
    IMAGE_SIZE,
    LANGUAGES,
    SHAPES,
    SIDES,
    SIZES,
    Scene,
    caption,
    check_shares,
    render,
    training_scene,
)

#: the initial scale of the image encoder's position vectors. ViT's 0.02 is lost beside the patch
#: embedding of a normalised shape (RMS ~1-1.5 at the start, against ~0.1 for background), and the
#: mean-pooled embedding then never learns where the shapes are. Measured on smoke CLIPs (400 x
#: 128 steps, 50 held-out pictures): zero-shot side 40% at 0.02 (chance 50%), 100% at 0.5 and 1.0
#: (two seeds at 0.5), and (colour, shape) on held-out pairs 70% -> 82-88%
ENCODER_POSITION_STD = 0.5


@dataclass(frozen=True)
class CLIPConfig:
    """The two encoders' sizes. ``embed_dim`` is the shared embedding space; ``temperature``
    the initial softmax temperature (CLIP's 0.07, i.e. a logit scale of 1/0.07 ~ 14.3, learned
    from there and capped at 100)."""

    image_size: int = IMAGE_SIZE
    patch_size: int = 8
    vision_width: int = 64
    vision_layers: int = 2
    vision_heads: int = 4
    text_width: int = 64
    text_layers: int = 2
    text_heads: int = 4
    max_text_len: int = 32  # caption tokens, end-of-text included
    vocab_size: int = 6400
    embed_dim: int = 64
    temperature: float = 0.07

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"CLIPConfig.{f.name} must be positive, got "
                                 f"{getattr(self, f.name)}")
        if self.image_size % self.patch_size:
            raise ValueError(f"CLIPConfig.image_size ({self.image_size}) must be a multiple of "
                             f"patch_size ({self.patch_size})")

    @property
    def grid(self) -> int:
        """Patches per side."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid**2

    def vision_block_config(self) -> MiniMindConfig:
        """The course's block config at the vision width: no RoPE (the encoder adds learned
        positions to the patches instead, as ViT does)."""
        return MiniMindConfig(vocab_size=1, hidden_size=self.vision_width,
                              num_hidden_layers=self.vision_layers,
                              num_attention_heads=self.vision_heads,
                              num_key_value_heads=self.vision_heads,
                              max_position_embeddings=self.num_patches, position_encoding="none")

    def text_model_config(self) -> MiniMindConfig:
        return MiniMindConfig(vocab_size=self.vocab_size, hidden_size=self.text_width,
                              num_hidden_layers=self.text_layers,
                              num_attention_heads=self.text_heads,
                              num_key_value_heads=self.text_heads,
                              max_position_embeddings=self.max_text_len, rope_theta=1e4)


# --- pictures as tokens -------------------------------------------------------------------


#: The training pictures' per-channel pixel mean and standard deviation (RGB, pixels / 255;
#: measured over 2,000 of them, recoloured and reshaped ones included: tests check it). CLIP
#: normalises its input so, with its own dataset's figures. Here most pixels are the light
#: background: scaled to [-1, 1] instead, a shape is a small change on a large constant, and
#: a smoke CLIP of 16-pixel patches learnt colour in some seeds only (docs/benchmarks.md).
PIXEL_MEAN = (0.923, 0.922, 0.922)
PIXEL_STD = (0.110, 0.109, 0.116)


def to_pixels(images: np.ndarray | Tensor) -> Tensor:
    """uint8 RGB pictures (B, H, W, 3) (or one, (H, W, 3)) -> float (B, 3, H, W), each channel
    normalised by the training pictures' ``PIXEL_MEAN`` and ``PIXEL_STD``: the background is
    about 0.2, a shape's ink several units away.

    >>> to_pixels(np.full((2, 2, 3), 255, dtype=np.uint8)).shape
    torch.Size([1, 3, 2, 2])
    >>> pixels = to_pixels(np.array([[[240, 240, 240], [220, 40, 40]]], dtype=np.uint8))
    >>> pixels[0, :, 0].round(decimals=1)
    tensor([[ 0.2000, -0.5000],
            [ 0.2000, -7.0000],
            [ 0.2000, -6.6000]])
    """
    x = torch.tensor(np.asarray(images))  # a copy: PIL's arrays are read-only
    if x.dim() == 3:
        x = x[None]
    mean = torch.tensor(PIXEL_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(PIXEL_STD).view(1, 3, 1, 1)
    return (x.permute(0, 3, 1, 2).float() / 255.0 - mean) / std  # (B, 3, H, W)


def patchify(pixels: Tensor, patch_size: int) -> Tensor:
    """(B, C, H, W) -> (B, N, C*p*p): row-major patches, each flattened channel-first (the
    order ``nn.Conv2d(C, D, p, stride=p)`` reads its weight in, so a linear layer on these
    equals that convolution; notebook 13 checks it).

    >>> x = torch.arange(16.0).reshape(1, 1, 4, 4)
    >>> patchify(x, 2)[0, 1].tolist()     # the top-right 2 x 2 patch
    [2.0, 3.0, 6.0, 7.0]
    """
    B, C, H, W = pixels.shape
    p = patch_size
    if H % p or W % p:
        raise ValueError(f"a {H}x{W} picture does not cut into {p}x{p} patches")
    x = pixels.reshape(B, C, H // p, p, W // p, p)  # (B, C, gh, p, gw, p)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (B, gh, gw, C, p, p)
    return x.reshape(B, (H // p) * (W // p), C * p * p)  # (B, N, C*p*p)


class EncoderAttention(Attention):
    """``model.attention.Attention`` without the causal mask: in a picture no patch comes "before"
    another, so every patch attends to every patch (ViT; the text side stays causal)."""

    # ``mask`` and ``positions`` come only with a static KV cache, which an encoder never has
    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, dropout: float,
              mask: Tensor | None = None, positions: Tensor | None = None) -> Tensor:
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, enable_gqa=self.n_kv_heads != self.n_heads)  # (B, H, T, D)

    def _weights(self, q: Tensor, k: Tensor, dropout: float, mask: Tensor | None = None,
                 positions: Tensor | None = None) -> Tensor:
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, Tq, Tk), no mask
        weights = F.softmax(scores.float(), dim=-1).to(q.dtype)
        return F.dropout(weights, p=dropout, training=dropout > 0)


class EncoderBlock(Block):
    """The course's pre-norm block (RMSNorm, attention, SwiGLU) with ``EncoderAttention``."""

    def __init__(self, config: MiniMindConfig, use_sdpa: bool = True) -> None:
        super().__init__(config, use_sdpa)
        self.self_attn = EncoderAttention(config, use_sdpa)


class ImageEncoder(nn.Module):
    """A small ViT: ``patchify`` -> linear patch embedding + learned positions -> encoder
    blocks -> RMSNorm. ``patch_features`` are the per-patch states (B, N, width);
    ``forward`` their mean, projected to ``embed_dim`` (unnormalised; ``pool``)."""

    def __init__(self, config: CLIPConfig) -> None:
        super().__init__()
        self.config = config
        block_config = config.vision_block_config()
        self.patch_embed = nn.Linear(3 * config.patch_size**2, config.vision_width)
        self.position = nn.Parameter(torch.zeros(config.num_patches, config.vision_width))
        self.layers = nn.ModuleList(EncoderBlock(block_config) for _ in range(config.vision_layers))
        self.norm = RMSNorm(config.vision_width)
        self.proj = nn.Linear(config.vision_width, config.embed_dim, bias=False)
        self.apply(MiniMindForCausalLM._init_weights)
        nn.init.normal_(self.position, std=ENCODER_POSITION_STD)

    def patch_features(self, pixels: Tensor) -> Tensor:
        """(B, 3, H, W) -> (B, N, width)."""
        x = self.patch_embed(patchify(pixels, self.config.patch_size)) + self.position  # (B, N, W)
        for layer in self.layers:
            x, _ = layer(x, None, None)  # no RoPE: the positions were added above
        return self.norm(x)

    def pool(self, features: Tensor) -> Tensor:
        """Patch states (B, N, width) -> the picture's embedding (B, E): their mean, projected."""
        return self.proj(features.mean(dim=1))

    def forward(self, pixels: Tensor) -> Tensor:
        return self.pool(self.patch_features(pixels))  # (B, E)


class TextEncoder(nn.Module):
    """The course tokenizer's ids -> the course's causal trunk -> the state at each caption's
    last token (its end-of-text), projected to ``embed_dim``: causal attention lets that one
    position read the whole caption, and right padding after it is never seen."""

    def __init__(self, config: CLIPConfig) -> None:
        super().__init__()
        self.config = config
        self.trunk = MiniMindModel(config.text_model_config())
        self.proj = nn.Linear(config.text_width, config.embed_dim, bias=False)
        self.apply(MiniMindForCausalLM._init_weights)

    def forward(self, input_ids: Tensor, lengths: Tensor) -> Tensor:
        """``input_ids`` (B, L) right-padded, ``lengths`` (B,) real tokens -> (B, E)."""
        hidden, _ = self.trunk(input_ids)  # (B, L, C)
        last = hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths - 1]  # (B, C)
        return self.proj(last)


def clip_loss(similarity: Tensor) -> Tensor:
    """The symmetric InfoNCE loss of CLIP (Radford et al. 2021, Figure 3; van den Oord et al.
    2018, eq. 4): the mean of cross-entropy over rows (each image picks its caption) and over
    columns (each caption picks its image), the right answer on the diagonal.

    ``similarity`` (N, N) are logits: scaled cosines. Equals ``transformers``' ``clip_loss``
    (called ``image_text_contrastive_loss`` since transformers 5; tests/test_vision.py).

    >>> round(clip_loss(torch.zeros(4, 4)).item(), 4)     # no idea: ln 4
    1.3863
    >>> clip_loss(10 * torch.eye(3)).item() < 1e-3       # sure and right
    True
    """
    if similarity.dim() != 2 or similarity.shape[0] != similarity.shape[1]:
        raise ValueError(f"similarity must be a square (N, N) matrix, got "
                         f"{tuple(similarity.shape)}")
    targets = torch.arange(similarity.shape[0], device=similarity.device)  # (N,) the diagonal
    by_image = F.cross_entropy(similarity.float(), targets)
    by_caption = F.cross_entropy(similarity.float().T, targets)
    return (by_image + by_caption) / 2


class CLIP(nn.Module):
    """Both encoders and the learned logit scale ``t`` (``logit_scale``, stored as a log)."""

    #: CLIP caps the scale at 100 so that the logits cannot blow up
    MAX_LOGIT_SCALE = 100.0

    def __init__(self, config: CLIPConfig) -> None:
        super().__init__()
        self.config = config
        self.image_encoder = ImageEncoder(config)
        self.text_encoder = TextEncoder(config)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / config.temperature)))

    def encode_image(self, pixels: Tensor) -> Tensor:
        """(B, 3, H, W) -> unit vectors (B, E)."""
        return F.normalize(self.image_encoder(pixels).float(), dim=-1)

    def encode_text(self, input_ids: Tensor, lengths: Tensor) -> Tensor:
        """(B, L), (B,) -> unit vectors (B, E)."""
        return F.normalize(self.text_encoder(input_ids, lengths).float(), dim=-1)

    def scale(self) -> Tensor:
        return self.logit_scale.clamp(max=math.log(self.MAX_LOGIT_SCALE)).exp()

    def forward(self, pixels: Tensor, input_ids: Tensor, lengths: Tensor) -> Tensor:
        """The (B_images, B_captions) logits ``exp(t) * cos(image_i, caption_j)``."""
        images = self.encode_image(pixels)  # (B, E)
        texts = self.encode_text(input_ids, lengths)  # (B, E)
        return self.scale() * images @ texts.T  # (B, B)


# --- captions as token batches -------------------------------------------------------------


def caption_ids(tokenizer: BPETokenizer, text: str, max_len: int) -> list[int]:
    """A caption's ids, ``<|endoftext|>`` appended (the position the text encoder reads);
    too long a caption is an error naming it (cut short, it would lose its end)."""
    ids = tokenizer.encode(text, allowed_special=set()) + [tokenizer.token_to_id(END_OF_TEXT)]
    if len(ids) > max_len:
        raise ValueError(f"caption {text!r} is {len(ids)} tokens; CLIPConfig.max_text_len is "
                         f"{max_len}")
    return ids


def pad_ids(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Right-padded (B, L) ids and their (B,) lengths.

    >>> pad_ids([[5, 6, 7], [8]], pad_id=0)
    (tensor([[5, 6, 7],
            [8, 0, 0]]), tensor([3, 1]))
    """
    longest = max(len(r) for r in rows)
    ids = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return ids, torch.tensor([len(r) for r in rows])


class CaptionDataset(torch.utils.data.Dataset):
    """(picture, caption) pairs for ``training.loop.train``: item ``i`` is training scene ``i``
    (``scenes.training_scene``: a share ``recoloured`` of them in unnamed inks, a share
    ``reshaped`` in unnamed shapes), drawn on demand, captioned in English for even ``i`` and in
    Chinese for odd ``i``. ``collate`` makes a batch dict."""

    def __init__(self, tokenizer: BPETokenizer, size: int, *, seed: int,
                 recoloured: float = 0.0, reshaped: float = 0.0, max_text_len: int = 32) -> None:
        if size <= 0:
            raise ValueError(f"a caption dataset needs at least one picture, got size {size}")
        self.tokenizer, self.size, self.seed = tokenizer, size, seed
        self.recoloured, self.reshaped = check_shares(recoloured, reshaped)
        self.max_text_len = max_text_len
        self.pad_id = tokenizer.token_to_id(END_OF_TEXT)

    def __len__(self) -> int:
        return self.size

    def scene(self, i: int) -> Scene:
        return training_scene(self.seed, i, self.size, self.recoloured, self.reshaped)

    def __getitem__(self, i: int) -> dict:
        scene = self.scene(i)
        text = caption(scene, LANGUAGES[i % len(LANGUAGES)])
        return {"image": render(scene), "ids": caption_ids(self.tokenizer, text, self.max_text_len)}

    def collate(self, items: Sequence[dict]) -> dict:
        ids, lengths = pad_ids([it["ids"] for it in items], self.pad_id)
        return {"pixel_values": to_pixels(np.stack([it["image"] for it in items])),
                "input_ids": ids, "lengths": lengths}


def clip_batch_loss(model: nn.Module, batch: dict) -> tuple[Tensor, dict]:
    """``training.loop.train``'s ``loss_fn`` for CLIP: the loss, and what to log beside it: the
    logit scale and the in-batch accuracy (images whose own caption scored highest)."""
    similarity = model(batch["pixel_values"], batch["input_ids"], batch["lengths"])  # (B, B)
    targets = torch.arange(similarity.shape[0], device=similarity.device)
    accuracy = (similarity.argmax(dim=1) == targets).float().mean()
    return clip_loss(similarity), {"logit_scale": model.scale().detach(),
                                   "batch_accuracy": accuracy.detach()}


# --- zero-shot classification -------------------------------------------------------------

#: what ``zero_shot`` can classify: the (colour, shape) pair or one attribute
ZERO_SHOT_TARGETS = ("pair", "colour", "shape", "count", "size", "side")


def all_scenes() -> list[Scene]:
    """One scene per attribute combination (5 x 4 x 3 x 2 x 2 = 240; positions do not enter
    captions): the caption templates of zero-shot classification."""
    return [Scene(c, s, n, z, side, (), ()) for c in COLOURS for s in SHAPES for n in COUNTS
            for z in SIZES for side in SIDES]


def label(scene: Scene, target: str) -> object:
    """The class of ``scene`` for ``target``: its (colour, shape) pair, or one attribute."""
    if target not in ZERO_SHOT_TARGETS:
        raise ValueError(f"unknown zero-shot target {target!r}; targets: "
                         f"{', '.join(ZERO_SHOT_TARGETS)}")
    return scene.pair if target == "pair" else getattr(scene, target)


@torch.no_grad()
def caption_embeddings(clip: CLIP, tokenizer: BPETokenizer, language: str = "en") -> Tensor:
    """Unit text embeddings (240, E) of the captions of ``all_scenes()``."""
    device = next(clip.parameters()).device
    rows = [caption_ids(tokenizer, caption(s, language), clip.config.max_text_len)
            for s in all_scenes()]
    ids, lengths = pad_ids(rows, tokenizer.token_to_id(END_OF_TEXT))
    return clip.encode_text(ids.to(device), lengths.to(device))


def class_log_probs(logits: Tensor, members: Tensor) -> Tensor:
    """log P(class | picture) (N, K) from caption logits (N, S) and class membership (K, S):
    the softmax over all S captions, summed over each class's captions (a class is as likely
    as the captions that describe it; CLIP's prompt ensembling averages the class's caption
    *embeddings* instead, which here blurs the very attributes being asked about).

    >>> logits = torch.log(torch.tensor([[0.5, 0.2, 0.3]]))     # three captions
    >>> members = torch.tensor([[True, False, False], [False, True, True]])
    >>> class_log_probs(logits, members).exp()                 # class 1 holds captions 1, 2
    tensor([[0.5000, 0.5000]])
    """
    log_p = logits.float().log_softmax(dim=-1)  # (N, S)
    masked = log_p[:, None, :].masked_fill(~members[None], float("-inf"))  # (N, K, S)
    return masked.logsumexp(dim=-1)  # (N, K)


@torch.no_grad()
def encode_scenes(clip: CLIP, scenes: Sequence[Scene], batch_size: int = 256) -> Tensor:
    """Unit image embeddings (N, E) of the scenes' pictures."""
    device = next(clip.parameters()).device
    out = [clip.encode_image(to_pixels(np.stack([render(s) for s in scenes[k:k + batch_size]]))
                             .to(device)) for k in range(0, len(scenes), batch_size)]
    return torch.cat(out)


@torch.no_grad()
def zero_shot(clip: CLIP, tokenizer: BPETokenizer, scenes: Sequence[Scene], target: str = "pair",
              language: str = "en", images: Tensor | None = None) -> tuple[float, float]:
    """``(accuracy, chance)`` of classifying the scenes' pictures by ``class_log_probs`` over
    every caption template; chance is one over the number of classes. ``images``: their
    embeddings, when already computed (``encode_scenes``)."""
    was_training = clip.training
    clip.eval()
    templates = all_scenes()
    labels = list(dict.fromkeys(label(s, target) for s in templates))
    members = torch.tensor([[label(s, target) == lab for s in templates] for lab in labels])
    images = encode_scenes(clip, scenes) if images is None else images  # (N, E)
    texts = caption_embeddings(clip, tokenizer, language)  # (S, E)
    logits = clip.scale() * images @ texts.T  # (N, S)
    predicted = class_log_probs(logits, members.to(logits.device)).argmax(dim=1).tolist()
    clip.train(was_training)
    right = sum(labels[p] == label(s, target) for p, s in zip(predicted, scenes, strict=True))
    return right / len(scenes), 1 / len(labels)


# --- a CLIP folder -------------------------------------------------------------------------


def save_clip(clip: CLIP, directory: str | Path) -> Path:
    """``directory/clip_config.json`` + ``model.safetensors`` (each written atomically)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = json.dumps(asdict(clip.config), indent=2) + "\n"
    atomic_write_text(directory / CLIP_CONFIG_FILE, config)
    save_weights(clip, directory / WEIGHTS_FILE)
    return directory


def read_clip_config(path: str | Path) -> CLIPConfig:
    """A ``CLIPConfig`` from its json file; a missing file or a bad field names the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (is {path.parent} a CLIP or VLM folder?)")
    data = read_json(path)
    try:
        return CLIPConfig(**data)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None


def load_clip(directory: str | Path, device: str | torch.device = "cpu") -> CLIP:
    """The CLIP ``save_clip`` wrote (strict: the weights must fit the config)."""
    directory = Path(directory)
    clip = CLIP(read_clip_config(directory / CLIP_CONFIG_FILE))
    load_weights(clip, directory / WEIGHTS_FILE, device=device)
    return clip.to(device).eval()
