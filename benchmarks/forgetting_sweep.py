#!/usr/bin/env python
"""How much do SFT and DPO make the model forget text, and what keeps it? (issue 29, part 2)

Runs one stage of a profile (default ``cpu``; ``sft`` or ``dpo``) several times from the same
starting model, each variant with its own ``--set`` overrides and its own output folder, two at
a time on one thread each (so their wall times compare), then prints one table from what each
run wrote: held-out text perplexity and bits per byte before -> after, skill and knowledge
exact match, format rate (all tasks, and the lowest task's), wall time; for DPO also the first
and last validation losses. A finished variant is reused (the pipeline's fingerprints), so the
table can be printed again at no cost::

    python -m minimind_lib pretrain --profile cpu        # once: the shared starting model
    python benchmarks/forgetting_sweep.py                # every SFT variant, then the table
    python benchmarks/forgetting_sweep.py --only baseline replay_0.25 --jobs 1
    python benchmarks/forgetting_sweep.py --stage dpo --init runs/forgetting/cpu/replay_0.5/sft
    python benchmarks/forgetting_sweep.py --stage dpo --init data/reference/sft   # any model folder

SFT variants start from ``runs/<profile>/pretrain`` and write ``runs/forgetting/<profile>/<name>``;
DPO variants start from ``--init`` (an SFT stage folder) and write
``runs/forgetting/<profile>/dpo-from-<init's variant>/<name>``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from minimind_lib import REPO_ROOT
from minimind_lib.core.atomic import read_json_lines
from minimind_lib.core.filenames import WEIGHTS_FILE
from minimind_lib.course.pipeline import is_complete
from minimind_lib.course.profiles import get_profile, override, parse_set
from minimind_lib.course.stages import read_marker
from minimind_lib.evaluation.model_eval import read_eval
from minimind_lib.evaluation.questions import summarize

#: stage -> variant name -> the ``--set`` overrides of that variant ("profile": the profile's
#: recipe as it is; the others say every setting they change from it)
_ISSUE = ["sft.replay=0", "sft.max_steps=2000"]  # the recipe before replay (issue 29's figures)
VARIANTS = {
    "sft": {
        "baseline": _ISSUE,
        "replay_0.25": ["sft.replay=0.25", "sft.replay_window=0", "sft.max_steps=2000"],
        "replay_0.5": ["sft.replay_window=0", "sft.max_steps=2000"],
        "replay_0.5_w64": ["sft.max_steps=2000"],
        "replay_0.5_w64_lr1.5x": ["sft.max_steps=2000", "sft.learning_rate=1.5e-3"],
        "replay_0.5_w64_lr2x": ["sft.max_steps=2000", "sft.learning_rate=2e-3"],
        # equal wall time: 64-token windows barely widen the batches, so in the baseline's
        # ~18.8 min a replaying run fits about 2,500 steps (measured: 2,000 in 14.7 min)
        "replay_0.5_w64_2500": [],  # the cpu profile's recipe since issue 29
        "replay_0.6_w64_2500": ["sft.replay=0.6"],
        "lr_0.3x": [*_ISSUE, "sft.learning_rate=3e-4"],
        "half_steps": ["sft.replay=0", "sft.max_steps=1000"],
    },
    "dpo": {
        "baseline": ["dpo.replay_weight=0"],  # the recipe before replay
        "replay_1": [],  # the cpu profile's recipe since issue 29
        # the rest vary one setting of that recipe (replay on)
        "replay_0.3": ["dpo.replay_weight=0.3"],
        "lr_2x": ["dpo.learning_rate=6e-4"],
        "steps_600": ["dpo.max_steps=600"],
        "nll_1": ["dpo.nll_weight=1.0"],
        "nll_4": ["dpo.nll_weight=4.0"],
        "beta_0.3": ["dpo.beta=0.3"],
        "beta_0.03": ["dpo.beta=0.03"],
    },
}
#: the stage each stage's "before" model comes from (the key of its eval.json entry)
BEFORE = {"sft": "pretrain", "dpo": "sft"}


def run_variant(stage: str, name: str, profile: str, init: Path, root: Path,
                log_dir: Path) -> float:
    """Run one variant's stage, or reuse its folder when it already holds the same run (the
    pipeline's fingerprint: profile, overrides, data, starting model); its wall seconds."""
    settings = override(get_profile(profile), parse_set(VARIANTS[stage][name]))
    if is_complete(stage, settings, root / name, init):
        print(f"reusing {name}: {root / name / stage} is up to date")
        return 0.0
    cmd = [sys.executable, "-m", "minimind_lib", stage, "--profile", profile, "--init",
           str(init), "--out", str(root / name)]
    for setting in VARIANTS[stage][name]:
        cmd += ["--set", setting]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0 = time.time()
    with open(log_dir / f"{name}.log", "w") as log:
        done = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"variant {name} failed: see {log_dir / f'{name}.log'}")
    return time.time() - t0


def _validation(folder: Path) -> str:
    """A DPO run's validation losses, first -> last (on-policy; offline in brackets)."""
    rows = [r for r in read_json_lines(folder / "metrics.jsonl") if "val_loss" in r]
    if not rows:
        return "-"
    text = f"{rows[0]['val_loss']:.3f} -> {rows[-1]['val_loss']:.3f}"
    if "offline_val_loss" in rows[-1]:
        text += f" ({rows[0]['offline_val_loss']:.2f} -> {rows[-1]['offline_val_loss']:.2f})"
    return text


def row(stage: str, name: str, root: Path) -> str:
    """One variant's table row, from the eval.json, stage.json and metrics its run wrote."""
    folder = root / name / stage
    evals = read_eval(folder)
    before, after = evals[BEFORE[stage]], evals[stage]
    s_before, s_after = summarize(before.tasks), summarize(after.tasks)
    worst = min(after.tasks.values(), key=lambda t: t.format_rate)
    seconds = read_marker(folder)["seconds"]
    cells = [name, ", ".join(VARIANTS[stage][name]) or "(the profile's recipe)",
             f"{before.perplexity:,.1f} -> {after.perplexity:,.1f} "
             f"({after.perplexity / before.perplexity:.2f}x)",
             f"{before.bits_per_byte:.3f} -> {after.bits_per_byte:.3f}",
             f"{s_before['skill'].exact_match:.1%} -> {s_after['skill'].exact_match:.1%}",
             f"{s_after['knowledge'].exact_match:.1%}", f"{s_after['all'].format_rate:.1%}",
             f"{worst.format_rate:.0%} ({worst.task})"]
    if stage == "dpo":
        cells.append(_validation(folder))
    cells.append(f"{seconds / 60:.1f}")
    return "| " + " | ".join(cells) + " |"


def header(stage: str) -> str:
    names = ["variant", "overrides", f"text perplexity ({BEFORE[stage]} -> {stage})",
             "bits per byte", "skill EM", "knowledge EM", "format", "lowest task format"]
    if stage == "dpo":
        names.append("val loss on-policy (offline)")
    names.append(f"{stage.upper()} stage min")
    align = ["---"] * 4 + ["---:"] * 4 + (["---"] if stage == "dpo" else []) + ["---:"]
    return "| " + " | ".join(names) + " |\n|" + "|".join(align) + "|"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--stage", choices=list(VARIANTS), default="sft")
    parser.add_argument("--only", nargs="+", help="variant names (default: all of the stage's)")
    parser.add_argument("--init", type=Path,
                        help="the starting stage folder (sft: runs/<profile>/pretrain; dpo: "
                             "required, an SFT stage folder)")
    parser.add_argument("--jobs", type=int, default=2, help="variants run at once (1 thread each)")
    args = parser.parse_args()
    names = args.only or list(VARIANTS[args.stage])
    unknown = [n for n in names if n not in VARIANTS[args.stage]]
    if unknown:
        parser.error(f"unknown {args.stage} variant(s) {', '.join(unknown)}; choose from "
                     f"{', '.join(VARIANTS[args.stage])}")
    base = REPO_ROOT / "runs" / "forgetting" / args.profile
    if args.stage == "sft":
        init, root = args.init or REPO_ROOT / "runs" / args.profile / "pretrain", base
    elif args.init is None:
        parser.error("--stage dpo needs --init, the SFT stage folder the variants start from")
    else:
        init, root = args.init, base / f"dpo-from-{args.init.resolve().parent.name}"
    if read_marker(init) is None and not (init / WEIGHTS_FILE).is_file():
        print(f"skipped: {init} holds no model (the variants start from it); for SFT run "
              f"`python -m minimind_lib pretrain --profile {args.profile}` first")
        return 0
    log_dir = root / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda n: run_variant(args.stage, n, args.profile, init, root, log_dir),
                      names))
    print(f"{args.stage.upper()} variants of profile {args.profile}, each from {init}, "
          f"{args.jobs} at a time on 1 thread each (held-out: data/eval/)\n")
    print(header(args.stage))
    for name in names:
        print(row(args.stage, name, root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
