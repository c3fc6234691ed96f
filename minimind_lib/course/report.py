"""The run report of ``python -m minimind_lib all``: ``<root>/report.md`` with the loss curves
(PNG files in ``<root>/figures/``) and the evaluation tables every stage wrote.

It only reads what the stages left in their folders (``stage.json``, ``metrics.jsonl``,
``eval.json``, ``formats.md``), so it can be rebuilt at any time::

    python -c "from minimind_lib.course.report import write_report; write_report('runs/cpu')"

A stage that has not run yet gets a line saying so.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from minimind_lib.core.atomic import atomic_write_text
from minimind_lib.core.checked_files import read_json
from minimind_lib.core.filenames import (
    EVAL_FILE,
    FIGURES_DIR,
    FORMATS_FILE,
    METRICS_FILE,
    REPORT_FILE,
)
from minimind_lib.course.plotting import plot_metrics, read_metrics
from minimind_lib.course.stages import STAGES, Stage, read_marker
from minimind_lib.course.stages_agent import solved_table
from minimind_lib.evaluation.model_eval import eval_report, read_eval
from minimind_lib.evaluation.preferences import PreferenceScores, preference_table
from minimind_lib.evaluation.questions import question_table
from minimind_lib.training.on_policy import PairCounts, pair_table


def _figure(root: Path, stage: Stage) -> str | None:
    """Plot ``stage``'s metrics (loss, lr and its ``curves``) to ``figures/<stage>_loss.png``;
    its path relative to root."""
    path = root / stage.name / METRICS_FILE
    if not path.is_file():
        return None
    rows = read_metrics(path)
    extra = [k for k in stage.curves or () if any(k in r for r in rows)]
    fig = plot_metrics(rows, title=f"{stage.name} ({len(rows)} steps)", extra=extra)
    out = root / FIGURES_DIR / f"{stage.name}_loss.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out.relative_to(root).as_posix()


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _summary(summary: dict) -> str:
    """The headline numbers of a stage's ``stage.json`` summary."""
    if "size_bytes" in summary:  # the quantize stage
        size, ppl = summary["size_bytes"], summary["perplexity"]
        return (f"int8 {size['int8 (ours)'] / size['fp32']:.2f}x the fp32 bytes; perplexity "
                f"fp32 {ppl['fp32']:.4g}, int8 {ppl['int8 (ours)']:.4g}")
    keys = ("steps", "tokens", "final_loss", "final_val_loss", "final_offline_val_loss")
    parts = [f"{k} {_fmt(summary[k])}" for k in keys if summary.get(k) is not None]
    for k, v in (summary.get("preference_accuracy") or {}).items():
        parts.append(f"{k} acc. {v:.1%}")
    return ", ".join(parts)


def _stage_table(root: Path) -> tuple[str, float]:
    lines = ["| stage | status | seconds | summary |", "|---|---|---:|---|"]
    total = 0.0
    for stage in STAGES.values():
        marker = read_marker(root / stage.name)
        if marker is None:
            if stage.in_all:  # an optional stage (not part of `all`) is listed once it ran
                lines.append(f"| {stage.name} | not run | | |")
            continue
        total += marker["seconds"]
        lines.append(f"| {stage.name} | done | {marker['seconds']:.0f} | "
                     f"{_summary(marker['summary'])} |")
    return "\n".join(lines), total


def _dpo_tables(root: Path) -> list[str]:
    """The DPO stage's on-policy pair counts (when it sampled its pairs) and held-out
    preference accuracy, as report lines."""
    saved = read_json(root / "dpo" / EVAL_FILE)
    out = []
    if saved.get("pair_counts"):
        counts = {task: PairCounts(**c) for task, c in saved["pair_counts"].items()}
        out += ["On-policy pairs (the SFT model's greedy answer and samples, graded by "
                "exact-match):", "", pair_table(counts), ""]
    if saved.get("preference"):
        results = {name.upper(): {task: PreferenceScores(**v) for task, v in res.items()}
                   for name, res in saved["preference"].items()}
        out += ["Held-out preference accuracy:", "", preference_table(results), ""]
    return out


def _agent_tables(root: Path) -> list[str]:
    """The agent stage's held-out tool tasks: greedy episodes' exact final answer, per kind."""
    saved = read_json(root / "agent" / EVAL_FILE)
    if "agent_solved" not in saved:
        return []
    return ["Held-out tool tasks (`data/eval/tools_eval.jsonl`), one greedy episode each: the "
            "share whose final answer is exactly right:", "",
            solved_table(saved["agent_solved"], saved["agent_n"]), ""]


def _training_section(root: Path, stage: Stage) -> list[str]:
    """A training stage's loss curve, then (when it evaluates) its held-out tables."""
    figure = _figure(root, stage)
    out = ([f"![{stage.name} loss]({figure})", ""] if figure
           else [f"(no {stage.name} metrics yet)", ""])
    if figure and stage.training:
        out += [f"Training curve: {stage.training}.", ""]
    if figure and stage.validation:
        out += [f"Validation curve: {stage.validation}.", ""]
    if stage.evaluates and (root / stage.name / EVAL_FILE).is_file():
        out += _EXTRA_TABLES.get(stage.name, lambda _: [])(root)
        out += ["Held-out questions (greedy, through the chat template), text perplexity and "
                "bits per byte:", "", eval_report(read_eval(root / stage.name)), ""]
    return out


def _quantize_section(root: Path, stage: Stage) -> list[str]:
    """The format table of the quantize stage and its held-out questions per format."""
    table = root / stage.name / FORMATS_FILE
    if not table.is_file():
        return [f"(the {stage.name} stage has not run yet)", ""]
    source = read_marker(root / stage.name)["summary"]["source"]
    evals = read_eval(root / stage.name)
    return [f"The `{source}` model in each format, measured on this machine (speed: batch 1, "
            "greedy, 16 new tokens, median of 3 rounds):", "",
            table.read_text(encoding="utf-8").strip(), "", "Held-out questions per format:", "",
            question_table({k: e.tasks for k, e in evals.items()},
                           metrics=("exact_match", "format_rate")), ""]


def _lora_section(root: Path, stage: Stage) -> list[str]:
    """The lora stage's adapter, loss curve and held-out questions before and after."""
    summary = read_marker(root / "lora")["summary"]
    figure = _figure(root, stage)
    lines = [f"Rank {summary['rank']} adapters on {', '.join(summary['target_modules'])}: "
             f"{summary['trainable_parameters']:,} trainable of {summary['total_parameters']:,} "
             f"parameters ({summary['trainable_parameters'] / summary['total_parameters']:.2%}).",
             "", f"![lora loss]({figure})" if figure else "(no lora metrics)", "",
             f"Validation curve: {stage.validation}.", ""]
    if (root / "lora" / EVAL_FILE).is_file():
        lines += ["Held-out questions of the new task (family `domain`) and of the SFT tasks:",
                  "", eval_report(read_eval(root / "lora"))]
    return lines + [""]


#: Stages whose report section is not a training curve plus held-out tables
_SECTIONS = {"quantize": _quantize_section, "lora": _lora_section}
#: Tables a stage's section shows before its held-out questions
_EXTRA_TABLES = {"dpo": _dpo_tables, "agent": _agent_tables}


def write_report(root: str | os.PathLike, profile_name: str | None = None,
                 wall_seconds: float | None = None) -> Path:
    """Write ``<root>/report.md`` (and the figures) from the stage folders under ``root``."""
    root = Path(root)
    stages, stage_seconds = _stage_table(root)
    markers = [m for st in STAGES if (m := read_marker(root / st)) is not None]
    recorded = (markers[0].get("fingerprint") or {}).get("profile") if markers else None
    name = profile_name or recorded or root.name
    out = [f"# MiniMind run report: profile `{name}`", "",
           f"Written {time.strftime('%Y-%m-%d %H:%M')} on {platform.node() or 'this machine'} "
           f"({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
           f"{torch.__version__}, CUDA {'yes' if torch.cuda.is_available() else 'no'}).", "",
           "## Stages", "", stages, "",
           f"Stage time, summed: {stage_seconds / 60:.1f} min"
           + (f"; this command's wall time: {wall_seconds / 60:.1f} min (finished stages are "
              "reused, not rerun)." if wall_seconds is not None else "."), ""]

    for stage in STAGES.values():  # registry order; an optional stage once it ran
        if stage.title and (stage.in_all or read_marker(root / stage.name) is not None):
            section = _SECTIONS.get(stage.name, _training_section)
            out += [f"## {stage.title}", "", *section(root, stage)]

    path = root / REPORT_FILE
    atomic_write_text(path, "\n".join(out))
    return path
