#!/usr/bin/env python
"""How much does SFT make the model forget text, and what keeps it? (issue 29, part 2)

Runs the ``sft`` stage of a profile (default ``cpu``) several times from the same pretrained
model (``--init runs/<profile>/pretrain``), each variant with its own ``--set`` overrides and
its own output folder under ``runs/forgetting/<profile>/``, two at a time on one thread each (so
their wall times compare), then prints one table from what each run wrote: held-out text
perplexity and bits per byte before -> after, skill and knowledge exact match, format rate,
wall time. A finished variant is reused (the pipeline's fingerprints), so the table can be
printed again at no cost::

    python -m minimind_lib pretrain --profile cpu        # once: the shared starting model
    python benchmarks/forgetting_sweep.py                # every variant, then the table
    python benchmarks/forgetting_sweep.py --only baseline replay_0.25 --jobs 1
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
from minimind_lib.course.stages import read_marker
from minimind_lib.evaluation.model_eval import read_eval
from minimind_lib.evaluation.questions import summarize

#: name -> the ``--set`` overrides of that variant (the profile's own SFT recipe is "baseline")
VARIANTS = {
    "baseline": [],
    "replay_0.25": ["sft.replay=0.25"],
    "replay_0.5": ["sft.replay=0.5"],
    "replay_0.25_w64": ["sft.replay=0.25", "sft.replay_window=64"],
    "replay_0.5_w64": ["sft.replay=0.5", "sft.replay_window=64"],
    "lr_0.3x": ["sft.learning_rate=3e-4"],
    "half_steps": ["sft.max_steps=1000"],
}


def run_variant(name: str, profile: str, root: Path, log_dir: Path) -> float:
    """Run (or reuse) one variant's sft stage; its wall seconds (0 when reused)."""
    start = REPO_ROOT / "runs" / profile / "pretrain"
    cmd = [sys.executable, "-m", "minimind_lib", "sft", "--profile", profile, "--init",
           str(start), "--out", str(root / name)]
    for override in VARIANTS[name]:
        cmd += ["--set", override]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0 = time.time()
    with open(log_dir / f"{name}.log", "w") as log:
        done = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"variant {name} failed: see {log_dir / f'{name}.log'}")
    return time.time() - t0


def row(name: str, root: Path) -> str:
    folder = root / name / "sft"
    evals = read_eval(folder)
    before, after = evals["pretrain"], evals["sft"]
    s_after = summarize(after.tasks)
    seconds = read_marker(folder)["seconds"]
    return (f"| {name} | {', '.join(VARIANTS[name]) or '(profile recipe)'} | "
            f"{before.perplexity:,.1f} -> {after.perplexity:,.1f} "
            f"({after.perplexity / before.perplexity:.2f}x) | "
            f"{before.bits_per_byte:.3f} -> {after.bits_per_byte:.3f} | "
            f"{s_after['skill'].exact_match:.1%} | {s_after['knowledge'].exact_match:.1%} | "
            f"{s_after['all'].format_rate:.1%} | {seconds / 60:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--only", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--jobs", type=int, default=2, help="variants run at once (1 thread each)")
    args = parser.parse_args()
    if read_marker(REPO_ROOT / "runs" / args.profile / "pretrain") is None:
        print(f"skipped: no runs/{args.profile}/pretrain yet (the variants start from it); run "
              f"`python -m minimind_lib pretrain --profile {args.profile}` first")
        return 0
    root = REPO_ROOT / "runs" / "forgetting" / args.profile
    log_dir = root / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda n: run_variant(n, args.profile, root, log_dir), args.only))
    print(f"SFT variants of profile {args.profile}, each from runs/{args.profile}/pretrain, "
          f"{args.jobs} at a time on 1 thread each (held-out: data/eval/)\n")
    print("| variant | overrides | text perplexity (pretrain -> SFT) | bits per byte | "
          "skill EM | knowledge EM | format | SFT stage min |")
    print("|---|---|---|---|---:|---:|---:|---:|")
    for name in args.only:
        print(row(name, root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
