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
>>> print(tokenizer.decode(ids))   # the whole rendered chat is the input
<|im_start|>system
You are a helpful assistant<|im_end|>
<|im_start|>user
3 + 5 = ?<|im_end|>
<|im_start|>assistant
3 + 5 = 8<|im_end|>
<BLANKLINE>
>>> tokenizer.decode([t for t in labels if t != IGNORE_INDEX])   # the only targets
'3 + 5 = 8<|im_end|>'
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from minimind_lib.data.conversations import SFTDataset
from minimind_lib.data.readers import dataset_files, read_jsonl
from minimind_lib.evaluation.questions import load_eval_records
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.training.loop import train
from minimind_lib.training.settings import RunOptions, TrainConfig, TrainSettings


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
              progress: bool = True, callbacks: Iterable[Callable[[dict], None]] = ()) -> SFTRun:
    """Fine-tune ``model`` in place with ``settings`` (e.g. ``replace(settings, max_steps=50)``
    for a shorter run) on ``files`` (default: ``dataset_files("sft")``). Validation loss is
    always answer-only, so both arms of the ablation are measured alike."""
    train_set = sft_dataset(tokenizer, settings, files=files, answer_only=answer_only,
                            progress=progress)
    if train_set.unrenderable:
        print(f"sft: {train_set.unrenderable:,} record(s) with tools or thinking skipped: "
              "MiniMind2's chat template, the course model's, cannot express them")
    config = TrainConfig.from_stage(settings, options, out_dir=out_dir, precision=precision,
                                    device=device, seed=seed, progress=progress)
    rows = train(model, train_set, config, eval_dataset=validation_dataset(tokenizer, settings),
                 collate_fn=train_set.collate, resume=resume, callbacks=list(callbacks))
    return SFTRun(rows, len(train_set), train_set.skipped, train_set.unrenderable)
