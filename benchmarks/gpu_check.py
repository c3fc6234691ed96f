"""GPU check, one prepared script (about 5 minutes on one GPU): what the GPU path promises.

1. **Speed and memory** of MiniMind2-Small with ``minimind_lib.training.loop.train``, per row: the
   gpu profile's micro-batch (16 x 512) in fp32, bf16, fp16 + GradScaler, bf16 + torch.compile,
   bf16 + activation checkpointing; the full profile's (32 x 512) in bf16 and bf16 + compile.
   Tokens/s (median of the timed steps), MFU against the datasheet's dense peak (``--gpu-tflops``
   overrides) and against a matmul measured here, peak memory next to
   ``minimind_lib.training.memory``'s prediction. Random tokens (speed does not depend on their
   values).
2. **The seed blog's AMP claims**, measured: bf16 / fp16 speed-up over fp32, and memory saved.
3. **200 real steps** of the gpu profile on the bundled pretraining text: loss at the start and
   the end, validation loss, tokens/s, and the profile's planned time at that speed.
4. **Decode**: greedy tokens/s of one prompt and of 32 in one batch (continuous batching),
   eager and ``torch.compile``d (``serve --compile``), same tokens checked.

Without a CUDA GPU it prints a note and exits 0 (``make bench`` runs every benchmark);
``--dry-run`` runs every part with a tiny model on the CPU (the test suite does, so the script
stays runnable). ``--json FILE`` writes every figure.

    python benchmarks/gpu_check.py [--steps 20] [--real-steps 200] [--json gpu_check.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_bench import matmul_peak_flops, token_file  # noqa: E402

from minimind_lib.core.device import pick_precision  # noqa: E402
from minimind_lib.course.plan import GPU_TFLOPS  # noqa: E402
from minimind_lib.course.profiles import get_profile  # noqa: E402
from minimind_lib.data.pretraining import PretrainDataset, load_pretrain_split, tokenize_corpus
from minimind_lib.data.readers import dataset_files
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM  # noqa: E402
from minimind_lib.tokenizer.bpe import COURSE_TOKENIZER  # noqa: E402
from minimind_lib.training import TrainConfig, train  # noqa: E402
from minimind_lib.training.loop import flops_per_token
from minimind_lib.training.memory import training_breakdown  # noqa: E402

# dense peak TFLOP/s (no sparsity): fp32 on CUDA cores, bf16/fp16 tensor cores with fp32
# accumulation, from NVIDIA's datasheets; names are matched as substrings of the device name
PEAKS = {"H200": (67, 989), "H100": (67, 989), "A100": (19.5, 312), "L40S": (91.6, 362),
         "RTX 4090": (82.6, 165.2), "RTX 3090": (35.6, 71), "RTX 4060": (15.1, 30.2),
         "RTX 3060": (12.7, 25.4), "A10": (31.2, 125), "T4": (8.1, 65)}
#: (label, profile, precision, compile, checkpointing)
ROWS = [("gpu fp32", "gpu", "fp32", False, False), ("gpu bf16", "gpu", "bf16", False, False),
        ("gpu fp16+scaler", "gpu", "fp16", False, False),
        ("gpu bf16+compile", "gpu", "bf16", True, False),
        ("gpu bf16+ckpt", "gpu", "bf16", False, True),
        ("full bf16", "full", "bf16", False, False),
        ("full bf16+compile", "full", "bf16", True, False)]


def datasheet_peak(name: str, precision: str) -> float | None:
    for key, (fp32, half) in PEAKS.items():
        if key in name:
            return (fp32 if precision == "fp32" else half) * 1e12
    return None


def speed_row(label: str, profile_name: str, precision: str, compiled: bool, ckpt: bool,
              args: argparse.Namespace, device: torch.device, model_config: MiniMindConfig,
              tmp: Path) -> dict:
    s = get_profile(profile_name).pretrain
    batch = s.batch_size if not args.dry_run else 2
    seq = s.seq_len if not args.dry_run else 32
    steps = args.warmup + args.steps
    data = PretrainDataset(token_file(tmp, batch * (seq + 1) * (steps + 1),
                                      model_config.vocab_size), seq)
    torch.manual_seed(0)
    model = MiniMindForCausalLM(model_config)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    config = TrainConfig(batch_size=batch, seq_len=seq, max_steps=steps, learning_rate=3e-4,
                         warmup_steps=1, precision=precision, device=device.type,
                         compile=compiled, gradient_checkpointing=ckpt, progress=False)
    t0 = time.perf_counter()
    rows = train(model, data, config)
    tok_s = statistics.median(r["tokens_per_s"] for r in rows[args.warmup:])
    fpt = flops_per_token(model_config, seq)
    sheet = args.gpu_tflops * 1e12 if args.gpu_tflops else datasheet_peak(args.gpu_name, precision)
    measured = matmul_peak_flops(device, pick_precision(device, precision).dtype,
                                 n=8192 if device.type == "cuda" else 256)
    predicted = training_breakdown(model_config, batch, seq,
                                   "fp32" if precision == "fp32" else "bf16", ckpt)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    return {"row": label, "batch": batch, "seq_len": seq, "tokens_per_s": tok_s,
            "mfu_datasheet": fpt * tok_s / sheet if sheet else None,
            "mfu_measured_matmul": fpt * tok_s / measured, "matmul_tflops": measured / 1e12,
            "peak_mem_gib": peak / 2**30 if peak is not None else None,
            "predicted_gib": (predicted.total - predicted.overhead) / 2**30,
            "final_loss": rows[-1]["loss"], "wall_s": time.perf_counter() - t0}


def real_steps(args: argparse.Namespace, device: torch.device, model_config: MiniMindConfig,
               tmp: Path) -> dict:
    """The gpu profile's settings for ``--real-steps`` steps on the bundled pretraining text."""
    profile = get_profile("gpu")
    s = replace(profile.pretrain, max_steps=args.real_steps, epochs=None,
                eval_every=max(1, args.real_steps // 4))
    if args.dry_run:
        s = replace(s, batch_size=2, seq_len=32)
    data_dir = tokenize_corpus(dataset_files("pretrain"), COURSE_TOKENIZER, tmp / "data",
                               max_examples=200 if args.dry_run else None, progress=False)
    train_set = load_pretrain_split(data_dir, "train", s.seq_len)
    val_set = load_pretrain_split(data_dir, "val", s.seq_len)
    torch.manual_seed(profile.seed)
    model = MiniMindForCausalLM(model_config)
    config = TrainConfig.from_stage(s, precision="auto", device=device.type, seed=profile.seed,
                                    progress=False)
    rows = train(model, train_set, config, eval_dataset=val_set)
    tok_s = statistics.median(r["tokens_per_s"] for r in rows[3:] or rows)
    planned = profile.pretrain.planned_steps(len(train_set)) * profile.pretrain.tokens_per_step
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    return {"steps": len(rows), "loss_first": rows[0]["loss"], "loss_last": rows[-1]["loss"],
            "val_loss": val, "tokens_per_s": tok_s,
            "gpu_profile_pretrain_minutes": planned / tok_s / 60}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per row")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--real-steps", type=int, default=200)
    parser.add_argument("--gpu-tflops", type=float, default=None, help="dense bf16 peak")
    parser.add_argument("--dry-run", action="store_true", help="tiny model on the CPU")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.dry_run:
        device, args.gpu_name = torch.device("cpu"), "CPU (dry run)"
        model_config = MiniMindConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2)
        args.steps, args.warmup, args.real_steps = 2, 1, 4
    elif not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU here; nothing measured (run it on a GPU machine)")
        return 0
    else:
        device, args.gpu_name = torch.device("cuda"), torch.cuda.get_device_name(0)
        model_config = MiniMindConfig()
    print(f"{args.gpu_name}, torch {torch.__version__}; datasheet bf16 TFLOP/s used by plan.py: "
          f"{GPU_TFLOPS}")
    t_all = time.perf_counter()
    print("| row | micro-batch | tokens/s | MFU (datasheet) | MFU (matmul measured) | peak GiB | "
          "model GiB (no overhead) | final loss |\n|---|---|---|---|---|---|---|---|")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, profile_name, precision, compiled, ckpt in ROWS:
            if compiled and args.dry_run:
                continue  # compiling needs a C++ toolchain and minutes on a CPU
            rows.append(speed_row(label, profile_name, precision, compiled, ckpt, args, device,
                                  model_config, Path(tmp)))
            print_row(rows[-1])
        real = real_steps(args, device, model_config, Path(tmp))
    decode = decode_rows(args, device, model_config)
    report(rows, real, time.perf_counter() - t_all)
    if args.json:
        args.json.write_text(json.dumps({"gpu": args.gpu_name, "torch": torch.__version__,
                                         "rows": rows, "real": real, "decode": decode},
                                        indent=2))
    return 0


def decode_rows(args: argparse.Namespace, device: torch.device,
                model_config: MiniMindConfig) -> list[dict]:
    """Greedy decode tokens/s, bf16 (fp32 on the dry run): one prompt and 32 prompts of
    different lengths in one batch (``generate_many``), eager and through ``compile_decoder``
    (``serve --compile``); the same tokens either way (checked)."""
    from minimind_lib.model.generation import compile_decoder, generate_many

    dtype = torch.float32 if args.dry_run else torch.bfloat16
    torch.manual_seed(0)
    eager = MiniMindForCausalLM(model_config).to(device, dtype).eval()
    new = 16 if args.dry_run else 256
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, model_config.vocab_size, (int(n),), generator=g).tolist()
               for n in torch.randint(16, 128, (32,), generator=g)]
    variants = [("eager", eager)]
    if not args.dry_run:  # compiling needs minutes on a CPU
        variants.append(("compiled", compile_decoder(MiniMindForCausalLM(model_config).to(
            device, dtype).eval())))
        variants[1][1].load_state_dict(eager.state_dict())
    print("\n| decode | prompts | new tokens | tokens/s |\n|---|---|---|---|")
    rows, answers = [], {}
    for name, model in variants:
        for batch in (1, 32):
            generate_many(model, prompts[:batch], 8, batch_size=batch)  # warm-up (compiles)
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = generate_many(model, prompts[:batch], new, batch_size=batch)
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            answers[name, batch] = out
            rows.append({"row": f"{name}, batch {batch}", "prompts": batch, "new": new,
                         "tokens_per_s": sum(map(len, out)) / seconds})
            print(f"| {name} | {batch} | {new} | {rows[-1]['tokens_per_s']:,.0f} |", flush=True)
    if len(variants) > 1:
        print("compiled decode gives the eager tokens:",
              all(answers["compiled", b] == answers["eager", b] for b in (1, 32)))
    return rows


def print_row(r: dict) -> None:
    sheet = f"{r['mfu_datasheet']:.1%}" if r["mfu_datasheet"] is not None else "n/a"
    peak = f"{r['peak_mem_gib']:.2f}" if r["peak_mem_gib"] is not None else "n/a"
    print(f"| {r['row']} | {r['batch']}x{r['seq_len']} | {r['tokens_per_s']:,.0f} | {sheet} | "
          f"{r['mfu_measured_matmul']:.1%} | {peak} | {r['predicted_gib']:.2f} | "
          f"{r['final_loss']:.3f} |", flush=True)


def report(rows: list[dict], real: dict, seconds: float) -> None:
    by = {r["row"]: r for r in rows}
    base = by.get("gpu fp32")
    for name in ("gpu bf16", "gpu fp16+scaler"):
        if base and name in by:
            r = by[name]
            mem = (f", peak memory {r['peak_mem_gib'] / base['peak_mem_gib']:.2f}x fp32's"
                   if r["peak_mem_gib"] and base["peak_mem_gib"] else "")
            print(f"AMP claim, measured: {name} runs "
                  f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x fp32's tokens/s{mem}")
    print(f"\n{real['steps']} real steps of the gpu profile: loss {real['loss_first']:.3f} -> "
          f"{real['loss_last']:.3f}, validation {[round(v, 3) for v in real['val_loss']]}, "
          f"{real['tokens_per_s']:,.0f} tokens/s -> the gpu profile's pretraining on the bundled "
          f"data takes {real['gpu_profile_pretrain_minutes']:.1f} min here")
    print(f"total check time {seconds:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
