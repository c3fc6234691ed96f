"""How much memory training takes, and where it goes: a model, and a measurement (notebook 04).

Training memory = weights + gradients + optimizer state + **activations** (what the forward
pass keeps for the backward pass) + workspace. The first three are fixed by the parameter
count ``N``: fp32 weights (4N bytes), fp32 gradients (4N) and AdamW's two moments (8N);
under autocast, a 2-byte copy of each weight matrix is cached during the step (2N). The
activations grow with batch x sequence length and are what activation checkpointing
(``model.gradient_checkpointing_enable()``) trades for compute.

``activation_bytes`` counts the activations op by op (the list is in its docstring);
``measure_saved_bytes`` measures them on the real model with PyTorch's saved-tensor hooks, so the
count is checked against what autograd actually keeps (``tests/test_memory.py``), on the CPU.
``training_memory`` adds everything up for a card (docs/benchmarks.md's VRAM table,
``python benchmarks/memory_table.py``).

>>> from minimind_lib.model.config import MiniMindConfig
>>> gib = training_memory(MiniMindConfig(), batch=16, seq_len=512, precision="bf16") / 2**30
>>> 2 < gib < 2.5   # MiniMind2-Small, 16 x 512 tokens per micro-batch, bf16 autocast
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from minimind_lib.model.chunked_loss import DEFAULT_CHUNK_SIZE
from minimind_lib.model.config import MiniMindConfig
from minimind_lib.model.decoder import Block, MiniMindForCausalLM, model_size

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
#: CUDA context, cuBLAS/cuDNN workspaces and the allocator's slack: an assumption (about what
#: PyTorch shows on consumer cards before any tensor), not a measurement of ours.
CUDA_OVERHEAD_BYTES = int(0.6 * 2**30)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes of each part of a training step's peak memory."""

    weights: int
    gradients: int
    optimizer: int
    autocast_copies: int
    activations: int
    overhead: int

    @property
    def total(self) -> int:
        return (self.weights + self.gradients + self.optimizer + self.autocast_copies
                + self.activations + self.overhead)


def activation_bytes(config: MiniMindConfig, batch: int, seq_len: int, precision: str = "fp32",
                     checkpointing: bool = False) -> int:
    """Bytes the forward pass keeps for backward (one micro-batch), counted op by op.

    Per token, with ``C`` = hidden, ``K`` = kv heads x head_dim, ``I`` = intermediate,
    ``H`` = heads, ``V`` = vocabulary. The residual stream and RMSNorm's math are fp32 in
    every precision. Per layer:

    * fp32: each RMSNorm keeps its input and one rsqrt per row (C + 1: ``RMSNormFunction``
      recomputes the normalised x in backward), each linear input is the same fp32 tensor
      (q/k/v share one: C; gate/up share one: C), attention keeps q, k, v, its output and one
      log-sum-exp per head (2C + 2K + H), the MLP keeps gate, up and their product (3I:
      ``SiLUMulFunction`` recomputes silu(gate)): ``(6C + 2K + 3I + H + 2) x 4`` bytes;
    * bf16/fp16 autocast: the norms as above (``2 x (C + 1) x 4``), but each linear casts
      its input to a 2-byte copy of its own (q, k, v: 3C; gate, up: 2C) and everything else
      is 2 bytes (attention ``2C + 2K`` plus the fp32 log-sum-exp ``4H``, MLP ``3I``):
      ``(8C + 8) + 2(5C + 2C + 2K + 3I) + 4H`` bytes;
    * with checkpointing, only the layer's input: ``4C`` bytes.

    Once per token: the token ids (8 bytes) and the final norm (``(C + 1) x 4``). Once per
    scored position (``seq_len - 1`` per sequence: the last has no next token): the chunked
    head's loss (``model.chunked_loss``) keeps the gradient of the head's input (fp32 C, or 2
    bytes per entry under autocast) and the position's index (8 bytes), and no logits (the plain
    path, ``return_logits=True``, would add ``4V``). This is exactly what
    ``measure_saved_bytes`` measures on the CPU (``tests/test_gpu_path.py``; CUDA's fused
    attention keeps the same tensors). The head weight's gradient (V x C) is kept too, once
    per micro-batch, not per token: ``loss_peak_bytes``.

    >>> from minimind_lib.model.config import MiniMindConfig
    >>> full = activation_bytes(MiniMindConfig(), 1, 512)
    >>> checkpointed = activation_bytes(MiniMindConfig(), 1, 512, checkpointing=True)
    >>> round(full / 2**20), round(checkpointed / full, 3)
    (120, 0.083)
    """
    if precision not in DTYPE_BYTES:
        raise ValueError(f"precision must be one of {', '.join(DTYPE_BYTES)}, got {precision!r}")
    c, h = config.hidden_size, config.num_attention_heads
    k = config.num_key_value_heads * config.head_dim
    i = config.intermediate_size
    norms = 2 * (c + 1) * 4
    if checkpointing:
        per_layer = 4 * c
    elif precision == "fp32":
        per_layer = norms + (4 * c + 2 * k + 3 * i + h) * 4  # linear inputs 2C, attention, MLP
    else:
        per_layer = norms + 2 * (5 * c + 2 * c + 2 * k + 3 * i) + 4 * h
    per_token = config.num_hidden_layers * per_layer + (c + 1) * 4 + 8
    per_scored = (4 * c if precision == "fp32" else 2 * c) + 8  # d loss / d hidden, index
    return batch * (seq_len * per_token + (seq_len - 1) * per_scored)


def loss_peak_bytes(config: MiniMindConfig, batch: int, seq_len: int,
                    precision: str = "fp32") -> int:
    """Extra bytes while the chunked head's loss runs (``model.chunked_loss``): one chunk's fp32
    logits (plus their 2-byte copy under autocast) and the head weight's gradient (fp32 V x C
    summed over the chunks, then kept in the matmul's dtype). An estimate, not measured here."""
    v, c = config.vocab_size, config.hidden_size
    rows = min(DEFAULT_CHUNK_SIZE, batch * (seq_len - 1))
    per_row = 4 * v + (0 if precision == "fp32" else 2 * v)
    return rows * per_row + 4 * v * c


def training_memory(config: MiniMindConfig, batch: int, seq_len: int, precision: str = "bf16",
                    checkpointing: bool = False, overhead: int = CUDA_OVERHEAD_BYTES) -> int:
    """Peak bytes of a training step on a GPU (``training_breakdown(...).total``)."""
    return training_breakdown(config, batch, seq_len, precision, checkpointing, overhead).total


def training_breakdown(config: MiniMindConfig, batch: int, seq_len: int,
                       precision: str = "bf16", checkpointing: bool = False,
                       overhead: int = CUDA_OVERHEAD_BYTES) -> MemoryBreakdown:
    """Weights, gradients, AdamW state, autocast weight copies, activations (with what the head's
    loss holds while it runs), overhead: bytes."""
    n = model_size(config)[0]
    copies = 2 * n if precision != "fp32" else 0
    activations = (activation_bytes(config, batch, seq_len, precision, checkpointing)
                   + loss_peak_bytes(config, batch, seq_len, precision))
    return MemoryBreakdown(4 * n, 4 * n, 8 * n, copies, activations, overhead)


def measure_saved_bytes(model: MiniMindForCausalLM, batch: int, seq_len: int, *,
                        precision: torch.dtype | None = None, seed: int = 0) -> int:
    """Bytes autograd keeps between one forward pass (with loss) and its backward, measured.

    Every tensor saved for backward passes through ``torch.autograd.graph.saved_tensors_hooks``;
    each distinct storage is counted once, parameters excluded (they are not activations).
    Activation checkpointing keeps each block's *input* alive outside those hooks (to rerun the
    block in backward), so with checkpointing on, the inputs of the blocks are counted too
    (captured by a forward pre-hook). ``precision``: an autocast dtype (None: fp32).
    """
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def count(t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen.setdefault(storage.data_ptr(), storage.nbytes())

    def pack(t: torch.Tensor) -> torch.Tensor:
        count(t)
        return t

    hooks = []
    if model.model.gradient_checkpointing:
        hooks = [layer.register_forward_pre_hook(_input_counter(count))
                 for layer in model.model.layers]
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq_len), generator=generator)
    model.train()
    device_type = next(model.parameters()).device.type
    try:
        with torch.autocast(device_type, dtype=precision or torch.float32,
                            enabled=precision is not None):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = model(ids, labels=ids).loss
        loss.backward()  # the graph must be complete: check it runs
    finally:
        for hook in hooks:
            hook.remove()
        model.zero_grad(set_to_none=True)
    return sum(seen.values())


def _input_counter(count: Callable[[torch.Tensor], None]):
    def hook(_module: Block, args: tuple) -> None:
        count(args[0])  # the block's input x (B, T, C)
    return hook


def per_sequence(measure: Callable[[int], int]) -> int:
    """Bytes per sequence: ``measure(2) - measure(1)`` (what grows with the batch; constants
    such as the RoPE tables that some ops keep cancel out)."""
    return measure(2) - measure(1)
