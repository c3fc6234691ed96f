"""The vision stage's recipe (notebook 13): ``VisionSettings`` (the CLIP's and the VLM's
training, nested like every other stage's settings), training the CLIP and then the VLM on it,
and scoring both on held-out pictures (zero-shot accuracy, VQA exact match).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.training.loop import train
from minimind_lib.training.settings import RunOptions, TrainConfig, TrainSettings, require_positive
from minimind_lib.vision.clip import (
    CLIP,
    ZERO_SHOT_TARGETS,
    CaptionDataset,
    CLIPConfig,
    clip_batch_loss,
    encode_scenes,
    zero_shot,
)
from minimind_lib.vision.scenes import (
    HELD_OUT_PAIRS,
    LANGUAGES,
    QUESTION_KINDS,
    check_shares,
    make_scene,
)
from minimind_lib.vision.vlm import Projector, VisionLanguageModel
from minimind_lib.vision.vqa import (
    VQADataset,
    VQAScore,
    answer_questions,
    score_vqa,
    vqa_loss,
    vqa_records,
)

# --- the settings -------------------------------------------------------------------------


def vision_training(batch_size: int, learning_rate: float, steps: int, *, seq_len: int,
                    warmup_steps: int = 20) -> TrainSettings:
    """One of the vision stage's two trainings: ``steps`` of ``batch_size`` pictures (or
    questions), saved once at the end, warming up over ``warmup_steps`` (at most all but one).
    ``seq_len`` bounds a caption (CLIP) or a prompt with its picture tokens (VLM).

    >>> vision_training(64, 2e-3, 5, seq_len=32).warmup_steps
    4
    """
    return TrainSettings(batch_size=batch_size, seq_len=seq_len, learning_rate=learning_rate,
                         max_steps=steps, warmup_steps=min(warmup_steps, steps - 1),
                         eval_every=steps, save_every=steps)


@dataclass(frozen=True)
class VisionSettings:
    """The ``vision`` stage's hyper-parameters (``profile.vision``): the synthetic data, the
    tiny CLIP's size (``clip``) and training (``clip_training``), the VLM's training
    (``vlm_training``), each nested like every other stage's settings:
    ``--set vision.clip.embed_dim=..``, ``--set vision.vlm_training.max_steps=..``.

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
    # its training: batches of captioned pictures (seq_len: the longest caption)
    clip_training: TrainSettings = field(
        default_factory=lambda: vision_training(64, 2e-3, 300, seq_len=32))
    # the VLM
    merge: int = 2  # the projector merges merge x merge patches into one LM token
    train_lm: bool = True  # False: train the projector only (MiniMind-V's pretraining stage)
    # its training: batches of questions about pictures (seq_len: picture tokens + prompt)
    vlm_training: TrainSettings = field(
        default_factory=lambda: vision_training(16, 1e-3, 300, seq_len=64))

    def __post_init__(self) -> None:
        require_positive(self, "train_images", "eval_images", "merge")
        check_shares(self.recoloured, self.reshaped)
        if self.train_images < self.clip_training.batch_size:
            raise ValueError(f"VisionSettings.train_images ({self.train_images}) must be at least "
                             f"clip_training.batch_size ({self.clip_training.batch_size}): one "
                             "batch of pictures")
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



def with_vlm_steps(settings: VisionSettings, steps: int) -> VisionSettings:
    """``settings`` with a VLM training of ``steps`` steps, the rest of it unchanged (its
    warmup capped to ``steps - 1``, saved at the end), as the scripts' step sweeps need."""
    vlm = settings.vlm_training
    return replace(settings, vlm_training=vision_training(
        vlm.batch_size, vlm.learning_rate, steps, seq_len=vlm.seq_len,
        warmup_steps=vlm.warmup_steps))


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
    config = TrainConfig.from_stage(settings.clip_training, options, out_dir=out_dir,
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
    config = TrainConfig.from_stage(settings.vlm_training, options, out_dir=out_dir,
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
