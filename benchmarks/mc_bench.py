"""The held-out questions as multiple choice, and bits per byte, for every model found, in one
table (issue 34; docs/benchmarks.md, "Benchmarks as the field reports them").

For each model: ``acc`` / ``acc_norm`` of the 1,440 held-out questions (12 tasks x 120) as
4-way multiple choice (``evaluation.multiple_choice.held_out_mc``: the reference answer and
3 answers of other questions of the same task, fixed seed), in the ``plain`` format
(``Question: ...\\nAnswer: ``, as lm-eval's tasks without a template) and the ``chat`` format
(the chat template, as ``lm_eval --apply_chat_template``), per family (skill, knowledge); and
the bits per byte of the held-out text (``data/eval/pretrain_eval.jsonl``), tokenizer-free.

Models: ``--models name=PATH ...`` (stage folders, transformers folders, MiniMind ``.pth``), or
by default whatever exists of runs/smoke/{pretrain,sft,dpo}, runs/cpu/{pretrain,sft,dpo,grpo,
agent,ppo,distill}, data/reference/sft and data/minimind/{MiniMind2-Small,minimind-3} (fetched
by ``python -m minimind_lib download model``); a missing one is listed as missing.
Usage: ``python benchmarks/mc_bench.py [--per-task N] [--models a=DIR ...]`` (about 1.5 min
per cpu-size model with all 120 questions a task, on one thread).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from minimind_lib import DATA_DIR, REPO_ROOT
from minimind_lib.evaluation.multiple_choice import MC_FORMATS, held_out_mc
from minimind_lib.evaluation.perplexity import bits_per_byte
from minimind_lib.evaluation.questions import eval_files, load_eval_records, select_per_task
from minimind_lib.inference.loading import load_for_serving

DEFAULT_MODELS = {
    **{f"smoke {s}": REPO_ROOT / "runs" / "smoke" / s for s in ("pretrain", "sft", "dpo")},
    **{f"cpu {s}": REPO_ROOT / "runs" / "cpu" / s
       for s in ("pretrain", "sft", "dpo", "grpo", "agent", "ppo", "distill")},
    "reference (cpu sft, shipped)": DATA_DIR / "reference" / "sft",
    **{name: DATA_DIR / "minimind" / name for name in ("MiniMind2-Small", "minimind-3")},
}


def measure(path: Path, records: list[dict], pool: list[dict]) -> dict:
    model, tok = load_for_serving(path, "cpu")
    start = time.perf_counter()
    row = {"params": model.num_parameters()}
    for fmt in MC_FORMATS:
        scores = held_out_mc(model, tok, records, pool=pool, fmt=fmt)
        for group in ("family:skill", "family:knowledge", "all"):
            row[f"{fmt} {group.removeprefix('family:')}"] = (scores[group].acc,
                                                            scores[group].acc_norm)
        row["chance"] = scores["all"].chance
    row["bpb"] = bits_per_byte(model, tok, eval_files("pretrain")[0],
                               context=min(model.config.max_position_embeddings, 512))
    row["seconds"] = time.perf_counter() - start
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-task", type=int, default=None, help="questions a task (all: 120)")
    parser.add_argument("--models", nargs="+", default=None, metavar="NAME=PATH")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = (dict(m.rsplit("=", 1) for m in args.models) if args.models else DEFAULT_MODELS)
    pool = load_eval_records()
    records = select_per_task(pool, args.per_task)
    cols = [f"{fmt} {g}" for fmt in MC_FORMATS for g in ("skill", "knowledge", "all")]
    print(f"{len(records)} held-out questions as 4-way multiple choice; acc / acc_norm %; "
          "bits per byte of data/eval/pretrain_eval.jsonl (each text cut to 512 tokens)\n")
    print("| model | params | " + " | ".join(cols) + " | bits/byte | s |")
    print("|" + "---|" * (len(cols) + 4))
    missing, chance = [], None
    for name, path in models.items():
        if not Path(path).exists():
            missing.append(f"{name} ({path})")
            continue
        try:
            row = measure(Path(path), records, pool)
        except (OSError, ValueError) as e:  # an unfinished or foreign folder: say so, go on
            missing.append(f"{name} ({path}: {e})")
            continue
        cells = [f"{100 * row[c][0]:.1f} / {100 * row[c][1]:.1f}" for c in cols]
        chance = row["chance"]  # the questions' (the same for every model)
        print(f"| {name} | {row['params'] / 1e6:.2f}M | " + " | ".join(cells)
              + f" | {row['bpb']:.3f} | {row['seconds']:.0f} |", flush=True)
    if chance is not None:
        print(f"\nchance: {100 * chance:.1f}%")
    if missing:
        print("not measured (not trained, not downloaded or not loadable here): "
              + "; ".join(missing))


if __name__ == "__main__":
    main()
