"""The two per-token layers of a block (notebook 03): ``RMSNorm`` (Zhang & Sennrich 2019) and
the SwiGLU feed-forward ``FeedForward`` (Shazeer 2020), ``down(silu(gate(x)) * up(x))``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minimind_lib.model.config import MiniMindConfig

# --------------------------------------------------------------------------- building blocks


class RMSNorm(nn.Module):
    """Root-mean-square LayerNorm (Zhang & Sennrich 2019, eq. 4): ``x / rms(x) * g``.

    No mean subtraction and no bias.  Computed in fp32 even under bf16/fp16 autocast
    (the mean of squares overflows / loses precision in half types), then cast back.
    Built in notebook 03.

    >>> norm = RMSNorm(4)
    >>> norm(torch.tensor([[2.0, -2.0, 2.0, -2.0]]))
    tensor([[ 1.0000, -1.0000,  1.0000, -1.0000]], grad_fn=<MulBackward0>)
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.float()  # (..., C) in fp32
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        # subtle: cast back BEFORE scaling by the weight, as Llama does, so logits match HF's.
        return self.weight * x.to(dtype)


class FeedForward(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020, eq. 6): ``down(silu(gate(x)) * up(x))``.

    >>> ffn = FeedForward(MiniMindConfig())
    >>> ffn.gate_proj.weight.shape   # intermediate 1408 = 64 * ceil(int(512 * 8 / 3) / 64)
    torch.Size([1408, 512])
    """

    def __init__(self, config: MiniMindConfig) -> None:
        super().__init__()
        c, h = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(c, h, bias=False)
        self.up_proj = nn.Linear(c, h, bias=False)
        self.down_proj = nn.Linear(h, c, bias=False)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        # (B, T, C)
        return self.dropout(self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)))
