"""Training memory of MiniMind2-Small on a GPU, from the memory model
(``minimind_lib.training.memory``).

The activation term is the one ``tests/test_memory.py`` checks byte for byte against what
autograd keeps on the CPU (saved-tensor hooks); weights, gradients, AdamW state and autocast
weight copies follow from the parameter count; the logits' gradient at the start of backward
and the CUDA context / workspace overhead (0.6 GiB) are estimates. Prints GiB per micro-batch
size, and the largest micro-batch (a power of two) that fits 8, 12 and 24 GB cards.

    python benchmarks/memory_table.py [--seq-len 512] [--markdown]
"""

from __future__ import annotations

import argparse

from minimind_lib.model import MiniMindConfig
from minimind_lib.training.memory import CUDA_OVERHEAD_BYTES, training_breakdown

BATCHES = (4, 8, 16, 32, 64)
CARDS_GB = (8, 12, 24)


def largest_batch(config: MiniMindConfig, seq_len: int, precision: str, checkpointing: bool,
                  card_gb: int) -> int | None:
    fitting = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)
               if training_breakdown(config, b, seq_len, precision, checkpointing).total
               <= card_gb * 10**9]
    return max(fitting) if fitting else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-len", type=int, default=512)
    args = parser.parse_args()
    config = MiniMindConfig()
    head = (["precision", "checkpointing"] + [f"batch {b} (GiB)" for b in BATCHES]
            + [f"max batch {g} GB" for g in CARDS_GB])
    print(f"MiniMind2-Small, seq_len {args.seq_len}, AdamW, overhead "
          f"{CUDA_OVERHEAD_BYTES / 2**30:.1f} GiB assumed\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for precision in ("fp32", "bf16"):
        for ckpt in (False, True):
            gib = [training_breakdown(config, b, args.seq_len, precision, ckpt).total / 2**30
                   for b in BATCHES]
            fit = [largest_batch(config, args.seq_len, precision, ckpt, g) for g in CARDS_GB]
            print(f"| {precision} | {'yes' if ckpt else 'no'} | "
                  + " | ".join(f"{x:.2f}" for x in gib) + " | "
                  + " | ".join(str(f) if f else "-" for f in fit) + " |")
    b = training_breakdown(config, 16, args.seq_len, "bf16")
    print(f"\nbf16, batch 16: weights {b.weights / 2**20:.0f} MiB, gradients "
          f"{b.gradients / 2**20:.0f}, AdamW {b.optimizer / 2**20:.0f}, autocast copies "
          f"{b.autocast_copies / 2**20:.0f}, activations {b.activations / 2**20:.0f}, overhead "
          f"{b.overhead / 2**20:.0f}")


if __name__ == "__main__":
    main()
