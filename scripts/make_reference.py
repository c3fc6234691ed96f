"""Build ``data/reference/sft``: the cpu-profile chat model that ships with the course.

A student who has not trained yet still sees a working model (notebooks 02, 03, 07, 08), and
later stages can start from it (``python -m minimind_lib dpo --profile cpu --init
data/reference/sft``). Made from a finished ``sft`` stage folder:

* ``model.safetensors`` in bf16 (half of fp32's bytes; ``load_model`` reads it into fp32) and
  ``config.json``, the tokenizer files of the run;
* ``eval.json``: the held-out scores *of these bf16 weights*, measured here (the same questions
  and text as the sft stage's evaluation), and the sft stage's ``metrics.jsonl``;
* ``README.md``: what it is, how it was made, its scores.

    make reference          # = python -m minimind_lib sft --profile cpu, then this script
    python scripts/make_reference.py runs/cpu/sft data/reference/sft
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from minimind_lib.core.atomic import atomic_write_text
from minimind_lib.core.filenames import EVAL_FILE, METRICS_FILE, TOKENIZER_FILE
from minimind_lib.course.profiles import get_profile
from minimind_lib.course.stages import read_marker
from minimind_lib.evaluation.model_eval import evaluate_model, read_eval
from minimind_lib.evaluation.questions import question_table, summarize
from minimind_lib.model.checkpoint import load_model, save_model
from minimind_lib.tokenizer import BPETokenizer

LIMIT_BYTES = 12 * 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a finished sft stage folder (runs/cpu/sft)")
    parser.add_argument("out", type=Path, help="where to write (data/reference/sft)")
    parser.add_argument("--profile", default="cpu", help="whose evaluation sizes to use")
    args = parser.parse_args()
    marker = read_marker(args.source)
    if marker is None or marker.get("stage") != "sft":
        sys.exit(f"error: {args.source} is not a finished sft stage folder (no sft stage.json)")
    profile = get_profile(args.profile)
    tokenizer_dir = args.source.parent / "tokenizer"
    model = load_model(args.source).to(torch.bfloat16)
    if args.out.exists():
        shutil.rmtree(args.out)
    save_model(model, args.out)
    for f in sorted(tokenizer_dir.glob("*.json")):
        if f.name != "stage.json":
            shutil.copyfile(f, args.out / f.name)
    shutil.copyfile(args.source / METRICS_FILE, args.out / METRICS_FILE)

    shipped = load_model(args.out)  # what a student loads: bf16 weights in an fp32 model
    tokenizer = BPETokenizer.from_file(args.out / TOKENIZER_FILE)
    scores = evaluate_model(shipped, tokenizer, per_task=profile.eval_per_task,
                            seq_len=profile.pretrain.seq_len, tools=True)
    atomic_write_text(args.out / EVAL_FILE, json.dumps(
        {"per_task": profile.eval_per_task, "models": {"sft": scores.to_dict()}}, indent=2) + "\n")
    pooled = summarize(scores.tasks)
    size = sum(f.stat().st_size for f in args.out.iterdir())
    write_readme(args, marker, scores, pooled, size)
    print(question_table({"reference (bf16)": scores.tasks},
                         metrics=("exact_match", "format_rate")))
    print(f"\n{args.out}: {size / 2**20:.2f} MiB; skill exact-match "
          f"{pooled['skill'].exact_match:.1%}, all {pooled['all'].exact_match:.1%}")
    if size > LIMIT_BYTES:
        sys.exit(f"error: {args.out} is {size / 2**20:.1f} MiB, over the {LIMIT_BYTES >> 20} MiB "
                 "the repository allows")
    return 0


def write_readme(args: argparse.Namespace, marker: dict, scores, pooled: dict, size: int) -> None:
    summary = marker["summary"]
    settings = marker["fingerprint"]["settings"]
    replay = (f" with {settings['replay']:.0%} of the supervised tokens replayed pretraining text "
              f"in {settings.get('replay_window') or settings['seq_len']}-token windows"
              if settings.get("replay") else "")
    before = read_eval(args.source).get("pretrain")
    lines = [
        "# The reference chat model (cpu profile, after SFT)",
        "",
        "The model a student who has not trained yet talks to: the course's `cpu` profile",
        f"(`python -m minimind_lib sft --profile cpu`: pretraining, then {summary['steps']} SFT "
        f"steps{replay}), stored in bf16 ({size / 2**20:.1f} MiB with its tokenizer). Rebuild "
        "it with `make reference`.",
        "",
        "Load it like any stage folder: "
        "`minimind_lib.model.checkpoint.load_model(\"data/reference/sft\")`;",
        "start a later stage from it with `--init data/reference/sft`.",
        "",
        f"Held-out questions ({json.loads((args.out / EVAL_FILE).read_text())['per_task']} per "
        "task, greedy), measured on these bf16 weights:",
        "",
        f"- skill tasks: exact-match {pooled['skill'].exact_match:.1%}, format "
        f"{pooled['skill'].format_rate:.1%}",
        f"- knowledge tasks: exact-match {pooled['knowledge'].exact_match:.1%}",
        f"- held-out text perplexity: {scores.perplexity:.1f}"
        + (f" (the pretrained model's: {before.perplexity:.1f})" if before else ""),
        *tool_lines(scores.tools or {}),
        "",
        f"Made from run `{marker['run_id'][:8]}` ({marker.get('finished_at', 'unknown time')}).",
    ]
    atomic_write_text(args.out / "README.md", "\n".join(lines) + "\n")


def tool_lines(tools: dict) -> list[str]:
    """The README's lines on tool use and thinking (data/eval/tools_eval.jsonl)."""
    if not tools:
        return []
    kinds = [k for k in tools if "call_accuracy" in tools[k]]
    mean = sum(tools[k]["call_accuracy"] for k in kinds) / len(kinds)
    named = sum(tools[k].get("right_tool", 0.0) for k in kinds) / len(kinds)
    lines = [f"- tool calls ({', '.join(kinds)}), each question offered its own tool(s): the "
             f"right tool {named:.1%} on average, with exact arguments (call accuracy) {mean:.1%}; "
             f"calculator questions exact-match {tools['calculate']['with_tools']:.1%} with the "
             f"calculator, {tools['calculate']['without_tools']:.1%} without"]
    if "no_tool" in tools:
        lines.append(f"- questions that need no tool, tools offered: false calls "
                     f"{tools['no_tool']['false_calls']:.1%}")
    if "multi_step" in tools:
        lines.append(f"- three-number sums: exact-match {tools['multi_step']['thinking_on']:.1%} "
                     f"with thinking on, {tools['multi_step']['thinking_off']:.1%} off")
    return lines


if __name__ == "__main__":
    sys.exit(main())
