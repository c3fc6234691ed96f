"""One model's held-out scores as a stage writes them (``eval.json``): ``ModelEval`` (the
question scores, perplexity and bits per byte), ``evaluate_model``, ``read_eval`` and the
table the report prints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from torch import nn

from minimind_lib.core.checked_files import FileProblem, read_json
from minimind_lib.core.filenames import EVAL_FILE
from minimind_lib.evaluation.multiple_choice import MC_FORMATS, held_out_mc
from minimind_lib.evaluation.perplexity import bits_per_byte, perplexity
from minimind_lib.evaluation.questions import (
    TaskScores,
    answer_budget,
    eval_files,
    evaluate_sft,
    load_eval_records,
    question_table,
    select_per_task,
)
from minimind_lib.evaluation.tool_use import evaluate_tools, tool_table
from minimind_lib.tokenizer.bpe import BPETokenizer

# --- one model's held-out record (what the stages write to eval.json) ----------------------


@dataclass
class ModelEval:
    """One model's held-out scores: per-task question scores, text perplexity and bits per
    byte (None in an ``eval.json`` written before it was measured)."""

    tasks: dict[str, TaskScores]
    perplexity: float
    bits_per_byte: float | None = None
    tools: dict[str, dict[str, float]] | None = None  # tool_use.evaluate_tools (sft stage)
    #: format ("plain" / "chat") -> task, "family:<name>" or "all" -> MCScores as a dict
    multiple_choice: dict[str, dict[str, dict]] | None = None

    def to_dict(self) -> dict:
        out = {"perplexity": self.perplexity, "bits_per_byte": self.bits_per_byte,
               "tasks": {k: asdict(v) for k, v in self.tasks.items()}}
        extra = {"tools": self.tools, "multiple_choice": self.multiple_choice}
        return out | {k: v for k, v in extra.items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict) -> ModelEval:
        return cls({k: TaskScores(**v) for k, v in d["tasks"].items()}, d["perplexity"],
                   d.get("bits_per_byte"), d.get("tools"), d.get("multiple_choice"))


def evaluate_model(model: nn.Module, tokenizer: BPETokenizer, *, per_task: int | None,
                   seq_len: int, progress: bool = True, tools: bool = False,
                   constrain: Callable | None = None) -> ModelEval:
    """``evaluate_sft`` on the first ``per_task`` held-out questions of every task, and the
    perplexity of the held-out pretraining text (``data/eval/pretrain_eval.jsonl``) in windows
    of ``seq_len`` tokens and its bits per byte (each text cut to ``seq_len`` tokens): the
    before/after record of the sft, dpo (and later) stages. The same questions as multiple
    choice, in both formats (``multiple_choice.held_out_mc``). With ``tools``, also the
    held-out tool and thinking questions (``tool_use.evaluate_tools``; with ``constrain``, its
    "(grammar)" columns too)."""
    records = load_eval_records()
    questions = select_per_task(records, per_task)
    tasks = evaluate_sft(model, tokenizer, questions,
                         max_new_tokens=answer_budget(tokenizer, questions), progress=progress)
    held_out = eval_files("pretrain")[0]
    ppl = perplexity(model, tokenizer, held_out, seq_len, progress=progress)
    bpb = bits_per_byte(model, tokenizer, held_out, context=seq_len, progress=progress)
    scores = evaluate_tools(model, tokenizer, per_task, progress, constrain) if tools else None
    mc = {fmt: {k: asdict(v) for k, v in held_out_mc(model, tokenizer, questions, pool=records,
                                                      fmt=fmt).items()} for fmt in MC_FORMATS}
    return ModelEval(tasks, ppl, bpb, scores, mc)


def read_eval(stage_dir: str | Path) -> dict[str, ModelEval]:
    """The models' held-out records in a stage folder's ``eval.json``, by name (the sft stage:
    {"pretrain": ..., "sft": ...}; dpo: {"sft": ..., "dpo": ...}; quantize: one per format)."""
    path = Path(stage_dir) / EVAL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (has the stage run?)")
    data = read_json(path)
    try:
        return {name: ModelEval.from_dict(d) for name, d in data["models"].items()}
    except (KeyError, TypeError, AttributeError) as e:
        raise FileProblem(f"{path}: not a stage's eval.json ({type(e).__name__}: {e})") from None


def eval_report(evals: Mapping[str, ModelEval]) -> str:
    """The question table (per task, per model), then perplexity and bits per byte, in markdown.

    With two models (before and after a stage) the line says how many times the perplexity
    grew or shrank: the forgetting a fine-tuning stage costs the language model.

    >>> tasks = {"t": TaskScores("t", "skill", 1, 1.0, 1.0, 1.0)}
    >>> print(eval_report({"sft": ModelEval(tasks, 12.345, 1.2345)}).splitlines()[-1])
    held-out text perplexity: sft 12.3; bits per byte: sft 1.234
    >>> print(eval_report({"pre": ModelEval(tasks, 100.0, 2.4),
    ...                    "sft": ModelEval(tasks, 250.0, 2.9)}).splitlines()[-1])
    held-out text perplexity: pre 100.0 -> sft 250.0 (2.50x); bits per byte: pre 2.400 -> sft 2.900
    """
    arrow = " -> " if len(evals) == 2 else ", "
    ppl = arrow.join(f"{name} {e.perplexity:.1f}" for name, e in evals.items())
    line = f"held-out text perplexity: {ppl}"
    if len(evals) == 2:
        before, after = (e.perplexity for e in evals.values())
        line += f" ({after / before:.2f}x)"
    if all(e.bits_per_byte is not None for e in evals.values()):
        line += "; bits per byte: " + arrow.join(f"{name} {e.bits_per_byte:.3f}"
                                                 for name, e in evals.items())
    tables = [f"tool use and thinking, {name} (held-out, data/eval/tools_eval.jsonl):\n\n"
              + tool_table(e.tools) for name, e in evals.items() if e.tools]
    mc = {name: e.multiple_choice for name, e in evals.items() if e.multiple_choice}
    return "\n\n".join([question_table({name: e.tasks for name, e in evals.items()}), line,
                        *([mc_table(mc)] if mc else []), *tables])


def mc_table(scores: Mapping[str, Mapping[str, Mapping[str, dict]]]) -> str:
    """The held-out questions as multiple choice: ``acc / acc_norm`` (%) per family and
    format, one column per model (``scores``: model -> ``ModelEval.multiple_choice``).

    >>> one = {"n": 8, "acc": 0.5, "acc_norm": 0.625, "chance": 0.25}
    >>> print(mc_table({"sft": {"plain": {"all": one}}}).splitlines()[-1])
    | all | plain | 25.0 | 50.0 / 62.5 |
    """
    first = next(iter(scores.values()))
    groups = [g for g in next(iter(first.values())) if g.startswith("family:")] + ["all"]
    head = "| questions | format | chance % | " + " | ".join(
        f"{name} acc / acc_norm %" for name in scores) + " |"
    lines = ["multiple choice (the held-out questions, 4 choices each: the reference and 3 "
             "answers of other questions of its task; `plain`: `Question: ...\\nAnswer: `, "
             "`chat`: the chat template):", "", head, "|" + "---|" * (3 + len(scores))]
    for group in groups:
        for fmt in first:
            cells = [f"{100 * s[fmt][group]['acc']:.1f} / {100 * s[fmt][group]['acc_norm']:.1f}"
                     for s in scores.values()]
            chance = 100 * first[fmt][group]["chance"]
            lines.append(f"| {group.removeprefix('family:')} | {fmt} | {chance:.1f} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines)
