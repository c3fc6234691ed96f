"""Does more training on the tool conversations fix the calls? Continue a finished sft stage's
model on ``data/sft_tools.jsonl`` alone for ``--steps`` steps (the profile's SFT settings, no
replay, ``--lr``), then score it on the held-out tool questions (``evaluate_tools``) beside the
model it started from. An experiment (docs/benchmarks.md, issue #30), not a stage: the
shipped model is the pipeline's SFT.

    python scripts/tool_steps_probe.py runs/cpu/sft --steps 300 --lr 5e-4 --per-task 30
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from minimind_lib import DATA_DIR
from minimind_lib.course.profiles import get_profile
from minimind_lib.evaluation.tool_use import evaluate_tools, tool_table
from minimind_lib.inference.loading import load_model
from minimind_lib.tokenizer import load_tokenizer
from minimind_lib.training.sft import train_sft


def summary(scores: dict) -> str:
    kinds = [k for k in scores if "call_accuracy" in scores[k]]
    mean = {m: sum(scores[k][m] for k in kinds) / len(kinds) for m in ("right_tool",
                                                                       "call_accuracy")}
    return (f"right tool {mean['right_tool']:.1%}, call accuracy {mean['call_accuracy']:.1%}, "
            f"false calls {scores['no_tool']['false_calls']:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a finished sft stage folder (runs/cpu/sft)")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--per-task", type=int, default=30)
    args = parser.parse_args()
    settings = get_profile(args.profile).sft
    settings = replace(settings, max_steps=args.steps, replay=0.0, warmup_steps=10,
                       learning_rate=args.lr, eval_every=args.steps, save_every=args.steps)
    tokenizer = load_tokenizer()
    model = load_model(args.model)
    before = evaluate_tools(model.eval(), tokenizer, args.per_task, progress=False)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        train_sft(model, tokenizer, settings, seed=0, files=[DATA_DIR / "sft_tools.jsonl"],
                  out_dir=out, progress=False)
    print(f"{args.steps} steps on the tool data at lr {args.lr:g}: "
          f"{time.perf_counter() - start:.0f} s")
    after = evaluate_tools(model.eval(), tokenizer, args.per_task, progress=False)
    for name, scores in (("before", before), (f"after {args.steps} steps", after)):
        print(f"\n{name}: {summary(scores)}\n\n{tool_table(scores)}")


if __name__ == "__main__":
    main()
