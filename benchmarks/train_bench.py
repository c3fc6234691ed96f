"""Throughput of the training loop vs the data loader alone, and model FLOPs utilisation.

Runs side by side in one process, on a random uint16 token stream (token values do not change
speed): for each model size (the smoke and cpu profiles' configs) and precision (fp32, bf16
autocast), ``minimind_lib.training.loop.train`` for a few steps, and the same DataLoader (same
sampler, batch and window) iterated alone. Prints tokens/s, the loader/loop ratio (the issue
asks >= 10x: the loader must never be the bottleneck) and MFU.

MFU = ``flops_per_token * tokens/s / peak``. The peak is *measured here*: the best of a few
large square matmuls in the same precision (on a CPU the datasheet peak is rarely reachable
and rarely documented); pass ``--peak-tflops`` to use a datasheet figure instead.

The configurations take turns for ``--rounds`` rounds and each figure is the median over
rounds, so a noisy shared CPU hits all of them alike. Torch uses ``--threads`` threads
(default 1: on a CPU shared with other jobs, OpenMP's spinning barriers make multi-threaded
timings swing by 10x; use ``--threads 0`` for torch's default on a quiet machine).

    python benchmarks/train_bench.py [--rounds 3] [--steps 4] [--threads 1]
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

from minimind_lib.core.device import pick_device, pick_precision
from minimind_lib.course.profiles import get_profile
from minimind_lib.data.pretraining import PretrainDataset
from minimind_lib.model import MiniMindForCausalLM
from minimind_lib.training import TrainConfig, train
from minimind_lib.training.loop import flops_per_token
from minimind_lib.training.sampling import StepBatchSampler


def token_file(directory: Path, n_tokens: int, vocab: int) -> Path:
    path = directory / "train.bin"
    rng = np.random.default_rng(0)
    rng.integers(0, vocab, n_tokens, dtype=np.uint16).tofile(path)
    return path


def matmul_peak_flops(device: torch.device, dtype: torch.dtype, n: int = 2048,
                      reps: int = 5) -> float:
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


def loop_tokens_per_s(model, dataset, config: TrainConfig, warmup: int) -> float:
    rows = train(model, dataset, config)
    return statistics.median(r["tokens_per_s"] for r in rows[warmup:])


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


def activation_mib(model: torch.nn.Module, input_ids: torch.Tensor, precision) -> float:
    """MiB of tensors autograd saves for backward in one forward pass (weights excluded)."""
    weights = {p.data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in weights:
            saved[t.data_ptr()] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with precision.context(input_ids.device):
            model(input_ids, labels=input_ids)
    return sum(saved.values()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", default=["smoke", "cpu"])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="timed optimizer steps per round")
    parser.add_argument("--warmup", type=int, default=1, help="untimed first steps per round")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="datasheet peak (TFLOP/s) for MFU instead of the measured matmul peak")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    device = pick_device(args.device)
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    configs = [(name, prec) for name in args.profiles for prec in args.precisions]
    samples: dict[tuple[str, str], dict[str, list[float]]] = {
        c: {"loop": [], "loader": [], "peak": []} for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        datasets = {}
        for name in args.profiles:
            p = get_profile(name)
            n_tokens = p.pretrain.batch_size * (p.pretrain.seq_len + 1) * 4 * (args.steps + 4)
            directory = Path(tmp) / name
            directory.mkdir()
            datasets[name] = PretrainDataset(token_file(directory, n_tokens, p.model.vocab_size),
                                             p.pretrain.seq_len)
        for _ in range(args.rounds):
            for name, prec in configs:
                s = get_profile(name).pretrain
                precision = pick_precision(device, prec)
                torch.manual_seed(0)
                model = MiniMindForCausalLM(get_profile(name).model)
                config = TrainConfig.from_stage(s, max_steps=args.warmup + args.steps,
                                                accumulation_steps=1, precision=prec,
                                                device=str(device), progress=False)
                got = samples[(name, prec)]
                got["loop"].append(loop_tokens_per_s(model, datasets[name], config, args.warmup))
                got["loader"].append(loader_tokens_per_s(datasets[name], config, args.steps * 4))
                got["peak"].append(args.peak_tflops * 1e12 if args.peak_tflops
                                   else matmul_peak_flops(device, precision.dtype))

    print(f"\n{'profile':<8}{'batch':>9}{'prec':>6}{'loop tok/s':>12}{'loader tok/s':>14}"
          f"{'ratio':>8}{'MFU':>7}{'peak TFLOP/s':>14}")
    ratios = []
    for name, prec in configs:
        s, p = get_profile(name).pretrain, get_profile(name)
        got = {k: statistics.median(v) if k != "peak" else max(v)
               for k, v in samples[(name, prec)].items()}
        ratio = got["loader"] / got["loop"]
        ratios.append(ratio)
        mfu = flops_per_token(p.model, s.seq_len) * got["loop"] / got["peak"]
        print(f"{name:<8}{f'{s.batch_size}x{s.seq_len}':>9}{prec:>6}{got['loop']:>12,.0f}"
              f"{got['loader']:>14,.0f}{ratio:>7.0f}x{mfu:>7.1%}{got['peak'] / 1e12:>14.3f}")
    source = "--peak-tflops" if args.peak_tflops else "best 2048^2 matmul measured in this run"
    print(f"\nmedians over {args.rounds} rounds; peak = {source}; "
          "loader = same sampler/batches without the model")
    print(f"loader/loop ratio >= 10x: {'yes' if min(ratios) >= 10 else 'NO'} "
          f"(worst {min(ratios):.0f}x)")

    # the memory side of the AMP claim: activations saved for backward, per sequence
    print(f"\n{'config':<8}{'seq':>5}{'fp32 MiB/seq':>14}{'bf16 MiB/seq':>14}{'bf16/fp32':>11}")
    for name in ("smoke", "cpu", "full"):
        p = get_profile(name)
        torch.manual_seed(0)
        model = MiniMindForCausalLM(p.model).to(device)
        ids = torch.randint(0, p.model.vocab_size, (2, p.pretrain.seq_len + 1), device=device)
        fp32, bf16 = (activation_mib(model, ids, pick_precision(device, x)) / 2
                      for x in ("fp32", "bf16"))
        print(f"{name:<8}{p.pretrain.seq_len:>5}{fp32:>14.1f}{bf16:>14.1f}{bf16 / fp32:>11.2f}")


if __name__ == "__main__":
    main()
