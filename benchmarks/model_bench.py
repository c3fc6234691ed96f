"""Speed of minimind_lib.model, measured side by side with transformers in one process.

1. training step (forward + backward + AdamW) vs ``LlamaForCausalLM`` (sdpa) on the same
   config, weights and batch;
2. ``generate`` of 256 tokens with vs without the KV cache (cpu-profile model: without a
   cache the 25.8M model would take minutes);
3. our ``generate`` vs transformers' ``generate`` (greedy, cache on, same weights), on the
   cpu-profile model and on MiniMind2-Small.

Runs alternate between the sides (A B B A ...) and report the median, so a noisy shared
CPU hits both alike.  Torch runs on ``--threads`` threads (default 1): on a CPU shared with
other jobs, OpenMP's spinning thread barriers make multi-threaded timings swing by 10x.
``--clock cpu`` (default) times the process's CPU time, which other jobs on the machine do
not inflate; ``--clock wall`` times elapsed time (the same thing on an idle machine).
Usage: ``python benchmarks/model_bench.py [--reps N] [--threads T] [--clock cpu|wall]``
(about 1-2 min of CPU time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from minimind_lib.course.profiles import get_profile  # noqa: E402
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM  # noqa: E402
from minimind_lib.model.hf import to_hf  # noqa: E402

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]


def alternate(fns: dict[str, Callable[[], object]], reps: int, warmup: bool = True
              ) -> dict[str, float]:
    """Median seconds per call of each function, calls interleaved in A B B A order (after
    one warm-up call each, unless ``warmup`` is False)."""
    for fn in fns.values() if warmup else ():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns.items())
    for rep in range(reps):
        for name, fn in order if rep % 2 == 0 else reversed(order):
            start = clock()
            fn()
            times[name].append(clock() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def train_step_fn(model: torch.nn.Module, ids: torch.Tensor) -> Callable[[], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def bench_training(name: str, config: MiniMindConfig, batch: int, seq: int, reps: int) -> None:
    torch.manual_seed(0)
    ours = MiniMindForCausalLM(config).train()
    theirs = to_hf(ours, attn_implementation="sdpa").train()
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    t = alternate({"ours": train_step_fn(ours, ids), "hf": train_step_fn(theirs, ids)}, reps)
    tokens = batch * seq
    print(f"training step, {name} ({ours.num_parameters() / 1e6:.1f}M params), "
          f"batch {batch}x{seq}, fp32:")
    print(f"  ours {t['ours'] * 1e3:7.0f} ms/step ({tokens / t['ours']:6.0f} tok/s)   "
          f"HF Llama {t['hf'] * 1e3:7.0f} ms/step ({tokens / t['hf']:6.0f} tok/s)   "
          f"speed ours/HF = {t['hf'] / t['ours']:.2f}x")


def bench_generation(name: str, config: MiniMindConfig, new_tokens: int, reps: int,
                     with_no_cache: bool) -> None:
    torch.manual_seed(0)
    ours = MiniMindForCausalLM(config).eval()
    theirs = to_hf(ours, attn_implementation="sdpa").eval()
    prompt = torch.randint(3, config.vocab_size, (1, 16))
    variants = {
        "cache": lambda n: ours.generate(prompt, n, temperature=0),
        "no_cache": lambda n: ours.generate(prompt, n, temperature=0, use_cache=False),
        "hf": lambda n: theirs.generate(prompt, max_new_tokens=n, do_sample=False,
                                        eos_token_id=None, pad_token_id=0),
    }
    if not with_no_cache:
        del variants["no_cache"]
    outs: dict[str, torch.Tensor] = {}
    for fn in variants.values():  # short warm-up: first calls pay one-off costs
        fn(8)

    def timed(key: str) -> Callable[[], None]:
        def call() -> None:
            outs[key] = variants[key](new_tokens)
        return call

    t = alternate({key: timed(key) for key in variants}, reps, warmup=False)
    same = all(torch.equal(outs["cache"], out) for out in outs.values())
    print(f"generation of {new_tokens} tokens, {name} ({ours.num_parameters() / 1e6:.1f}M), "
          "prompt 16, greedy, batch 1:")
    labels = {"cache": "ours, KV cache", "no_cache": "ours, no cache", "hf": "HF generate (cache)"}
    for key in variants:
        print(f"  {labels[key]:20s} {t[key]:6.2f} s  ({new_tokens / t[key]:6.1f} tok/s)")
    if with_no_cache:
        print(f"  KV cache speed-up (no cache / cache) = {t['no_cache'] / t['cache']:.2f}x")
    print(f"  ours vs HF generate speed (HF / ours) = {t['hf'] / t['cache']:.2f}x")
    print(f"  identical tokens in all variants: {same}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions per side")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                        help="cpu: this process's CPU time; wall: elapsed time")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.clock} clock")
    bench_training("cpu profile", get_profile("cpu").model, 8, 256, args.reps)
    bench_training("MiniMind2-Small", MiniMindConfig(), 2, 256, args.reps)
    bench_generation("cpu profile", get_profile("cpu").model, 256, args.reps, with_no_cache=True)
    bench_generation("MiniMind2-Small", MiniMindConfig(), 256, args.reps, with_no_cache=False)


if __name__ == "__main__":
    main()
