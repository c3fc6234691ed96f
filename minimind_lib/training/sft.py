"""Supervised fine-tuning: a pretrained model learns to answer in ChatML (notebook 05).

SFT is pretraining's loop (``minimind_lib.training.loop.train``) on other data: conversations
rendered with the chat template, labelled by ``minimind_lib.data.conversations.sft_example`` so
that the cross-entropy averages over the assistant's reply tokens ``S`` only,

    L_SFT = -(1 / |S|) * sum_{t in S} log p(x_t | x_<t),

(Ouyang et al. 2022, InstructGPT, section 3.5: "supervised fine-tuning"; MiniMind's
``SFTDataset`` masks the same way). The prompt still conditions every reply, it is just never
a target. ``answer_only=False`` trains on every token instead: the notebook's ablation.

The ``sft`` stage (``minimind_lib.course.stages``; ``python -m minimind_lib sft --profile P``)
fine-tunes the ``pretrain`` stage's model with ``profile.sft`` on ``dataset_files("sft")``
(MiniMind's ``sft_mini_512.jsonl`` when ``$MINIMIND_DATA_DIR`` is set), validating on the
held-out questions, and evaluates the model before and after
(``evaluation.model_eval.evaluate_model``) into ``eval.json``; ``python scripts/sft_ablation.py
--profile P`` adds the all-tokens arm.

>>> from minimind_lib.data.conversations import sft_example
>>> from minimind_lib.model.decoder import IGNORE_INDEX
>>> from minimind_lib.tokenizer.bpe import load_tokenizer
>>> tokenizer = load_tokenizer()
>>> ids, labels = sft_example(tokenizer, [{"role": "user", "content": "3 + 5 = ?"},
...                                       {"role": "assistant", "content": "3 + 5 = 8"}], 64)
>>> print(tokenizer.decode(ids))   # the whole rendered chat is the input (MiniMind-3's format)
<|im_start|>user
3 + 5 = ?<|im_end|>
<|im_start|>assistant
<think>
<BLANKLINE>
</think>
<BLANKLINE>
3 + 5 = 8<|im_end|>
<BLANKLINE>
>>> tokenizer.decode([t for t in labels if t != IGNORE_INDEX])   # the only targets
'3 + 5 = 8<|im_end|>'
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from minimind_lib.data.conversations import SFTDataset
from minimind_lib.data.pretraining import PretrainDataset
from minimind_lib.data.readers import dataset_files, read_jsonl
from minimind_lib.evaluation.questions import load_eval_records
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.training.loop import train
from minimind_lib.training.settings import RunOptions, TrainConfig, TrainSettings


@dataclass(frozen=True)
class SFTSettings(TrainSettings):
    """The ``sft`` stage's hyper-parameters: a ``TrainSettings`` plus ``replay``, the share of
    the loss's tokens that are pretraining text (``ReplayMix``; 0: conversations only), which
    keeps the model modelling text while it learns to answer (catastrophic forgetting:
    notebook 05), and ``replay_window``, the tokens of one replayed window (0: ``seq_len``).

    Short windows cost less: ``collate`` pads a batch to its longest row, so one full-width
    window among short conversations makes the whole batch that wide.

    >>> SFTSettings(replay=1.0)
    Traceback (most recent call last):
    ...
    ValueError: SFTSettings.replay must be in [0, 1), got 1.0
    >>> SFTSettings(seq_len=256, replay_window=512)
    Traceback (most recent call last):
    ...
    ValueError: SFTSettings.replay_window must be in [2, seq_len=256] (0: seq_len), got 512
    """

    replay: float = 0.0
    replay_window: int = 0
    # sort each window of 32 steps' examples by length into steps (StepBatchSampler): a
    # 700-token tool conversation then pads only its own kind, not 15 short answers
    group_by_length: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        if not 0.0 <= self.replay < 1.0:
            raise ValueError(f"{name}.replay must be in [0, 1), got {self.replay}")
        if self.replay_window != 0 and not 2 <= self.replay_window <= self.seq_len:
            raise ValueError(f"{name}.replay_window must be in [2, seq_len={self.seq_len}] "
                             f"(0: seq_len), got {self.replay_window}")

    @property
    def window(self) -> int:
        """Tokens per replayed window of pretraining text."""
        return self.replay_window or self.seq_len


class ReplayMix(Dataset):
    """SFT examples followed by windows of pretraining text (loss on every token of a window),
    so many that text makes ``share`` of the supervised tokens: ``n = share / (1 - share) *
    sft.num_targets / window`` windows, drawn without repetition (seeded) while the text has
    enough. The loader shuffles the two kinds together; ``collate`` pads as SFT does.

    >>> import tempfile
    >>> from minimind_lib.tokenizer.bpe import load_tokenizer
    >>> p = Path(tempfile.mkdtemp()) / "train.bin"
    >>> np.arange(1000, dtype=np.uint16).tofile(p)
    >>> chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    >>> sft = SFTDataset([{"conversations": chat}] * 20, load_tokenizer(), 64, progress=False)
    >>> mix = ReplayMix(sft, PretrainDataset(p, seq_len=9), share=0.5, seed=0)
    >>> sft.num_targets, mix.windows, len(mix)   # 100 answer tokens, 10 windows of 10 tokens
    (100, 10, 30)
    >>> mix[25]["labels"].tolist() == mix[25]["input_ids"].tolist()
    True
    """

    def __init__(self, sft: SFTDataset, text: PretrainDataset, share: float, seed: int) -> None:
        if not 0.0 < share < 1.0:
            raise ValueError(f"replay share must be in (0, 1), got {share}")
        window = text.seq_len + 1
        self.sft, self.text = sft, text
        self.windows = max(1, round(share / (1 - share) * sft.num_targets / window))
        rng = np.random.default_rng(seed)
        picks = [rng.permutation(len(text)) for _ in range(-(-self.windows // len(text)))]
        self._picks = np.concatenate(picks)[:self.windows]  # (windows,) window indices

    def __len__(self) -> int:
        return len(self.sft) + self.windows

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if i < len(self.sft):
            return self.sft[i]
        ids = self.text[int(self._picks[i - len(self.sft)])]["input_ids"]  # (window,)
        return {"input_ids": ids, "labels": ids.clone()}

    @property
    def lengths(self) -> np.ndarray:
        """Tokens of every item, (len(self),): the conversations', then the windows'."""
        return np.concatenate([self.sft.lengths, np.full(self.windows, self.text.seq_len + 1)])

    def collate(self, batch: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return self.sft.collate(batch)


def sft_records(files: Iterable[str | Path] | None = None) -> Iterable[dict]:
    """The SFT conversations of ``files`` (default: ``dataset_files("sft")``), validated."""
    paths = list(files) if files is not None else dataset_files("sft")
    return itertools.chain.from_iterable(read_jsonl(p, "sft") for p in paths)


def sft_dataset(tokenizer: BPETokenizer, settings: TrainSettings, *,
                files: Iterable[str | Path] | None = None, answer_only: bool = True,
                progress: bool = True) -> SFTDataset:
    """Training set: the first ``settings.max_examples`` conversations, cut to ``seq_len``."""
    return SFTDataset(sft_records(files), tokenizer, settings.seq_len, answer_only=answer_only,
                      max_examples=settings.max_examples, progress=progress)


def validation_dataset(tokenizer: BPETokenizer, settings: TrainSettings) -> SFTDataset:
    """The held-out questions with their reference replies, answer-only labels: the
    validation loss is the loss on replies the model never trained on."""
    return SFTDataset(load_eval_records(), tokenizer, settings.seq_len, progress=False)


@dataclass
class SFTRun:
    """What ``train_sft`` did: the metrics rows, examples trained on, examples skipped
    (no supervised token left after truncation), records the chat template cannot express
    (MiniMind's tool-use and thinking records under MiniMind2's template)."""

    rows: list[dict]
    examples: int
    skipped: int
    unrenderable: int = 0


def train_sft(model: nn.Module, tokenizer: BPETokenizer, settings: TrainSettings, *,
              seed: int, answer_only: bool = True, files: Iterable[str | Path] | None = None,
              options: RunOptions | None = None, out_dir: str | Path | None = None,
              resume: bool = False, precision: str = "auto", device: str | None = None,
              progress: bool = True, callbacks: Iterable[Callable[[dict], None]] = (),
              replay_text: PretrainDataset | None = None) -> SFTRun:
    """Fine-tune ``model`` in place with ``settings`` (e.g. ``replace(settings, max_steps=50)``
    for a shorter run) on ``files`` (default: ``dataset_files("sft")``). Validation loss is
    always answer-only, so both arms of the ablation are measured alike. With
    ``settings.replay`` > 0, windows of ``replay_text`` (pretraining text) join the
    conversations (``ReplayMix``)."""
    train_set = sft_dataset(tokenizer, settings, files=files, answer_only=answer_only,
                            progress=progress)
    conversations = train_set
    if getattr(settings, "replay", 0.0) > 0:
        if replay_text is None:
            raise ValueError("settings.replay > 0 needs replay_text (pretraining windows)")
        train_set = ReplayMix(train_set, replay_text, settings.replay, seed)
        print(f"sft: {train_set.windows:,} windows of {replay_text.seq_len + 1} tokens of "
              "pretraining text replayed beside "
              f"{len(conversations):,} conversations (share {settings.replay:.0%} of the "
              "supervised tokens)")
    if conversations.unrenderable:
        print(f"sft: {conversations.unrenderable:,} record(s) with tools or thinking skipped: "
              "MiniMind2's chat template, the course model's, cannot express them")
    config = TrainConfig.from_stage(settings, options, out_dir=out_dir, precision=precision,
                                    device=device, seed=seed, progress=progress,
                                    group_by_length=getattr(settings, "group_by_length", False))
    rows = train(model, train_set, config, eval_dataset=validation_dataset(tokenizer, settings),
                 collate_fn=train_set.collate, resume=resume, callbacks=list(callbacks))
    return SFTRun(rows, len(conversations), conversations.skipped, conversations.unrenderable)
