"""Supervised fine-tuning: a pretrained model learns to answer in ChatML (notebook 05).

SFT is pretraining's loop (``minimind_lib.train.train``) on other data: conversations
rendered with the chat template, labelled by ``minimind_lib.data.sft_example`` so that the
cross-entropy averages over the assistant's reply tokens ``S`` only,

    L_SFT = -(1 / |S|) * sum_{t in S} log p(x_t | x_<t),

(Ouyang et al. 2022, InstructGPT, section 3.5: "supervised fine-tuning"; MiniMind's
``SFTDataset`` masks the same way). The prompt still conditions every reply, it is just never
a target. ``answer_only=False`` trains on every token instead: the notebook's ablation.

The ``sft`` stage (``python -m minimind_lib sft --profile P``) fine-tunes the ``pretrain``
stage's model with ``profile.sft`` on ``dataset_files("sft")`` (MiniMind's
``sft_mini_512.jsonl`` when ``$MINIMIND_DATA_DIR`` is set), validating on the held-out
questions, and evaluates the model before and after (``minimind_lib.evaluate``) into
``eval.json``; ``python scripts/sft_ablation.py --profile P`` adds the all-tokens arm.

>>> from minimind_lib.data import sft_example
>>> from minimind_lib.tokenizer import load_tokenizer
>>> tok = load_tokenizer()
>>> ids, labels = sft_example(tok, [{"role": "user", "content": "3 + 5 = ?"},
...                                 {"role": "assistant", "content": "3 + 5 = 8"}], 64)
>>> print(tok.decode(ids))   # the whole rendered chat is the input
<|im_start|>system
You are a helpful assistant<|im_end|>
<|im_start|>user
3 + 5 = ?<|im_end|>
<|im_start|>assistant
3 + 5 = 8<|im_end|>
<BLANKLINE>
>>> tok.decode([t for t in labels if t != -100])   # the only targets
'3 + 5 = 8<|im_end|>'
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from torch import nn

from minimind_lib.checkpoint import atomic_write_text, load_model, save_model
from minimind_lib.data import SFTDataset, dataset_files, read_jsonl
from minimind_lib.evaluate import (
    TaskScores,
    answer_budget,
    eval_files,
    evaluate_sft,
    format_table,
    load_eval_records,
    perplexity,
    select_per_task,
    summarize,
)
from minimind_lib.profiles import Profile, StageSettings
from minimind_lib.tokenizer import BPETokenizer
from minimind_lib.train import METRICS_FILE, TrainConfig, init_distributed, train

if TYPE_CHECKING:
    from minimind_lib.pipeline import StageContext

EVAL_FILE = "eval.json"
TOKENIZER_FILE = "tokenizer.json"


def sft_records(files: Iterable[str | Path] | None = None) -> Iterable[dict]:
    """The SFT conversations of ``files`` (default: ``dataset_files("sft")``), validated."""
    paths = list(files) if files is not None else dataset_files("sft")
    return itertools.chain.from_iterable(read_jsonl(p, "sft") for p in paths)


def sft_dataset(tokenizer: BPETokenizer, settings: StageSettings, *,
                files: Iterable[str | Path] | None = None, answer_only: bool = True,
                progress: bool = True) -> SFTDataset:
    """Training set: the first ``settings.max_examples`` conversations, cut to ``seq_len``."""
    return SFTDataset(sft_records(files), tokenizer, settings.seq_len, answer_only=answer_only,
                      max_examples=settings.max_examples, progress=progress)


def validation_dataset(tokenizer: BPETokenizer, settings: StageSettings) -> SFTDataset:
    """The held-out questions with their reference replies, answer-only labels: the
    validation loss is the loss on replies the model never trained on."""
    return SFTDataset(load_eval_records(), tokenizer, settings.seq_len, progress=False)


@dataclass
class SFTRun:
    """What ``train_sft`` did: the metrics rows, examples trained on, examples skipped
    (no supervised token left after truncation)."""

    rows: list[dict]
    examples: int
    skipped: int


def train_sft(model: nn.Module, tokenizer: BPETokenizer, settings: StageSettings, *,
              seed: int, answer_only: bool = True, max_steps: int | None = None,
              files: Iterable[str | Path] | None = None, out_dir: str | Path | None = None,
              resume: bool = False, precision: str = "auto", device: str | None = None,
              progress: bool = True, callbacks: Iterable[Callable[[dict], None]] = ()) -> SFTRun:
    """Fine-tune ``model`` in place with ``settings`` (``max_steps`` overrides its steps).
    Validation loss is always answer-only, so both arms of the ablation are measured alike."""
    train_set = sft_dataset(tokenizer, settings, files=files, answer_only=answer_only,
                            progress=progress)
    config = TrainConfig.from_stage(settings, max_steps=max_steps or settings.max_steps,
                                    out_dir=out_dir, precision=precision, device=device,
                                    seed=seed, progress=progress)
    rows = train(model, train_set, config, eval_dataset=validation_dataset(tokenizer, settings),
                 collate_fn=train_set.collate, resume=resume, callbacks=list(callbacks))
    return SFTRun(rows, len(train_set), train_set.skipped)


# --- evaluation before / after ----------------------------------------------------------


@dataclass
class ModelEval:
    """One model's held-out scores: per-task question scores and text perplexity."""

    tasks: dict[str, TaskScores]
    perplexity: float

    def to_dict(self) -> dict:
        return {"perplexity": self.perplexity, "tasks": {k: asdict(v) for k, v in self.tasks.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> ModelEval:
        return cls({k: TaskScores(**v) for k, v in d["tasks"].items()}, d["perplexity"])


def evaluate_model(model: nn.Module, tokenizer: BPETokenizer, profile: Profile, *,
                   progress: bool = True) -> ModelEval:
    """``evaluate_sft`` on ``profile.eval_per_task`` questions per task, and perplexity of the
    held-out pretraining text (``data/eval/pretrain_eval.jsonl``) at the SFT ``seq_len``."""
    questions = select_per_task(load_eval_records(), profile.eval_per_task)
    tasks = evaluate_sft(model, tokenizer, questions, max_new_tokens=answer_budget(tokenizer, questions),
                         progress=progress)
    ppl = perplexity(model, tokenizer, eval_files("pretrain")[0], profile.sft.seq_len,
                     progress=progress)
    return ModelEval(tasks, ppl)


def read_eval(stage_dir: str | Path) -> dict[str, ModelEval]:
    """The ``eval.json`` of an ``sft`` stage folder: {"pretrain": ..., "sft": ...}."""
    path = Path(stage_dir) / EVAL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (run the sft stage first)")
    data = json.loads(path.read_text(encoding="utf-8"))
    return {name: ModelEval.from_dict(d) for name, d in data["models"].items()}


def eval_report(evals: dict[str, ModelEval]) -> str:
    """The question table (per task, per model) and a perplexity line, in markdown."""
    ppl = ", ".join(f"{name} {e.perplexity:.1f}" for name, e in evals.items())
    return (format_table({name: e.tasks for name, e in evals.items()})
            + f"\n\nheld-out text perplexity: {ppl}")


# --- the pipeline stage -----------------------------------------------------------------


def sft_stage(ctx: StageContext) -> dict:
    """The ``sft`` stage: ``ctx.dir("pretrain")`` → fine-tuned model in ``ctx.out_dir``
    (model.safetensors, config.json, metrics.jsonl, eval.json)."""
    profile, info = ctx.profile, init_distributed()
    tokenizer = BPETokenizer.from_file(ctx.dir("tokenizer") / TOKENIZER_FILE)
    model = load_model(ctx.dir("pretrain"))
    if model.config.vocab_size < len(tokenizer):
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the pretrained model's "
                         f"vocab_size is {model.config.vocab_size}")
    before = evaluate_model(model, tokenizer, profile, progress=ctx.progress) if info.is_main else None
    run = train_sft(model, tokenizer, profile.sft, seed=profile.seed, out_dir=ctx.out_dir,
                    resume=ctx.resume, precision=ctx.precision, device=ctx.device,
                    progress=ctx.progress, callbacks=ctx.callbacks)
    if not info.is_main:
        return {}
    model = model.cpu()
    save_model(model, ctx.out_dir)
    evals = {"pretrain": before, "sft": evaluate_model(model, tokenizer, profile,
                                                       progress=ctx.progress)}
    atomic_write_text(ctx.out_dir / EVAL_FILE, json.dumps(
        {"per_task": profile.eval_per_task,
         "models": {name: e.to_dict() for name, e in evals.items()}}, indent=2) + "\n")
    print(eval_report(evals))
    last = run.rows[-1] if run.rows else {}
    return {"steps": profile.sft.max_steps, "final_loss": last.get("loss"),
            "final_val_loss": last.get("val_loss"), "tokens": last.get("tokens"),
            "examples": run.examples, "skipped": run.skipped, "metrics": METRICS_FILE,
            "eval": EVAL_FILE,
            "exact_match": {name: summarize(e.tasks)["all"].exact_match for name, e in evals.items()},
            "perplexity": {name: e.perplexity for name, e in evals.items()}}
