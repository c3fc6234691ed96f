"""Dense vs mixture of experts at equal *active* parameters (notebook 11).

Three models of the profile's size, identical but for the feed-forward layers, trained on
the bundled pretraining text with the profile's pretraining settings (same seed, same
batches, ``--steps`` optimizer steps each):

* ``dense``: one SwiGLU of width ``I·(k + s)``: as many FFN weights as one MoE token uses
  (``minimind_lib.model.moe.dense_twin``), so the same compute per token;
* ``moe``: MiniMind's MoE, ``E = 4`` routed experts of width ``I``, top-``k = 2``, ``s = 1``
  shared expert, load-balancing loss alpha 0.01 per sequence (MiniMind's defaults);
* ``dense_total``: one SwiGLU of width ``I·(E + s)``: as many weights as the MoE *holds*.

``I`` = the profile's ``intermediate_size / (k + s)``, rounded to a multiple of 64, so the
``dense`` model stays close to the profile's own width.  Reported per model: total and
active parameters, validation loss (eval mode: plain cross-entropy on the held-out split,
fp32) during and after training, and training tokens/s.  Throughput is measured separately,
side by side: the three models take turns for ``--rounds`` rounds of ``--speed-steps``
optimizer steps (the first step of each turn discarded) and each figure is the median, so a
shared CPU's load hits all alike; the ratios are to ``dense``.  The MoE's expert load (share
of routed slots per expert and layer, on a fixed validation batch) is recorded every
``eval_every`` steps.

With ``--out DIR`` it writes ``DIR/moe_vs_dense_<profile>.json`` and ``.png`` (the figures
notebook 11 shows for the cpu profile).

    python benchmarks/moe_bench.py                          # smoke profile, ~1-2 min
    python benchmarks/moe_bench.py --profile cpu --steps 300 --out docs/figures
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from minimind_lib.core.device import FP32, pick_device, seed_everything
from minimind_lib.course.profiles import get_profile
from minimind_lib.data.pretraining import load_pretrain_split, tokenize_corpus
from minimind_lib.data.readers import dataset_files
from minimind_lib.model import MiniMindForCausalLM
from minimind_lib.model.moe import dense_twin, expert_load
from minimind_lib.tokenizer.bpe import COURSE_TOKENIZER_DIR
from minimind_lib.training import TrainConfig, train
from minimind_lib.training.loop import evaluate_loss


def model_configs(base):
    """The three configs compared: {name: MiniMindConfig}."""
    moe = replace(base, use_moe=True, n_routed_experts=4, num_experts_per_tok=2,
                  n_shared_experts=1, aux_loss_alpha=0.01, seq_aux=True)
    per_token = moe.num_experts_per_tok + moe.n_shared_experts
    width = 64 * max(1, round(base.intermediate_size / per_token / 64))
    moe = replace(moe, intermediate_size=width)
    total = moe.n_routed_experts + moe.n_shared_experts
    return {"dense": dense_twin(moe), "moe": moe,
            "dense_total": replace(dense_twin(moe), intermediate_size=width * total)}


def pretrain_splits(profile, seq_len):
    data_dir = tokenize_corpus(dataset_files("pretrain"), COURSE_TOKENIZER_DIR / "tokenizer.json",
                               profile.runs_dir / "bench_data",
                               max_examples=profile.pretrain.max_examples, progress=False)
    return (load_pretrain_split(data_dir, "train", seq_len),
            load_pretrain_split(data_dir, "val", seq_len))


def train_one(name, config, settings, train_set, val_set, seed, device):
    """Train one model; returns its summary row and validation/expert-load curves."""
    seed_everything(seed)
    model = MiniMindForCausalLM(config)
    probe = val_set[0]["input_ids"][None].to(device)  # (1, T+1): a fixed held-out window
    loads = []

    def record_load(row):
        step = row["step"]
        if config.use_moe and (step % settings.eval_every == 0 or step in (1, settings.max_steps)):
            loads.append({"step": row["step"], "load": expert_load(model, probe).tolist()})

    train_config = TrainConfig.from_stage(settings, seed=seed, device=str(device), progress=False)
    t0 = time.perf_counter()
    rows = train(model, train_set, train_config, eval_dataset=val_set, callbacks=[record_load])
    minutes = (time.perf_counter() - t0) / 60
    val_loss = evaluate_loss(model, val_set, batch_size=settings.batch_size, max_batches=10**6,
                             device=device, precision=FP32)
    summary = {"name": name, "intermediate_size": config.intermediate_size,
               "total_params": model.num_parameters(),
               "active_params": model.num_active_parameters(),
               "val_loss": val_loss, "train_loss": rows[-1]["loss"],
               "aux_loss": rows[-1].get("aux_loss"), "train_minutes": minutes,
               "tokens": rows[-1]["tokens"]}
    curve = [{"step": r["step"], "tokens": r["tokens"], "val_loss": r["val_loss"]}
             for r in rows if "val_loss" in r]
    print(f"{name:12s} val loss {val_loss:.4f} after {rows[-1]['tokens']:,} tokens "
          f"({minutes:.1f} min)", flush=True)
    return summary, curve, loads


def throughput(configs, settings, train_set, rounds, steps, seed, device):
    """Median training tokens/s per config, the configs taking turns round by round."""
    speeds = {name: [] for name in configs}
    for _ in range(rounds):
        for name, config in configs.items():
            seed_everything(seed)
            cfg = TrainConfig.from_stage(settings, max_steps=steps + 1, warmup_steps=1,
                                         eval_every=10**6, seed=seed, device=str(device),
                                         progress=False)
            rows = train(MiniMindForCausalLM(config), train_set, cfg)
            speeds[name].append(statistics.median(r["tokens_per_s"] for r in rows[1:]))
    return {name: statistics.median(v) for name, v in speeds.items()}


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for name, curve in result["curves"].items():
        ax.plot([c["tokens"] / 1e6 for c in curve], [c["val_loss"] for c in curve], "o-",
                label=name)
    ax.set(xlabel="training tokens (M)", ylabel="validation loss",
           title=f"dense vs MoE ({result['profile']} profile)")
    ax.legend()
    last = torch.tensor(result["expert_load"][-1]["load"], dtype=torch.float)  # (L, E)
    share = last / last.sum(dim=1, keepdim=True)
    n_layers, n_experts = share.shape
    for layer in range(n_layers):
        bx.bar([e + layer / (n_layers + 1) for e in range(n_experts)], share[layer],
               width=1 / (n_layers + 1), label=f"layer {layer}")
    bx.set_xticks([e + (n_layers - 1) / (2 * (n_layers + 1)) for e in range(n_experts)],
                  [str(e) for e in range(n_experts)])
    bx.axhline(1 / n_experts, color="gray", ls=":", label="even load")
    bx.set(xlabel="expert", ylabel="share of routed slots",
           title=f"MoE expert load at step {result['expert_load'][-1]['step']}")
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="smoke")
    parser.add_argument("--steps", type=int, default=None, help="default: the profile's")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--speed-steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    profile = get_profile(args.profile)
    steps = args.steps or profile.pretrain.max_steps
    settings = replace(profile.pretrain, max_steps=steps, eval_every=max(1, steps // 6),
                       save_every=10**6,
                       warmup_steps=min(profile.pretrain.warmup_steps, steps // 10))
    device = pick_device()
    train_set, val_set = pretrain_splits(profile, settings.seq_len)
    configs = model_configs(profile.model)
    load_before = os.getloadavg()[0]
    summaries, curves = [], {}
    for name, config in configs.items():
        summary, curves[name], loads = train_one(name, config, settings, train_set, val_set,
                                                 profile.seed, device)
        summaries.append(summary)
        if loads:
            expert_loads = loads
    speeds = throughput(configs, settings, train_set, args.rounds, args.speed_steps,
                        profile.seed, device)
    for s in summaries:
        s["tokens_per_s"] = speeds[s["name"]]
        s["speed_vs_dense"] = speeds[s["name"]] / speeds["dense"]
    result = {"profile": profile.name, "steps": steps, "settings": {
        "batch_size": settings.batch_size, "seq_len": settings.seq_len,
        "learning_rate": settings.learning_rate}, "device": str(device),
        "threads": torch.get_num_threads(), "load_average": [load_before, os.getloadavg()[0]],
        "val_windows": len(val_set), "models": summaries, "curves": curves,
        "expert_load": expert_loads}
    print(f"\n{'model':12s} {'FFN width':>9s} {'total':>10s} {'active':>10s} {'val loss':>9s} "
          f"{'tokens/s':>9s} {'vs dense':>8s}")
    for s in summaries:
        print(f"{s['name']:12s} {s['intermediate_size']:9d} {s['total_params']:10,d} "
              f"{s['active_params']:10,d} {s['val_loss']:9.4f} {s['tokens_per_s']:9,.0f} "
              f"{s['speed_vs_dense']:7.2f}x")
    print(f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}; {torch.get_num_threads()} "
          f"torch thread(s); precision auto on {device}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = args.out / f"moe_vs_dense_{profile.name}"
        stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        plot(result, stem.with_suffix(".png"))
        print(f"wrote {stem}.json and .png")
    return result


if __name__ == "__main__":
    main()
