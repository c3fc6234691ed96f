"""Perplexity vs input length for RoPE (+ PI, NTK, YaRN), ALiBi and NoPE (notebook 12).

Trains three models of the profile's size that differ only in ``position_encoding``
("rope", "alibi", "none") on windows of ``--train-len`` tokens (default: the profile's
pretraining ``seq_len``) with the profile's pretraining settings for ``--steps`` steps (same
seed, same batches).  Then scores the held-out split of the bundled pretraining text (its
documents concatenated, as tokenised, each followed by ``<|endoftext|>``) in non-overlapping
windows of ``train_len × 1, 2, 4, 8`` tokens (capped by the held-out tokens), all lengths on
the same text (``minimind_lib.evaluation.long_context.perplexity_by_length``):

* RoPE as trained, and RoPE + PI / NTK / YaRN (``factor = length / train_len``; YaRN with
  MiniMind's beta_fast 32, beta_slow 1, attention_factor 1.0), and also YaRN with the paper's
  attention factor ``0.1 ln s + 1`` (where MiniMind's YaRN differs from the paper);
* ALiBi and NoPE as trained (neither has a table to scale).

Also the loss by position in the longest windows, in buckets of ``train_len``.  With
``--out DIR`` it writes ``DIR/long_context_<profile>.json`` and ``.png`` (the figures notebook
12 shows for the cpu profile).

    python scripts/long_context.py                         # smoke profile, ~1-2 min
    python scripts/long_context.py --profile cpu --steps 300 --out docs/figures
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from minimind_lib.core.device import pick_device, seed_everything
from minimind_lib.course.profiles import get_profile
from minimind_lib.data.pretraining import load_pretrain_split, tokenize_corpus
from minimind_lib.data.readers import dataset_files
from minimind_lib.evaluation.long_context import (
    extend,
    loss_by_position,
    perplexity_by_length,
    rope_variants,
)
from minimind_lib.model import MiniMindForCausalLM
from minimind_lib.tokenizer.bpe import COURSE_TOKENIZER_DIR
from minimind_lib.training import TrainConfig, train

ENCODINGS = ("rope", "alibi", "none")


def corpus(profile) -> Path:
    return tokenize_corpus(dataset_files("pretrain"), COURSE_TOKENIZER_DIR / "tokenizer.json",
                           profile.runs_dir / "bench_data",
                           max_examples=profile.pretrain.max_examples, progress=False)


def train_encoding(encoding, profile, settings, train_set, device):
    seed_everything(profile.seed)
    model = MiniMindForCausalLM(replace(profile.model, position_encoding=encoding))
    config = TrainConfig.from_stage(settings, seed=profile.seed, device=str(device), progress=False)
    t0 = time.perf_counter()
    rows = train(model, train_set, config)
    print(f"{encoding:6s} trained: loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f} "
          f"({(time.perf_counter() - t0) / 60:.1f} min)", flush=True)
    return model.eval(), rows[-1]["loss"]


def variants(models, train_len, length):
    """{curve name: model reading ``length`` tokens} for one length."""
    out = {name: extend(models["rope"], length, scaling)
           for name, scaling in rope_variants(train_len, length).items()}
    paper = dict(rope_variants(train_len, length)["RoPE + YaRN"])
    s = paper["factor"]
    paper["attention_factor"] = 0.1 * math.log(s) + 1.0 if s > 1 else 1.0  # the paper's sqrt(1/t)
    out["RoPE + YaRN (paper's attention factor)"] = extend(models["rope"], length, paper)
    out["ALiBi"] = extend(models["alibi"], length)
    out["NoPE"] = extend(models["none"], length)
    return out


def measure(models, tokens, train_len, lengths, batch_size):
    ppl = {}
    for length in lengths:
        for name, model in variants(models, train_len, length).items():
            ppl.setdefault(name, {})[length] = perplexity_by_length(
                model, tokens, [length], batch_size)[length]
        print(f"length {length:5d}: " + ", ".join(f"{n} {v[length]:.1f}" for n, v in ppl.items()),
              flush=True)
    longest = max(lengths)
    by_position = {name: loss_by_position(model, tokens, longest, train_len, batch_size).tolist()
                   for name, model in variants(models, train_len, longest).items()}
    return ppl, by_position


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.2))
    train_len = result["train_len"]
    for name, curve in result["perplexity"].items():
        lengths = sorted(int(k) for k in curve)
        ax.plot(lengths, [curve[str(n)] if str(n) in curve else curve[n] for n in lengths], "o-",
                label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.axvline(train_len, color="gray", ls=":")
    ax.set(xlabel="input length (tokens)", ylabel="held-out perplexity",
           title=f"trained on {train_len} tokens ({result['profile']} profile)")
    ax.legend(fontsize=7)
    for name, losses in result["loss_by_position"].items():
        starts = [i * train_len for i in range(len(losses))]
        bx.plot(starts, losses, "o-", label=name)
    bx.axvline(train_len, color="gray", ls=":")
    bx.set(xlabel=f"position (bucket of {train_len})", ylabel="mean next-token loss",
           title=f"loss by position in {max(result['lengths'])}-token windows")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="smoke")
    parser.add_argument("--steps", type=int, default=None, help="default: the profile's")
    parser.add_argument("--train-len", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    profile = get_profile(args.profile)
    train_len = args.train_len or profile.pretrain.seq_len
    steps = args.steps or profile.pretrain.max_steps
    settings = replace(profile.pretrain, seq_len=train_len, max_steps=steps, save_every=10**6,
                       warmup_steps=min(profile.pretrain.warmup_steps, steps // 10))
    device = pick_device()
    data_dir = corpus(profile)
    train_set = load_pretrain_split(data_dir, "train", train_len)
    val = torch.from_numpy(np.fromfile(data_dir / "val.bin", dtype=np.uint16).astype(np.int64))
    lengths = [train_len * m for m in (1, 2, 4, 8) if train_len * m <= val.numel()]
    load_before = os.getloadavg()[0]
    models, final_loss = {}, {}
    for encoding in ENCODINGS:
        models[encoding], final_loss[encoding] = train_encoding(encoding, profile, settings,
                                                                train_set, device)
    ppl, by_position = measure(models, val, train_len, lengths, batch_size=2)
    result = {"profile": profile.name, "train_len": train_len, "steps": steps,
              "tokens_per_run": steps * settings.tokens_per_step, "lengths": lengths,
              "eval_tokens": val.numel() // max(lengths) * max(lengths),
              "final_train_loss": final_loss, "perplexity": ppl, "loss_by_position": by_position,
              "threads": torch.get_num_threads(), "load_average": [load_before, os.getloadavg()[0]]}
    print(f"\nperplexity on {result['eval_tokens']:,} held-out tokens (trained on {train_len}):")
    print(f"{'':40s}" + "".join(f"{n:>9d}" for n in lengths))
    for name, curve in ppl.items():
        print(f"{name:40s}" + "".join(f"{curve[n]:9.1f}" for n in lengths))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = args.out / f"long_context_{profile.name}"
        stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        plot(result, stem.with_suffix(".png"))
        print(f"wrote {stem}.json and .png")
    return result


if __name__ == "__main__":
    main()
