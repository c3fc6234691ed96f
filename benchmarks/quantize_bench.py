"""Size and speed of each format of minimind_lib.model.quantize, side by side in one process.

For the cpu-profile model and MiniMind2-Small (random weights: bytes and speed depend on the
shapes, not the values), in fp32, fp16, bf16, int8 (ours, weight-only) and int8 (PyTorch's
dynamic): bytes of the weights, prefill tokens/s (a ``--prompt``-token prompt in one pass) and
decode tokens/s (``--new`` greedy tokens with the KV cache), batch 1. Formats run round robin
(``evaluation.precision.measure_speed``), ``--repeats`` rounds after a warm-up, median reported, so
background load hits every format alike; ratios are to fp32.

Torch runs on ``--threads`` threads (default 1): on a CPU shared with other jobs, OpenMP's
spinning barriers make multi-threaded timings swing by 10x or more.
Usage: ``python benchmarks/quantize_bench.py [--threads T] [--repeats N]`` (about a minute).
Quality (perplexity, exact-match) needs a trained model: see the quantize stage's
``runs/<profile>/quantize/formats.md``.
"""

from __future__ import annotations

import argparse

import torch

from minimind_lib.course.profiles import get_profile
from minimind_lib.evaluation.precision import build_formats, measure_speed
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
from minimind_lib.model.quantize import model_size_bytes


def bench(name: str, config: MiniMindConfig, prompt: int, new: int, repeats: int) -> None:
    torch.manual_seed(0)
    model = MiniMindForCausalLM(config).eval()
    models, skipped = build_formats(model, "cpu")
    ids = torch.randint(0, config.vocab_size, (1, prompt))
    speeds = measure_speed(models, ids, new, repeats)
    base_size, base = model_size_bytes(model), speeds["fp32"]
    print(f"\n{name}: {model.num_parameters():,} parameters, prompt {prompt}, {new} new tokens")
    print(f"{'format':<16}{'MB':>8}{'x fp32':>8}{'prefill tok/s':>15}{'x fp32':>8}"
          f"{'decode tok/s':>14}{'x fp32':>8}")
    for fmt, sp in speeds.items():
        size = model_size_bytes(models[fmt])
        print(f"{fmt:<16}{size / 1e6:>8.2f}{size / base_size:>8.2f}"
              f"{sp.prefill_tokens_per_s:>15,.0f}"
              f"{sp.prefill_tokens_per_s / base.prefill_tokens_per_s:>8.2f}"
              f"{sp.decode_tokens_per_s:>14,.1f}"
              f"{sp.decode_tokens_per_s / base.decode_tokens_per_s:>8.2f}")
    for fmt, why in skipped.items():
        print(f"{fmt:<16}skipped: {why}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), "
          f"quantized engine {torch.backends.quantized.engine}")
    bench("cpu profile", get_profile("cpu").model, args.prompt, args.new, args.repeats)
    bench("MiniMind2-Small (full profile)", MiniMindConfig(), args.prompt, args.new, args.repeats)


if __name__ == "__main__":
    main()
