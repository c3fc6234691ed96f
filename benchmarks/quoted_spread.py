"""How far each quoted notebook figure spreads across seeds, threads, precisions and CPU code
paths, and which quoted ranges are too tight to hold on a student's machine.

Every "What you should see" range is asserted by ``course.quoted.check_quoted``. A range that
holds on one machine can fail on the next: a smoke model trained for seconds is chaotic, so a
different rounding (another thread count, fp32 instead of bf16, another matmul kernel) moves
its loss and perplexity far more than the last digit. This script runs the notebooks under
nbval (as ``make notebooks`` does) once per *configuration*, with ``$MINIMIND_QUOTED_RECORD``
set so each ``check_quoted`` records its figures instead of stopping, and prints, per figure,
the quoted range beside the smallest and largest value seen. ``TOO TIGHT`` marks a range that
some configuration left; the suggested range covers every value seen with a margin.

Configurations (``--configs``; each in its own fresh ``$MINIMIND_RUNS_DIR``):

* ``base``: one torch thread, the CPU's own precision (bf16 where it is native): ``make test``;
* ``threads2``: two threads (an instructor's ``pytest --nbval-lax notebooks/``);
* ``fp32``: ``MINIMIND_CPU_BF16=0``, as a CPU without native bf16 trains (most laptops);
* ``fp32-avx2``: the same on AVX2 kernels only (MKL, oneDNN and ATen capped at AVX2: an older
  or smaller laptop CPU);
* ``bf16-avx512``: bf16 on oneDNN's AVX-512 kernels without the bf16 instructions (another
  CPU's bf16 matmuls round differently);
* ``seed1``, ``seed2``: the profile seed 1 and 2 instead of 42 (``MINIMIND_SEED``).

    python benchmarks/quoted_spread.py                      # every notebook, every config
    python benchmarks/quoted_spread.py --notebooks 05 06 --configs base,fp32
    python benchmarks/quoted_spread.py --report runs/quoted_spread   # the table again
    python benchmarks/quoted_spread.py --configs base --out runs/latest \
        --baseline runs/quoted_spread      # what moved since an earlier run (make test-latest)

When you change a quoted range (or the code behind it), run this on the notebooks it touches
and keep every range at least as wide as the spread it prints. A smoke figure whose spread is
wider than its teaching point is described in words (its direction and order of magnitude)
instead of quoted. Two jobs share two cores at one thread each; ``threads2`` runs alone.
Expect ~15 CPU-minutes per configuration for all notebooks.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"


@dataclass(frozen=True)
class Config:
    name: str
    threads: int
    env: dict[str, str]


AVX2_ONLY = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "ATEN_CPU_CAPABILITY": "avx2"}
CONFIGS = {c.name: c for c in (
    Config("base", 1, {}),
    Config("threads2", 2, {}),
    Config("fp32", 1, {"MINIMIND_CPU_BF16": "0"}),
    Config("fp32-avx2", 1, {"MINIMIND_CPU_BF16": "0", **AVX2_ONLY}),
    Config("bf16-avx512", 1, {"MINIMIND_CPU_BF16": "1", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}),
    Config("seed1", 1, {"MINIMIND_SEED": "1"}),
    Config("seed2", 1, {"MINIMIND_SEED": "2"}),
)}
#: what is set for every run, as ``make notebooks`` sets it
BASE_ENV = {"MINIMIND_PROFILE": "smoke", "PYTHONHASHSEED": "0"}


def notebook_paths(selected: list[str] | None) -> list[Path]:
    """The course notebooks (``05`` or ``05_sft`` selects one); all of them by default."""
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if not selected:
        return paths
    chosen = [p for p in paths if any(p.stem.startswith(s) for s in selected)]
    unknown = [s for s in selected if not any(p.stem.startswith(s) for p in paths)]
    if unknown:
        raise SystemExit(f"error: no notebook starts with {', '.join(unknown)}")
    return chosen


@dataclass
class Job:
    config: Config
    notebook: Path
    out: Path

    @property
    def record(self) -> Path:
        return self.out / "records" / self.config.name / f"{self.notebook.stem}.jsonl"

    @property
    def log(self) -> Path:
        return self.out / "logs" / self.config.name / f"{self.notebook.stem}.log"

    def start(self) -> subprocess.Popen:
        for path in (self.record, self.log):
            path.parent.mkdir(parents=True, exist_ok=True)
        self.record.unlink(missing_ok=True)
        threads = str(self.config.threads)
        env = {**os.environ, **BASE_ENV, **self.config.env, "OMP_NUM_THREADS": threads,
               "MKL_NUM_THREADS": threads, "MINIMIND_QUOTED_RECORD": str(self.record),
               "MINIMIND_RUNS_DIR": str(self.out / "runs" / self.config.name),
               "PYTHONPATH": str(REPO)}  # this tree's library, even from a copy of the tree
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
               "--nbval-current-env", str(self.notebook)]
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self.log.open("w"),
                                stderr=subprocess.STDOUT)


def run_all(jobs: list[Job], cores: int) -> None:
    """Run the jobs, as many at once as their threads fit in ``cores``. Jobs of one config share
    its runs folder: a stage two notebooks need is trained once (``pipeline.ensure`` holds a
    lock per stage, so the second waits and reuses it)."""
    waiting, running = list(jobs), []
    while waiting or running:
        busy = sum(job.config.threads for job, _, _ in running)
        while waiting and (not running or busy + waiting[0].config.threads <= cores):
            job = waiting.pop(0)
            running.append((job, job.start(), time.monotonic()))
            busy += job.config.threads
        time.sleep(1)
        for item in list(running):
            job, proc, began = item
            if proc.poll() is not None:
                running.remove(item)
                tail = job.log.read_text(errors="replace").strip().splitlines()[-1:]
                took = time.monotonic() - began
                print(f"{job.config.name:>12} {job.notebook.stem:<28} {took:5.0f} s "
                      f"{tail[0] if tail else ''}", flush=True)


def _fmt(bounds: list) -> str:
    return bounds[2] if len(bounds) == 3 else "{:.1%}"


def suggest(low: float, high: float, bounds: list) -> str:
    """A range around the values seen: the span widened by half its width each side (at least
    5% of the value), rounded outwards to two significant figures."""
    pad = max((high - low) / 2, 0.05 * max(abs(low), abs(high)))
    lo, hi = low - pad if low - pad > 0 or low < 0 else 0.0, high + pad
    if len(bounds) == 2:
        lo, hi = max(0.0, lo), min(1.0, hi)

    def rounded(x: float, up: bool) -> float:
        if x == 0:
            return 0.0
        step = 10 ** (math.floor(math.log10(abs(x))) - 1)
        return (math.ceil(x / step) if up else math.floor(x / step)) * step
    lo, hi = rounded(lo, False), rounded(hi, True)
    fmt = _fmt(bounds)
    return f"{fmt.format(lo)} - {fmt.format(hi)}"


def collect(out: Path) -> dict[tuple[str, str, str], dict]:
    """``{(notebook, figure, quoted text): {"range": ..., "values": {config: [values]}}}``."""
    seen: dict[tuple[str, str, str], dict] = {}
    for config_dir in sorted((out / "records").glob("*")):
        for record in sorted(config_dir.glob("*.jsonl")):
            for line in record.read_text().splitlines():
                r = json.loads(line)
                key = (record.stem, r["name"], r["text"])
                entry = seen.setdefault(key, {"range": r["range"], "values": {}})
                entry["values"].setdefault(config_dir.name, []).extend(r["values"])
    return seen


def moved(seen: dict, baseline: dict) -> list[str]:
    """Each figure whose value differs from the baseline run's ``base`` configuration, matched by
    notebook and name (so a figure whose quoted range was changed since is compared too)."""
    earlier = {(nb, name): entry for (nb, name, _text), entry in baseline.items()}
    lines = []
    for key, entry in sorted(seen.items()):
        before = earlier.get(key[:2], {}).get("values", {}).get("base")
        now = entry["values"].get("base")
        if before is None or now is None:
            continue
        if len(before) != len(now) or any(not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
                                          for a, b in zip(before, now, strict=False)):
            fmt = _fmt(entry["range"])
            lines.append(f"{key[0]:<24} {key[1][:48]:<48} "
                         f"{', '.join(fmt.format(v) for v in before[:4])} -> "
                         f"{', '.join(fmt.format(v) for v in now[:4])}")
    return lines


def report(out: Path, baseline: Path | None = None) -> int:
    """Print the spread of every recorded figure (and, given an earlier run's folder, each
    figure that moved from its ``base`` values); return how many ranges are too tight."""
    seen = collect(out)
    failures = []
    for log in sorted((out / "logs").glob("*/*.log")):
        text = log.read_text(errors="replace")
        last = text.strip().splitlines()[-1:] or [""]
        if " failed" in last[0] or "error" in last[0].lower():
            failures.append(f"{log.parent.name}/{log.stem}: {last[0]}")
    tight = 0
    rows = []
    for (notebook, name, text), entry in sorted(seen.items()):
        bounds, fmt = entry["range"], _fmt(entry["range"])
        values = [v for vs in entry["values"].values() for v in vs]
        low, high = min(values), max(values)
        outside = sorted(c for c, vs in entry["values"].items()
                         if not all(bounds[0] <= v <= bounds[1] for v in vs))
        verdict = ""
        if outside:
            tight += 1
            verdict = f"TOO TIGHT ({', '.join(outside)}); suggest {suggest(low, high, bounds)}"
        rows.append((notebook, name, text, f"{fmt.format(low)} .. {fmt.format(high)}",
                     len(entry["values"]), verdict))
    print(f"\n{'notebook':<24} {'figure':<48} {'quoted':>18} {'seen':>24} configs")
    for notebook, name, text, span, n, verdict in rows:
        print(f"{notebook:<24} {name[:48]:<48} {text:>18} {span:>24} {n:>3}  {verdict}")
    print(f"\n{len(rows)} figures, {tight} ranges too tight")
    if failures:
        print("notebook runs with failing cells (read their logs):")
        for f in failures:
            print("  " + f)
    if baseline is not None:
        changes = moved(seen, collect(baseline))
        print(f"\n{len(changes)} figures moved from {baseline} (config base):")
        for line in changes:
            print("  " + line)
    (out / "spread.json").write_text(json.dumps(
        [{"notebook": nb, "figure": name, "quoted": text, "seen": span, "configs": n,
          "verdict": verdict} for nb, name, text, span, n, verdict in rows], indent=1))
    return tight


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebooks", nargs="*", help="notebook numbers or names (default: all)")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"comma-separated, from {', '.join(CONFIGS)}")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "quoted_spread")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--report", type=Path, metavar="DIR",
                        help="print the table of an earlier run's folder and exit")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="an earlier run's folder (e.g. with the locked versions): also "
                             "print each figure of config base that moved from it")
    args = parser.parse_args(argv)
    if args.baseline is not None and not (args.baseline / "records").is_dir():
        print(f"note: no earlier run in {args.baseline}; figures are not compared with one")
        args.baseline = None
    if args.report:
        return 1 if report(args.report, args.baseline) else 0
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise SystemExit(f"error: unknown config {', '.join(unknown)}; choose from "
                         f"{', '.join(CONFIGS)}")
    notebooks = notebook_paths(args.notebooks)
    out = args.out.resolve()
    jobs = [Job(CONFIGS[n], nb, out) for n in names for nb in notebooks]
    print(f"{len(jobs)} notebook runs ({len(notebooks)} notebooks x {len(names)} configs) "
          f"on {args.cores} cores into {out}", flush=True)
    run_all(jobs, args.cores)
    return 1 if report(out, args.baseline) else 0


if __name__ == "__main__":
    sys.exit(main())
