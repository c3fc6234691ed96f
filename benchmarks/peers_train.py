"""Training memory and speed of MiniMind2-Small against transformers' Llama (and MiniMind's own).

The ``train`` section of ``benchmarks/peers.py`` (issue 32): at MiniMind2-Small's size (hidden
512, 8 layers, vocabulary 6,400), batches of ``BATCHES`` x ``SEQ_LEN`` tokens, fp32, one thread:

1. the bytes autograd keeps between one training forward with labels and its backward: every
   tensor saved for backward passes through ``torch.autograd.graph.saved_tensors_hooks``, each
   storage counted once (by its ``data_ptr``), parameters and buffers excluded (they are not
   activations; our RoPE tables are buffers, Llama recomputes its cos/sin every forward and
   they count). Ours takes the chunked head + loss (``minimind_lib.model.chunked_loss``) and
   keeps no logits; ``LlamaForCausalLM`` keeps their fp32 log-softmax (B*T x V). Ours' RMSNorm
   and SwiGLU gating keep only their inputs and recompute each norm's normalised x and
   silu(gate) in backward (``minimind_lib.model.layers``); Llama keeps them;
2. a training step (forward, backward, AdamW) of each, in alternating rounds (A B B A ...),
   the median of the process's CPU time (which other jobs on a shared machine do not inflate).

Ours and Llama run the same weights (``minimind_lib.model.hf.to_hf``, sdpa attention) on the
same batch; their losses are checked equal first. ``ours, checkpointing`` is ours with
activation checkpointing (``gradient_checkpointing_enable``): the memory it saves and the
compute it costs, for scale. With a checkout of jingyaogong/minimind
(``minimind_dir``) its ``model/model_minimind.py`` is measured too, built at the same size
with our weights where the names match (today's MiniMind adds QK-norm, left at its init).

Usage: ``python benchmarks/peers_train.py [--reps N] [--minimind-dir PATH]`` (about 1 min of
CPU time at 3 reps); ``peers.py`` calls ``train_section``.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # model_bench
from model_bench import train_step_fn  # noqa: E402

from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM  # noqa: E402
from minimind_lib.model.hf import to_hf  # noqa: E402

BATCHES, SEQ_LEN = (2, 4), 512


def load() -> str:
    return "load average " + " ".join(open("/proc/loadavg").read().split()[:3])


def saved_bytes(model: nn.Module, ids: torch.Tensor) -> int:
    """Bytes autograd keeps for backward during ``model(ids, labels=ids)``: distinct storages,
    parameters and buffers excluded. Runs the backward too (the graph must be whole), then
    clears the gradients."""
    params = {t.untyped_storage().data_ptr()
              for t in (*model.parameters(), *model.buffers())}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(ids, labels=ids).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(seen.values())


def alternate(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median CPU seconds per call of each function: one warm-up call each, then ``reps``
    rounds in A B B A order."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns.items())
    for rep in range(reps):
        for name, fn in order if rep % 2 == 0 else reversed(order):
            start = time.process_time()
            fn()
            times[name].append(time.process_time() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def minimind_model(minimind_dir: str | None, ours: MiniMindForCausalLM) -> nn.Module | str:
    """MiniMind's own ``MiniMindForCausalLM`` at our size with our weights, or why not."""
    if minimind_dir is None:
        return "no MiniMind checkout given (--minimind-dir)"
    path = Path(minimind_dir) / "model" / "model_minimind.py"
    if not path.is_file():
        return f"{path} not found"
    spec = importlib.util.spec_from_file_location("model_minimind", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["model_minimind"] = module
    spec.loader.exec_module(module)
    c = ours.config
    config = module.MiniMindConfig(
        hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
        intermediate_size=c.intermediate_size, vocab_size=c.vocab_size,
        rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
        max_position_embeddings=c.max_position_embeddings)
    theirs = module.MiniMindForCausalLM(config)
    missing, unexpected = theirs.load_state_dict(ours.state_dict(), strict=False)
    if unexpected or any("norm" not in key for key in missing):
        return f"weights do not fit: missing {missing[:3]}, unexpected {unexpected[:3]}"
    return theirs.train()


def train_section(reps: int, minimind_dir: str | None) -> None:
    """Print saved bytes and step times, ours against Llama (and MiniMind's own), and ratios."""
    torch.manual_seed(0)
    ours = MiniMindForCausalLM(MiniMindConfig()).train()
    models: dict[str, nn.Module] = {
        "ours": ours, "hf": to_hf(ours, attn_implementation="sdpa").train(),
        "ours, checkpointing": copy.deepcopy(ours).gradient_checkpointing_enable()}
    peer = minimind_model(minimind_dir, ours)
    if isinstance(peer, str):
        print(f"  MiniMind's own model skipped: {peer}")
    else:
        models["minimind"] = peer
    for batch in BATCHES:
        ids = torch.randint(0, ours.config.vocab_size, (batch, SEQ_LEN),
                            generator=torch.Generator().manual_seed(0))
        compare(models, ids, reps)


def compare(models: dict[str, nn.Module], ids: torch.Tensor, reps: int) -> None:
    """The losses (checked), saved bytes and step times of ``models`` on ``ids``; ratios."""
    print(f"training, MiniMind2-Small ({models['ours'].num_parameters() / 1e6:.1f}M params), "
          f"batch {ids.shape[0]} x {ids.shape[1]}, fp32, {torch.get_num_threads()} thread(s); "
          f"{load()}")
    with torch.no_grad():
        losses = {name: model(ids, labels=ids).loss.item() for name, model in models.items()}
    if abs(losses["ours"] - losses["hf"]) > 1e-4:  # fp32, the same weights: rounding only
        raise AssertionError(f"ours and Llama disagree on the loss: {losses}")
    print("  loss " + ", ".join(f"{name} {loss:.5f}" for name, loss in losses.items()))
    saved = {name: saved_bytes(model, ids) for name, model in models.items()}
    print("  saved for backward: " + ", ".join(f"{name} {b / 2**20:.1f} MiB"
                                              for name, b in saved.items()))
    steps = alternate({name: train_step_fn(model, ids) for name, model in models.items()}, reps)
    print("  step (median of " + str(reps) + "): " + ", ".join(
        f"{name} {t * 1e3:.0f} ms" for name, t in steps.items()))
    print(f"  saved bytes ours / HF = {saved['ours'] / saved['hf']:.2f}x   "
          f"speed ours vs HF (HF time / ours) = {steps['hf'] / steps['ours']:.2f}x")
    for name in models:
        if name not in ("ours", "hf"):
            print(f"  {name}: saved bytes / HF = {saved[name] / saved['hf']:.2f}x   "
                  f"speed vs HF = {steps['hf'] / steps[name]:.2f}x")
    print(f"  {load()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="timed rounds per side")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--minimind-dir", default=None,
                        help="a checkout of jingyaogong/minimind (optional)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train_section(args.reps, args.minimind_dir)


if __name__ == "__main__":
    main()
