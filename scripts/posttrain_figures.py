#!/usr/bin/env python
"""The cpu-profile post-training figures of docs/benchmarks.md, from finished stage folders.

    python -m minimind_lib dpo  --profile cpu --init data/reference/sft
    python -m minimind_lib grpo --profile cpu --init data/reference/sft
    python scripts/posttrain_figures.py runs/cpu            # -> docs/figures/posttrain_cpu.*

Reads ``<runs>/dpo`` and ``<runs>/grpo`` (``metrics.jsonl``, ``eval.json``, ``stage.json``) and
writes ``posttrain_cpu.png`` (DPO loss and reward accuracy; GRPO mean reward, held-out greedy
accuracy, KL and answer length per step) and ``posttrain_cpu.json`` (per-task held-out
exact-match and format rate before/after, stage times, the curves). It measures nothing
itself: every number comes from the stages' own records.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from minimind_lib import REPO_ROOT  # noqa: E402
from minimind_lib.course.plotting import read_metrics  # noqa: E402
from minimind_lib.course.stages import read_marker  # noqa: E402
from minimind_lib.evaluation.model_eval import read_eval  # noqa: E402
from minimind_lib.evaluation.questions import summarize


def stage_record(folder: Path, after: str) -> dict:
    """Per-task exact-match / format before and after, the stage's time and its summary."""
    evals = read_eval(folder)
    marker = read_marker(folder) or {}
    tables = {name: {**e.tasks, **summarize(e.tasks)} for name, e in evals.items()}
    return {"seconds": marker.get("seconds"), "summary": marker.get("summary"),
            "tasks": {task: {f"{m} {name}": getattr(tables[name][task], m)
                             for name in ("sft", after) for m in ("exact_match", "format_rate")}
                      for task in tables["sft"]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help="the runs folder, e.g. runs/cpu")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "figures")
    args = parser.parse_args()
    dpo, grpo = read_metrics(args.runs / "dpo"), read_metrics(args.runs / "grpo")
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.4))
    steps = [r["step"] for r in dpo]
    axes[0].plot(steps, [r["loss"] for r in dpo], lw=0.8, label="DPO + NLL loss")
    axes[0].plot(steps, [r["reward_accuracy"] for r in dpo], lw=0.8, label="reward accuracy")
    axes[0].set(xlabel="step", title="on-policy DPO (training batches)")
    axes[0].legend(fontsize=7)
    steps = [r["step"] for r in grpo]
    axes[1].plot(steps, [r["reward"] for r in grpo], lw=0.6, alpha=0.5, label="mean group reward")
    k = max(1, len(grpo) // 10)
    windows = [grpo[max(0, i - k + 1):i + 1] for i in range(len(grpo))]
    smooth = [sum(r["reward"] for r in w) / len(w) for w in windows]
    axes[1].plot(steps, smooth, lw=2, label=f"moving average ({k} steps)")
    val = [r for r in grpo if "val_accuracy" in r]
    axes[1].plot([r["step"] for r in val], [r["val_accuracy"] for r in val], "o-",
                 color="tab:green", label="held-out greedy accuracy")
    axes[1].set(xlabel="step", title="GRPO reward")
    axes[1].legend(fontsize=7)
    axes[2].plot(steps, [r["kl"] for r in grpo], color="tab:red")
    axes[2].set(xlabel="step", title="GRPO KL to the reference (k3 per token)")
    axes[3].plot(steps, [r["response_length"] for r in grpo], color="tab:purple")
    axes[3].set(xlabel="step", title="GRPO answer length (tokens)")
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out / "posttrain_cpu.png", dpi=110, bbox_inches="tight")
    record = {"dpo": stage_record(args.runs / "dpo", "dpo"),
              "grpo": stage_record(args.runs / "grpo", "grpo"),
              "grpo_curve": [{k: r[k] for k in ("step", "reward", "kl", "response_length",
                                                "val_accuracy") if k in r} for r in grpo]}
    (args.out / "posttrain_cpu.json").write_text(json.dumps(record, indent=1) + "\n")
    print("wrote", args.out / "posttrain_cpu.png", "and", args.out / "posttrain_cpu.json")


if __name__ == "__main__":
    main()
