"""How the stages score their models (notebooks 05-10): the held-out record of one model in a
profile (``profile_eval``), the one reader of a stored record (``stored_eval``: a stage reuses
its starting model's instead of measuring it again), and the stage's ``eval.json``.

A stage folder's ``eval.json`` holds ``{"per_task": N, ..., "models": {name: ModelEval}}``: the
models the stage compares (its start and its result) under their stage names.
"""

from __future__ import annotations

import json
from pathlib import Path

from torch import nn

from minimind_lib.core.atomic import atomic_write_text
from minimind_lib.core.checked_files import read_json
from minimind_lib.core.filenames import EVAL_FILE, METRICS_FILE
from minimind_lib.course.profiles import Profile
from minimind_lib.course.stage_registry import StageContext, read_marker
from minimind_lib.data.hanzi_codes import task_records
from minimind_lib.evaluation.model_eval import ModelEval, evaluate_model
from minimind_lib.evaluation.questions import evaluate_sft, summarize
from minimind_lib.inference.structured.grammar import tool_grammar
from minimind_lib.tokenizer.bpe import BPETokenizer


def profile_eval(model: nn.Module, tokenizer: BPETokenizer, profile: Profile,
                 progress: bool = True, tools: bool = False) -> ModelEval:
    """``model``'s held-out record as every stage of ``profile`` measures it: ``eval_per_task``
    questions a task, perplexity and bits per byte in windows of the pretraining length; with
    ``tools`` (the sft stage's result) the tool and thinking questions too, free and under the
    tools' grammar (``inference.structured.tool_grammar``)."""
    return evaluate_model(model, tokenizer, per_task=profile.eval_per_task,
                          seq_len=profile.pretrain.seq_len, progress=progress, tools=tools,
                          constrain=tool_grammar(tokenizer) if tools else None)


def domain_eval(model: nn.Module, tokenizer: BPETokenizer, profile: Profile,
                measured: ModelEval | None = None, progress: bool = True) -> ModelEval:
    """``profile_eval`` (or ``measured``, when known) plus the held-out questions of the LoRA
    stage's new task family (``hanzi_codes.task_records("eval")``)."""
    base = measured or profile_eval(model, tokenizer, profile, progress)
    domain = evaluate_sft(model, tokenizer, task_records("eval", profile.eval_per_task),
                          progress=progress)
    return ModelEval({**base.tasks, **domain}, base.perplexity, base.bits_per_byte)


def stored_eval(model_dir: str | Path, per_task: int,
                stage: str | None = None) -> ModelEval | None:
    """The held-out record a model folder carries of itself, when its ``eval.json`` scored
    ``per_task`` questions a task: the entry of ``stage`` (a stage folder's own stage, from its
    ``stage.json``; e.g. ``sft`` in ``runs/cpu/sft``), or with ``stage`` None the only entry
    (``data/reference/sft``). Otherwise None: measure it.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> record = '{"per_task": 5, "models": {"sft": {"tasks": {}, "perplexity": 9.5}}}'
    >>> _ = (d / "eval.json").write_text(record)
    >>> stored_eval(d, 5).perplexity, stored_eval(d, 20)
    (9.5, None)
    """
    path = Path(model_dir) / EVAL_FILE
    if not path.is_file():
        return None
    stored = read_json(path)
    models = stored.get("models", {})
    name = stage
    if name is None and len(models) == 1:
        name = next(iter(models))
    if stored.get("per_task") != per_task or name not in models:
        return None
    return ModelEval.from_dict(models[name])


def write_eval(out_dir: Path, per_task: int, evals: dict[str, ModelEval],
               **extra: object) -> None:
    """A stage's ``eval.json``: ``per_task``, ``extra`` fields, then each model's record."""
    atomic_write_text(out_dir / EVAL_FILE, json.dumps(
        {"per_task": per_task, **extra,
         "models": {name: e.to_dict() for name, e in evals.items()}}, indent=2) + "\n")


def stored_start_eval(ctx: StageContext) -> ModelEval | None:
    """The starting model's own held-out record (``stored_eval``: the entry of the stage its
    ``stage.json`` names), when it scored the same questions; else None."""
    start = ctx.start_dir()
    return stored_eval(start, ctx.profile.eval_per_task, (read_marker(start) or {}).get("stage"))


def start_eval(ctx: StageContext, model: nn.Module, tokenizer: BPETokenizer) -> ModelEval:
    """The starting model's held-out record: the stored one, else measured now."""
    return stored_start_eval(ctx) or profile_eval(model, tokenizer, ctx.profile, ctx.progress)


def training_summary(rows: list[dict]) -> dict:
    """The headline of a training stage's ``stage.json`` summary: its last metrics row."""
    last = rows[-1] if rows else {}
    return {"steps": last.get("step"), "final_loss": last.get("loss"),
            "final_val_loss": last.get("val_loss"), "tokens": last.get("tokens"),
            "metrics": METRICS_FILE}


def rl_summary(rows: list[dict], evals: dict[str, ModelEval]) -> dict:
    """An RL stage's ``stage.json`` summary (grpo, ppo, agent): ``training_summary``, the mean
    reward of the first and the last fifth of the steps, and each model's held-out exact match
    (all tasks, and the skill family's when scored).

    >>> rl_summary([{"step": 1, "reward": 0.0}, {"step": 2, "reward": 1.0}], {})["reward"]
    {'first_fifth': 0.0, 'last_fifth': 1.0}
    """
    fifth = max(1, len(rows) // 5)
    pooled = {n: summarize(e.tasks) for n, e in evals.items()}
    return {**training_summary(rows), "eval": EVAL_FILE,
            "reward": {"first_fifth": sum(r["reward"] for r in rows[:fifth]) / fifth,
                       "last_fifth": sum(r["reward"] for r in rows[-fifth:]) / fifth},
            "exact_match": {n: p["all"].exact_match for n, p in pooled.items()},
            "skill_exact_match": {n: p["skill"].exact_match for n, p in pooled.items()
                                  if "skill" in p}}
