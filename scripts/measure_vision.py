"""Run the ``vision`` stage once and record its figures with how they were measured.

    python scripts/measure_vision.py --profile cpu --init data/reference/sft \\
        --out /tmp/vision-runs --record docs/figures/vision_cpu.json

Runs ``python -m minimind_lib vision`` in this process (so it is the same code path as the
CLI), timing it by the wall clock and by this process's CPU time (on a shared machine the
wall clock also counts other jobs' turns; the load average says how busy the machine was),
then writes ``eval.json``'s figures plus those times to ``--record``. Notebook 13 and
docs/benchmarks.md read that file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from minimind_lib.__main__ import main
from minimind_lib.core.atomic import atomic_write_text
from minimind_lib.core.filenames import EVAL_FILE

#: what the record keeps of eval.json (the per-kind details stay in the run folder)
KEPT = ("zero_shot_accuracy", "zero_shot_chance", "vqa_exact_match", "vqa_chance", "vqa_by_kind",
        "held_out_pairs", "eval_images", "zero_shot", "vqa")


def run(args: argparse.Namespace) -> dict:
    command = ["vision", "--profile", args.profile, "--out", args.out, "--no-progress"]
    command += ["--init", args.init] if args.init else []
    for item in args.set:
        command += ["--set", item]
    load_before = os.getloadavg()
    wall, cpu = time.perf_counter(), time.process_time()
    code = main(command)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if code != 0:
        raise SystemExit(code)
    result = json.loads((Path(args.out) / "vision" / EVAL_FILE).read_text(encoding="utf-8"))
    return {**{k: result[k] for k in KEPT if k in result},
            "command": "python -m minimind_lib " + " ".join(command),
            "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "threads": torch.get_num_threads(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()]}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--init", default=None, metavar="MODEL_DIR")
    parser.add_argument("--out", default="/tmp/vision-runs")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--record", default=None, metavar="FILE.json")
    return parser.parse_args(argv)


if __name__ == "__main__":
    options = parse(sys.argv[1:])
    record = run(options)
    print(json.dumps({k: v for k, v in record.items() if k not in ("zero_shot", "vqa")}, indent=1))
    if options.record:
        atomic_write_text(options.record, json.dumps(record, indent=1) + "\n")
        print(f"wrote {options.record}")
