#!/usr/bin/env python
"""Choose a profile's DPO settings: held-out preference accuracy for a grid of lr x beta.

    python scripts/dpo_sweep.py --profile cpu --lr 2e-5 5e-5 1e-4 2e-4 --beta 0.1
    python scripts/dpo_sweep.py --profile smoke --lr 5e-4 1e-3 --steps 30 120

Every run starts from the profile's SFT model (``pipeline.ensure("sft")``: reused when
``runs/<profile>/sft`` is complete), trains with ``profile.dpo`` except for the swept values,
on the same pairs in the same order, against reference log-probs computed once, and scores
all held-out pairs (``data/eval/dpo_eval*.jsonl``, 100 per task). It prints one row per run:
log-prob accuracy of the SFT and the DPO model, implicit-reward accuracy, the mean drift
``|log pi - log pi_ref|`` and the wall time. A measurement tool for ``profiles.py``; it is not
part of the test suite and writes nothing.
"""

from __future__ import annotations

import argparse
import itertools
import time

from minimind_lib.core.device import pick_device, pick_precision
from minimind_lib.course import pipeline
from minimind_lib.course.profiles import get_profile
from minimind_lib.data.readers import dataset_files
from minimind_lib.evaluation.preferences import score_preferences, summarize_preferences
from minimind_lib.model.checkpoint import load_model
from minimind_lib.tokenizer import BPETokenizer
from minimind_lib.training import TrainConfig, train
from minimind_lib.training.dpo import DPODataset, DPOLoss, held_out_pairs, pair_logprobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=None)
    parser.add_argument("--lr", type=float, nargs="+", default=None, help="default: the profile's")
    parser.add_argument("--beta", type=float, nargs="+", default=None,
                        help="default: the profile's")
    parser.add_argument("--steps", type=int, nargs="+", default=None, help="default: the profile's")
    args = parser.parse_args()

    profile = get_profile(args.profile)
    settings = profile.dpo
    device = pick_device()
    precision = pick_precision(device)
    tok = BPETokenizer.from_file(pipeline.ensure("tokenizer", profile) / "tokenizer.json")
    sft_dir = pipeline.ensure("sft", profile)
    sft = load_model(sft_dir, device=device)
    train_set = DPODataset.from_files(dataset_files("dpo"), tok, settings.seq_len,
                                      max_examples=settings.max_examples)
    held_out = held_out_pairs(tok, settings.seq_len, per_task=100)
    train_set.set_reference(pair_logprobs(sft, train_set, precision=precision))
    ref = pair_logprobs(sft, held_out, precision=precision)  # (N, 2)
    before = summarize_preferences(score_preferences(held_out.tasks, held_out.families, ref))
    print(f"profile {profile.name}: {len(train_set)} training pairs, {len(held_out)} held-out; "
          f"SFT log-prob accuracy {before['all'].logprob_accuracy:.3f}")
    print("| lr | beta | steps | log-prob acc. SFT | log-prob acc. DPO | reward acc. DPO "
          "| skill | knowledge | drift | seconds |\n"
          "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    grid = itertools.product(args.lr or [settings.learning_rate], args.beta or [settings.beta],
                             args.steps or [settings.max_steps])
    for lr, beta, steps in grid:
        t0 = time.time()
        model = load_model(sft_dir, device=device)
        config = TrainConfig.from_stage(settings, learning_rate=lr, max_steps=steps,
                                        seed=profile.seed, progress=False)
        train(model, train_set, config, loss_fn=DPOLoss(beta), collate_fn=train_set.collate)
        logps = pair_logprobs(model, held_out, precision=precision)
        after = summarize_preferences(score_preferences(held_out.tasks, held_out.families,
                                                        logps, ref))
        fam = " | ".join(f"{after[f].logprob_accuracy:.3f} / {after[f].reward_accuracy:.3f}"
                         for f in ("skill", "knowledge") if f in after)
        print(f"| {lr:g} | {beta:g} | {steps} | {before['all'].logprob_accuracy:.3f} | "
              f"{after['all'].logprob_accuracy:.3f} | {after['all'].reward_accuracy:.3f} | {fam} | "
              f"{(logps - ref).abs().mean().item():.2f} | {time.time() - t0:.0f} |", flush=True)


if __name__ == "__main__":
    main()
