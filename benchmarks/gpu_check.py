"""GPU check (<= 5 minutes on one GPU): the full 26M config in fp32, bf16 and fp16 + scaler.

For each precision: ``minimind_lib.train.train`` on MiniMind2-Small (25.8M params) with the
full profile's micro-batch (32 x 512), a few warm-up steps, then timed steps; reports
tokens/s, MFU against the GPU's datasheet dense peak for that precision (table below, or
``--peak-tflops``) and against a matmul measured in the same run, and peak memory. Also
estimates the full profile's pretraining time at the measured speed. Random tokens (speed
does not depend on their values). Results also go to ``--json`` if given.

Without a CUDA GPU it prints a note and exits 0 (``make bench`` runs every benchmark).

    python benchmarks/gpu_check.py [--steps 20] [--compile] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_bench import matmul_peak_flops, token_file  # noqa: E402

from minimind_lib.data import PretrainDataset  # noqa: E402
from minimind_lib.device import pick_precision  # noqa: E402
from minimind_lib.model import MiniMindForCausalLM  # noqa: E402
from minimind_lib.profiles import get_profile  # noqa: E402
from minimind_lib.train import TrainConfig, flops_per_token, train  # noqa: E402

# dense (no sparsity) peak TFLOP/s: fp32 on CUDA cores (no TF32), bf16/fp16 on tensor cores
# with fp32 accumulation; from NVIDIA's datasheets
PEAKS = {
    "H200": {"fp32": 67, "bf16": 989, "fp16": 989},
    "H100 SXM": {"fp32": 67, "bf16": 989, "fp16": 989},
    "H100 PCIe": {"fp32": 51, "bf16": 756, "fp16": 756},
    "A100": {"fp32": 19.5, "bf16": 312, "fp16": 312},
    "L40S": {"fp32": 91.6, "bf16": 362, "fp16": 362},
    "RTX 4090": {"fp32": 82.6, "bf16": 165, "fp16": 165},
    "RTX 3090": {"fp32": 35.6, "bf16": 71, "fp16": 71},
    "A10": {"fp32": 31.2, "bf16": 125, "fp16": 125},
    "T4": {"fp32": 8.1, "bf16": 0, "fp16": 65},
}


def datasheet_peak(name: str, precision: str) -> float | None:
    for key, peaks in PEAKS.items():
        if all(part in name for part in key.split()):
            return peaks[precision] * 1e12 or None
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "fp16"])
    parser.add_argument("--compile", action="store_true", help="also bf16 with torch.compile")
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU here; nothing measured (run it on a GPU machine)")
        return 0

    device = torch.device("cuda")
    gpu = torch.cuda.get_device_name(0)
    profile = get_profile("full")
    s = profile.pretrain
    fpt = flops_per_token(profile.model, s.seq_len)
    print(f"{gpu}, torch {torch.__version__}, MiniMind2-Small, micro-batch {s.batch_size}x{s.seq_len}")
    runs = [(p, False) for p in args.precisions] + ([("bf16", True)] if args.compile else [])
    results = []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        n_tokens = s.batch_size * (s.seq_len + 1) * (args.warmup + args.steps + 1)
        dataset = PretrainDataset(token_file(Path(tmp), n_tokens, profile.model.vocab_size),
                                  s.seq_len)
        for prec, compiled in runs:
            precision = pick_precision(device, prec)
            torch.manual_seed(0)
            model = MiniMindForCausalLM(profile.model)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            config = TrainConfig.from_stage(s, max_steps=args.warmup + args.steps,
                                            accumulation_steps=1, precision=prec, device="cuda",
                                            compile=compiled, progress=False)
            t0 = time.perf_counter()
            rows = train(model, dataset, config)
            tok_s = statistics.median(r["tokens_per_s"] for r in rows[args.warmup:])
            sheet = args.peak_tflops * 1e12 if args.peak_tflops else datasheet_peak(gpu, prec)
            measured = matmul_peak_flops(device, precision.dtype, n=8192)
            hours = s.max_steps * s.tokens_per_step / tok_s / 3600
            results.append({
                "precision": prec + (" +compile" if compiled else ""), "tokens_per_s": tok_s,
                "mfu_datasheet": fpt * tok_s / sheet if sheet else None,
                "mfu_measured_matmul": fpt * tok_s / measured, "matmul_tflops": measured / 1e12,
                "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
                "final_loss": rows[-1]["loss"], "full_pretrain_hours": hours,
                "wall_s": time.perf_counter() - t0})
            del model
    print(f"\n{'precision':<15}{'tokens/s':>11}{'MFU(sheet)':>11}{'MFU(mm)':>9}{'mm TFLOP/s':>11}"
          f"{'peak GiB':>9}{'full pretrain h':>16}")
    for r in results:
        sheet = f"{r['mfu_datasheet']:.1%}" if r["mfu_datasheet"] is not None else "n/a"
        print(f"{r['precision']:<15}{r['tokens_per_s']:>11,.0f}{sheet:>11}"
              f"{r['mfu_measured_matmul']:>9.1%}{r['matmul_tflops']:>11.1f}"
              f"{r['peak_mem_gib']:>9.2f}{r['full_pretrain_hours']:>16.2f}")
    print(f"\nfull pretrain = {s.max_steps} steps x {s.tokens_per_step:,} tokens at the measured "
          f"speed; total check time {time.perf_counter() - t_all:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"gpu": gpu, "torch": torch.__version__,
                                         "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
