#!/usr/bin/env python
"""SFT before/after and the loss-mask ablation, as markdown tables, for one profile.

    python scripts/sft_ablation.py --profile cpu

1. ensures the ``sft`` stage (``runs/<profile>/sft``: answer-only SFT, evaluated before and
   after into ``eval.json``) and prints its per-task table: pretrained vs SFT;
2. trains the ablation's other arm: the same run (settings, seed, data order) with the loss on
   every token, from the same pretrained model, evaluates it the same way and prints
   answer-only vs all tokens, with both runs' final validation loss on held-out replies.

Step 2 costs one more SFT run (about as long as the stage). Notebook 05 does the same.
"""

from __future__ import annotations

import argparse

from minimind_lib.core.filenames import TOKENIZER_FILE
from minimind_lib.course import pipeline
from minimind_lib.course.plotting import read_metrics
from minimind_lib.course.profiles import PROFILE_NAMES, get_profile
from minimind_lib.evaluation.model_eval import eval_report, evaluate_model, read_eval
from minimind_lib.evaluation.questions import question_table
from minimind_lib.model.checkpoint import load_model
from minimind_lib.tokenizer import BPETokenizer
from minimind_lib.training.sft import train_sft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=PROFILE_NAMES, default=None)
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="runs root (default runs/<profile>)")
    args = parser.parse_args()
    profile = get_profile(args.profile)

    sft_dir = pipeline.ensure("sft", profile, root=args.out)
    root = sft_dir.parent
    evals = read_eval(sft_dir)
    print(f"## SFT before/after ({profile.name} profile, "
          f"{profile.eval_per_task} questions per task)\n")
    print(eval_report(evals))

    tokenizer = BPETokenizer.from_file(root / "tokenizer" / TOKENIZER_FILE)
    model = load_model(root / "pretrain")
    run = train_sft(model, tokenizer, profile.sft, seed=profile.seed, answer_only=False)
    all_tokens = evaluate_model(model.cpu(), tokenizer, per_task=profile.eval_per_task,
                                seq_len=profile.sft.seq_len)
    val = {"answer-only": [r["val_loss"] for r in read_metrics(sft_dir) if "val_loss" in r][-1],
           "all tokens": [r["val_loss"] for r in run.rows if "val_loss" in r][-1]}
    print("\n## Ablation: loss on the answers only vs on all tokens "
          f"({profile.sft.max_steps} steps each)\n")
    print(question_table({"answer-only": evals["sft"].tasks, "all tokens": all_tokens.tasks}))
    print("\nfinal validation loss on held-out replies: "
          + ", ".join(f"{name} {v:.3f}" for name, v in val.items()))
    print(f"held-out text perplexity: answer-only {evals['sft'].perplexity:.1f}, "
          f"all tokens {all_tokens.perplexity:.1f}")


if __name__ == "__main__":
    main()
