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
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
from minimind_lib.model.checkpoint import load_model
from minimind_lib.tokenizer.bpe import load_tokenizer
from minimind_lib.training.distill import DistillLoss, teacher_answers
from minimind_lib.training.loop import default_loss, evaluate_loss, train
from minimind_lib.training.settings import TrainConfig
from minimind_lib.training.sft import sft_records

REFERENCE = DATA_DIR / "reference" / "sft"


def student_config(teacher: MiniMindConfig) -> MiniMindConfig:
    return replace(teacher, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=1, intermediate_size=None, head_dim=None)


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
    config = TrainConfig(max_steps=args.steps, batch_size=args.batch_size, learning_rate=args.lr,
                         warmup_steps=20, seq_len=256, precision="fp32", device="cpu", seed=0,
                         progress=False)
    results = {}
    for arm in args.arms.split(","):
        start = time.process_time()
        data = records
        if arm == "black_box":
            conversations = teacher_answers(teacher, tokenizer,
                                            [r["conversations"] for r in records], 64)
            data = [{"conversations": c} for c in conversations]
        train_set = SFTDataset(data, tokenizer, 256, progress=False)
        torch.manual_seed(0)
        student = MiniMindForCausalLM(student_config(teacher.config))
        loss_fn = {"kd": DistillLoss(teacher, 0.5, 1.5),
                   "kd_only": DistillLoss(teacher, 0.0, 1.5)}.get(arm, default_loss)
        rows = train(student, train_set, config, loss_fn=loss_fn, collate_fn=train_set.collate)
        student.eval()
        val = evaluate_loss(student, held_out, batch_size=32, max_batches=10**9,
                            device=torch.device("cpu"),
                            precision=pick_precision(torch.device("cpu"), "fp32"),
                            collate_fn=held_out.collate)
        scores = summarize(evaluate_sft(student, tokenizer, eval_records, args.per_task,
                                        progress=False))
        results[arm] = {"held_out_answer_loss": val, "examples": len(train_set),
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
