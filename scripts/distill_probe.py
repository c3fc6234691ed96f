"""Does a small student learn more from the teacher's distributions than from the answers alone?

The teacher is the shipped chat model (``data/reference/sft``, the cpu profile's SFT, 4.6M
parameters). The student is a quarter of its width (hidden 128, 4 layers, 1.6M parameters,
most of them its embedding), started from the same random weights in every arm and trained the
same steps on the same batches of the bundled SFT task questions:

* ``sft``: answer-only cross-entropy on the reference answers (``alpha`` 1);
* ``kd``: ``alpha`` x that + (1 - ``alpha``) x T^2 KL(teacher || student) (``DistillLoss``,
  MiniMind's defaults ``alpha`` 0.5, T 1.5);
* ``kd_only``: the KL alone (``alpha`` 0);
* ``black_box``: cross-entropy on the teacher's own greedy answers to the same questions
  (``teacher_answers``), no logits.

Measured on held-out data: the answer loss on the reference replies of the held-out questions
(``sft.validation_dataset``, plain cross-entropy for every arm) and exact match / format rate
on 20 held-out questions per task, greedy. Usage: ``python scripts/distill_probe.py [--steps
300] [--arms sft,kd,kd_only,black_box]`` (1 torch thread; about 1-2 min per arm on this CPU).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from dataclasses import replace

import torch

from minimind_lib import DATA_DIR
from minimind_lib.core.device import pick_precision
from minimind_lib.data.conversations import SFTDataset
from minimind_lib.evaluation.questions import evaluate_sft, load_eval_records, summarize
from minimind_lib.model import MiniMindForCausalLM
from minimind_lib.model.checkpoint import load_model
from minimind_lib.tokenizer.bpe import load_tokenizer
from minimind_lib.training.distill import DistillSettings, student_config, train_distill
from minimind_lib.training.loop import evaluate_loss
from minimind_lib.training.sft import sft_records

REFERENCE = DATA_DIR / "reference" / "sft"
#: arm -> (distill.mode, alpha)
ARMS = {"sft": ("none", 1.0), "kd": ("logits", 0.5), "kd_only": ("logits", 0.0),
        "black_box": ("answers", 1.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--examples", type=int, default=4800, help="task conversations used")
    parser.add_argument("--arms", default="sft,kd,kd_only,black_box")
    parser.add_argument("--per-task", type=int, default=20)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    teacher = load_model(REFERENCE).eval()
    tokenizer = load_tokenizer(REFERENCE / "tokenizer.json")
    records = list(itertools.islice((r for r in sft_records() if "task" in r), args.examples))
    held_out = SFTDataset(load_eval_records(), tokenizer, 256, progress=False)
    eval_records = load_eval_records()
    base = DistillSettings(max_steps=args.steps, batch_size=args.batch_size,
                           learning_rate=args.lr, warmup_steps=20, seq_len=256,
                           eval_every=args.steps, temperature=1.5)
    results = {}
    for arm in args.arms.split(","):
        start = time.process_time()
        mode, alpha = ARMS[arm]
        settings = replace(base, mode=mode, alpha=alpha)
        torch.manual_seed(0)
        student = MiniMindForCausalLM(student_config(teacher.config, settings))
        rows = train_distill(student, teacher, tokenizer, [r["conversations"] for r in records],
                             settings, held_out=eval_records, seed=0, precision="fp32",
                             device="cpu", progress=False)
        student.eval()
        val = evaluate_loss(student, held_out, batch_size=32, max_batches=10**9,
                            device=torch.device("cpu"),
                            precision=pick_precision(torch.device("cpu"), "fp32"),
                            collate_fn=held_out.collate)
        scores = summarize(evaluate_sft(student, tokenizer, eval_records, args.per_task,
                                        progress=False))
        results[arm] = {"held_out_answer_loss": val,
                        "exact_match": scores["all"].exact_match,
                        "skill_exact_match": scores["skill"].exact_match,
                        "format_rate": scores["all"].format_rate,
                        "train_loss_last": rows[-1]["loss"],
                        "cpu_seconds": time.process_time() - start}
        print(arm, json.dumps(results[arm]), flush=True)
    print(f"\nstudent {student.num_parameters() / 1e6:.2f}M params, teacher "
          f"{teacher.num_parameters() / 1e6:.2f}M; {args.steps} steps of {args.batch_size}")
    print("| arm | held-out answer loss | exact match | skill | format | CPU s |\n"
          "|---|---:|---:|---:|---:|---:|")
    for arm, r in results.items():
        print(f"| {arm} | {r['held_out_answer_loss']:.3f} | {r['exact_match']:.1%} | "
              f"{r['skill_exact_match']:.1%} | {r['format_rate']:.1%} | {r['cpu_seconds']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
