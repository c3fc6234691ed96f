"""Throughput of the training loop vs the data loader alone, and model FLOPs utilisation.

Runs side by side in one process, on a random uint16 token stream (token values do not change
speed): for each model size (the smoke and cpu profiles' configs) and precision (fp32, bf16
autocast), ``minimind_lib.train.train`` for a few steps, and the same DataLoader (same
sampler, batch and window) iterated alone. Prints tokens/s, the loader/loop ratio (the issue
asks >= 10x: the loader must never be the bottleneck) and MFU.

MFU = ``flops_per_token * tokens/s / peak``. The peak is *measured here*: the best of a few
large square matmuls in the same precision (on a CPU the datasheet peak is rarely reachable
and rarely documented); pass ``--peak-tflops`` to use a datasheet figure instead.

    python benchmarks/train_bench.py [--steps 8] [--profiles smoke cpu] [--precisions fp32 bf16]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from minimind_lib.data import PretrainDataset
from minimind_lib.device import pick_device, pick_precision
from minimind_lib.model import MiniMindForCausalLM
from minimind_lib.profiles import get_profile
from minimind_lib.train import StepBatchSampler, TrainConfig, flops_per_token, train


def token_file(directory: Path, n_tokens: int, vocab: int) -> Path:
    path = directory / "train.bin"
    rng = np.random.default_rng(0)
    rng.integers(0, vocab, n_tokens, dtype=np.uint16).tofile(path)
    return path


def matmul_peak_flops(device: torch.device, dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    """Best FLOP/s of an n x n matmul (autocast dtype for bf16/fp16, else fp32)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = 0.0
    for _ in range(reps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return best


def loop_tokens_per_s(model, dataset, config: TrainConfig, warmup: int) -> tuple[float, list[dict]]:
    rows = train(model, dataset, config)
    return statistics.median(r["tokens_per_s"] for r in rows[warmup:]), rows


def loader_tokens_per_s(dataset, config: TrainConfig, batches: int) -> float:
    sampler = StepBatchSampler(len(dataset), batch_size=config.batch_size,
                               accumulation_steps=config.accumulation_steps, world_size=1, rank=0,
                               seed=config.seed, start_step=0, max_steps=batches)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=config.num_workers,
                        generator=torch.Generator())
    t0, tokens = time.perf_counter(), 0
    for batch in loader:
        tokens += batch["input_ids"].numel()
    return tokens / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", default=["smoke", "cpu"])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--steps", type=int, default=8, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed first steps")
    parser.add_argument("--device", default=None)
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="datasheet peak (TFLOP/s) for MFU instead of the measured matmul peak")
    args = parser.parse_args()

    device = pick_device(args.device)
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.profiles:
            profile = get_profile(name)
            s = profile.pretrain
            path = token_file(Path(tmp), s.batch_size * (s.seq_len + 1) * 4 * (args.steps + 4),
                              profile.model.vocab_size)
            dataset = PretrainDataset(path, s.seq_len)
            fpt = flops_per_token(profile.model, s.seq_len)
            for prec in args.precisions:
                precision = pick_precision(device, prec)
                peak = (args.peak_tflops * 1e12 if args.peak_tflops
                        else matmul_peak_flops(device, precision.dtype))
                torch.manual_seed(0)
                model = MiniMindForCausalLM(profile.model)
                config = TrainConfig.from_stage(s, max_steps=args.warmup + args.steps,
                                                accumulation_steps=1, precision=prec,
                                                device=str(device), progress=False)
                loop, _ = loop_tokens_per_s(model, dataset, config, args.warmup)
                loader = loader_tokens_per_s(dataset, config, batches=args.steps * 4)
                rows.append((name, f"{s.batch_size}x{s.seq_len}", prec, loop, loader,
                             loader / loop, fpt * loop / peak, peak))
    print(f"\n{'profile':<8}{'batch':>9}{'prec':>6}{'loop tok/s':>12}{'loader tok/s':>14}"
          f"{'ratio':>8}{'MFU':>7}{'peak TFLOP/s':>14}")
    for name, batch, prec, loop, loader, ratio, mfu, peak in rows:
        print(f"{name:<8}{batch:>9}{prec:>6}{loop:>12,.0f}{loader:>14,.0f}{ratio:>7.0f}x"
              f"{mfu:>7.1%}{peak / 1e12:>14.3f}")
    source = "--peak-tflops" if args.peak_tflops else "best 2048^2 matmul measured in this run"
    print(f"\npeak = {source}; loader = same sampler/batches without the model")
    worst = min(r[5] for r in rows)
    print(f"loader/loop ratio >= 10x: {'yes' if worst >= 10 else 'NO'} (worst {worst:.0f}x)")


if __name__ == "__main__":
    main()
