"""LoRA vs full fine-tuning at the same step budget (notebook 09).

Both arms start from the same model (``--init``, default the shipped ``data/reference/sft``),
train on the same conversations (the lora stage's: ``stage_data.lora_training_records``: the new
task of ``minimind_lib.data.hanzi_codes``, plus ``--replay`` of SFT conversations) in the same order
with the profile's ``lora`` settings (batch, steps, schedule, seed); only what trains differs:

* ``full``: every weight, at ``--full-lr`` (default: the profile's SFT learning rate);
* ``lora``: rank-``r`` adapters on the profile's ``lora.target_modules``, at the profile's
  ``lora.learning_rate`` (LoRA wants a larger step: its ``B`` starts at zero).

Reported per arm: trainable parameters and their share, the optimizer state AdamW keeps
(measured on the arm's own optimizer after one step) and the gradients' bytes, training
seconds per step (the arms take turns for ``--rounds`` rounds of ``--speed-steps`` steps on
the same batches, median, so a shared CPU's load hits both alike; the ratio is LoRA / full),
and held-out exact-match on the new task (per task) and on the SFT tasks (what each arm
forgot), for the start model too. The headline is LoRA's exact-match on the new task as a
share of full fine-tuning's.

    python benchmarks/lora_bench.py                           # smoke profile's budget
    python benchmarks/lora_bench.py --profile cpu --out docs/figures
    python benchmarks/lora_bench.py --profile cpu --replay 0 --out docs/figures --tag _no_replay
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from minimind_lib import REPO_ROOT
from minimind_lib.core.device import pick_device, seed_everything
from minimind_lib.course.profiles import get_profile
from minimind_lib.course.stage_data import lora_training_records
from minimind_lib.data.conversations import SFTDataset
from minimind_lib.data.hanzi_codes import FAMILY, task_records
from minimind_lib.evaluation.questions import (
    evaluate_sft,
    load_eval_records,
    select_per_task,
    summarize,
)
from minimind_lib.model.checkpoint import load_model
from minimind_lib.tokenizer import load_tokenizer
from minimind_lib.training import TrainConfig, train
from minimind_lib.training.loop import make_optimizer
from minimind_lib.training.lora import add_lora, count_parameters, finetune, optimizer_state_bytes

REFERENCE = REPO_ROOT / "data" / "reference" / "sft"


def make_arm(name, start, settings, seed):
    """A copy of ``start``: all weights trainable (full), or with the settings' adapters (their
    random ``A`` drawn after seeding, as the lora stage does)."""
    model = copy.deepcopy(start).train()
    seed_everything(seed)
    if name == "lora":
        add_lora(model, rank=settings.rank, alpha=settings.alpha, dropout=settings.dropout,
                 target_modules=settings.target_modules)
    return model


def state_bytes(model, settings, batch, device):
    """Bytes of AdamW's state and of the gradients after one real step (then undone: the
    caller's model is a throwaway copy)."""
    model = copy.deepcopy(model).to(device)
    optimizer = make_optimizer(model, TrainConfig.from_stage(settings), device)
    model(batch["input_ids"].to(device), labels=batch["labels"].to(device)).loss.backward()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters()
                if p.grad is not None)
    optimizer.step()
    return optimizer_state_bytes(optimizer), grads


def seconds_per_step(arms, train_set, settings, rounds, steps, seed, device):
    """Median seconds per optimizer step per arm, the arms taking turns round by round."""
    times = {name: [] for name in arms}
    for _ in range(rounds):
        for name, (model, lr) in arms.items():
            seed_everything(seed)
            cfg = TrainConfig.from_stage(settings, learning_rate=lr, max_steps=steps + 1,
                                         warmup_steps=1, eval_every=10**6, seed=seed,
                                         device=str(device), progress=False)
            rows = train(copy.deepcopy(model), train_set, cfg, collate_fn=train_set.collate)
            elapsed = [b["elapsed_s"] - a["elapsed_s"]
                       for a, b in zip(rows[:-1], rows[1:], strict=True)]
            times[name].append(statistics.median(elapsed))
    return {name: statistics.median(v) for name, v in times.items()}


def evaluate(model, tokenizer, per_task):
    """Exact-match per task: the new task's held-out questions, then the SFT tasks'."""
    questions = task_records("eval", per_task) + select_per_task(load_eval_records(), per_task)
    return evaluate_sft(model.eval(), tokenizer, questions, progress=False)


def table(result):
    arms = result["arms"]
    names = list(arms)
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]

    def row(label, fmt):
        lines.append(f"| {label} | " + " | ".join(fmt(arms[n]) for n in names) + " |")

    row("trainable parameters", lambda a: f"{a['trainable']:,} ({a['share']:.2%})"
        if "trainable" in a else "-")
    row("AdamW state", lambda a: f"{a['optimizer_bytes'] / 2**10:,.0f} KiB"
        if "optimizer_bytes" in a else "-")
    row("gradients", lambda a: f"{a['gradient_bytes'] / 2**10:,.0f} KiB"
        if "gradient_bytes" in a else "-")
    row("seconds per step", lambda a: f"{a['seconds_per_step']:.3f}"
        if "seconds_per_step" in a else "-")
    row("training wall time", lambda a: f"{a['train_seconds']:.0f} s"
        if "train_seconds" in a else "-")
    for key in result["tasks"]:
        row(f"exact-match {key}", lambda a, k=key: f"{a['exact_match'][k]:.1%}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="smoke")
    parser.add_argument("--init", type=Path, default=REFERENCE, help="the start model folder")
    parser.add_argument("--steps", type=int, default=None, help="default: the profile's lora")
    parser.add_argument("--full-lr", type=float, default=None, help="default: the SFT lr")
    parser.add_argument("--replay", type=float, default=None, help="default: the profile's")
    parser.add_argument("--per-task", type=int, default=None, help="default: eval_per_task")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--speed-steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--tag", default="", help="appended to the output file's name")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    profile = get_profile(args.profile)
    settings = replace(profile.lora, save_every=10**6,
                       **{k: v for k, v in (("max_steps", args.steps),
                                            ("replay", args.replay)) if v is not None})
    full_lr = args.full_lr or profile.sft.learning_rate
    per_task = args.per_task or profile.eval_per_task
    device, tokenizer = pick_device(), load_tokenizer()
    start = load_model(args.init)
    records = lora_training_records(settings, profile)
    train_set = SFTDataset(records, tokenizer, settings.seq_len, progress=False)
    load_before = os.getloadavg()[0]
    init = args.init.resolve()
    shown = init.relative_to(REPO_ROOT) if init.is_relative_to(REPO_ROOT) else init
    result = {"profile": profile.name, "init": str(shown), "steps": settings.max_steps,
              "batch_size": settings.batch_size, "replay": settings.replay,
              "rank": settings.rank, "alpha": settings.alpha,
              "target_modules": list(settings.target_modules), "per_task": per_task,
              "arms": {"start": {"exact_match": {}}}, "device": str(device),
              "threads": torch.get_num_threads()}
    scores = {"start": evaluate(start, tokenizer, per_task)}
    arms = {"full": (make_arm("full", start, settings, profile.seed), full_lr),
            "lora": (make_arm("lora", start, settings, profile.seed), settings.learning_rate)}
    batch = train_set.collate([train_set[i] for i in range(settings.batch_size)])
    for name, (model, lr) in arms.items():
        counts = count_parameters(model)
        optimizer_bytes, gradient_bytes = state_bytes(model, settings, batch, device)
        seed_everything(profile.seed)
        t0 = time.perf_counter()
        rows = finetune(model, tokenizer, records, replace(settings, learning_rate=lr),
                        seed=profile.seed, eval_records=task_records("eval", per_task),
                        device=str(device), progress=False)
        seconds = time.perf_counter() - t0
        scores[name] = evaluate(model, tokenizer, per_task)
        result["arms"][name] = {"learning_rate": lr, "trainable": counts.trainable,
                                "total": counts.total, "share": counts.share,
                                "optimizer_bytes": optimizer_bytes,
                                "gradient_bytes": gradient_bytes, "train_seconds": seconds,
                                "final_val_loss": rows[-1].get("val_loss"),
                                "exact_match": {}}
        print(f"{name}: {counts}; {seconds:.0f} s for {len(rows)} steps", flush=True)
    speeds = seconds_per_step({n: (make_arm(n, start, settings, profile.seed), lr)
                               for n, (_, lr) in arms.items()},
                              train_set, settings, args.rounds, args.speed_steps, profile.seed,
                              device)
    for name, seconds in speeds.items():
        result["arms"][name]["seconds_per_step"] = seconds
    tasks = {}
    for name, per in scores.items():
        pooled = summarize(per)
        em = {t: s.exact_match for t, s in per.items() if s.family == FAMILY}
        em |= {f"**{fam}**": s.exact_match for fam, s in pooled.items() if fam != "all"}
        result["arms"][name]["exact_match"] = em
        tasks = em
    result["tasks"] = list(tasks)
    new_task = f"**{FAMILY}**"
    full_em, lora_em = (result["arms"][n]["exact_match"][new_task] for n in ("full", "lora"))
    result["lora_share_of_full_exact_match"] = lora_em / full_em if full_em else None
    result["lora_over_full"] = {
        "trainable": result["arms"]["lora"]["trainable"] / result["arms"]["full"]["trainable"],
        "optimizer_bytes": (result["arms"]["lora"]["optimizer_bytes"]
                            / result["arms"]["full"]["optimizer_bytes"]),
        "seconds_per_step": speeds["lora"] / speeds["full"]}
    result["load_average"] = [load_before, os.getloadavg()[0]]
    print("\n" + table(result))
    ratios = result["lora_over_full"]
    print(f"\nLoRA / full: trainable parameters {ratios['trainable']:.3f}x, AdamW state "
          f"{ratios['optimizer_bytes']:.3f}x, seconds per step {ratios['seconds_per_step']:.2f}x; "
          f"new-task exact-match {lora_em:.1%} vs {full_em:.1%} = "
          + (f"{result['lora_share_of_full_exact_match']:.1%} of full fine-tuning's"
             if full_em else "(full fine-tuning scored 0)"))
    print(f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"{torch.get_num_threads()} torch thread(s) on {device}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"lora_vs_full_{profile.name}{args.tag}.json"
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
