"""The two per-token layers of a block (notebook 03): ``RMSNorm`` (Zhang & Sennrich 2019) and
the SwiGLU feed-forward ``FeedForward`` (Shazeer 2020), ``down(silu(gate(x)) * up(x))``.

Both run their elementwise maths through a ``torch.autograd.Function`` with a hand-written
backward (``RMSNormFunction``, ``SiLUMulFunction``): the forward is the same ops as the
plain expressions, but autograd keeps only the inputs, and the backward recomputes the cheap
intermediates (``x / rms(x)``, ``silu(gate)``) instead of keeping them for every token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minimind_lib.model.config import MiniMindConfig

# --------------------------------------------------------------------------- building blocks


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``weight * (x / rms(x))`` (..., C) and the per-row ``1 / rms`` (..., 1), in fp32 (or x's
    dtype if wider)."""
    x32 = x.to(torch.promote_types(x.dtype, torch.float32))  # (..., C) in fp32
    rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # (..., 1)
    # subtle: cast back BEFORE scaling by the weight, as Llama does, so logits match HF's.
    return weight * (x32 * rstd).to(x.dtype), rstd


def _needs_grad(*tensors: Tensor) -> bool:
    """Whether autograd will differentiate through ``tensors`` (else a ``Function`` only adds
    overhead: generation runs every layer once per token)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class RMSNormFunction(torch.autograd.Function):
    """``weight * (x / rms(x))``, keeping only ``x`` and the per-row ``1 / rms`` for backward.

    Plain autograd would keep the fp32 copy of ``x``, ``1 / rms`` and the normalised ``x``
    (one more (..., C) tensor than here); backward recomputes ``x̂ = x / rms(x)`` instead.
    With ``x̂ = x·r``, ``r = (mean(x²) + eps)^(-1/2)`` and ``ĝ`` the gradient reaching ``x̂``:
    ``dL/dx = r·ĝ - r³·x·mean(ĝ ⊙ x)`` and ``dL/dweight = Σ_rows g ⊙ x̂``. The backward takes
    the forward's ops in reverse, each as autograd differentiates it, so the layer's gradients
    equal plain autograd's bit for bit (in a model, autograd adds the two terms of ``dL/dx`` to
    the residual path's gradient one at a time, we add their sum: fp32 rounding). The maths runs
    in fp32 (or in x's dtype if wider: float64 for gradcheck).
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        out, rstd = _rms_norm(x, weight, eps)
        ctx.save_for_backward(x, rstd, weight)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        x, rstd, weight = ctx.saved_tensors
        x32 = x.to(rstd.dtype)  # (..., C)
        grad_weight = grad_x = None
        if ctx.needs_input_grad[1]:  # weight * x̂, x̂ recomputed bit for bit
            grad_weight = (grad * (x32 * rstd).to(x.dtype)).sum_to_size(weight.shape)
        if ctx.needs_input_grad[0]:
            grad_normed = (grad * weight).to(x.dtype).to(rstd.dtype)  # back through the casts
            grad_rstd = (grad_normed * x32).sum_to_size(rstd.shape)  # x̂ = x * rstd
            grad_mean_sq = -0.5 * grad_rstd * rstd.pow(3)  # rstd = rsqrt(mean(x²) + eps)
            grad_x32 = grad_normed * rstd + grad_mean_sq / x.shape[-1] * (2 * x32)
            grad_x = grad_x32.to(x.dtype)
        return grad_x, grad_weight, None


class RMSNorm(nn.Module):
    """Root-mean-square LayerNorm (Zhang & Sennrich 2019, eq. 4): ``x / rms(x) * g``.

    No mean subtraction and no bias.  Computed in fp32 even under bf16/fp16 autocast
    (the mean of squares overflows / loses precision in half types), then cast back.
    Built in notebook 03; ``RMSNormFunction`` holds the maths and its backward.

    >>> norm = RMSNorm(4)
    >>> norm(torch.tensor([[2.0, -2.0, 2.0, -2.0]]))
    tensor([[ 1.0000, -1.0000,  1.0000, -1.0000]], grad_fn=<RMSNormFunctionBackward>)
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        if not _needs_grad(x, self.weight):  # inference: the same ops, no Function
            return _rms_norm(x, self.weight, self.eps)[0]  # (..., C)
        return RMSNormFunction.apply(x, self.weight, self.eps)  # (..., C)


class SiLUMulFunction(torch.autograd.Function):
    """SwiGLU's gating ``silu(gate) * up``, keeping only ``gate`` and ``up`` for backward.

    Plain autograd would also keep ``silu(gate)`` (one more (..., I) tensor per token);
    backward recomputes it: with ``g`` the gradient of the output, ``dL/dup = g ⊙ silu(gate)``
    and ``dL/dgate = (g ⊙ up) ⊙ silu'(gate)``, ``silu'(z) = σ(z)(1 + z(1 - σ(z)))``.

    >>> gate, up = torch.tensor([0.0, 1.0], requires_grad=True), torch.tensor([2.0, 3.0])
    >>> SiLUMulFunction.apply(gate, up).sum().backward()
    >>> [round(g, 4) for g in gate.grad.tolist()]   # 2 * silu'(0) = 2 * 0.5; 3 * silu'(1)
    [1.0, 2.783]
    """

    @staticmethod
    def forward(ctx, gate: Tensor, up: Tensor) -> Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up  # (..., I)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        gate, up = ctx.saved_tensors
        grad_gate = grad_up = None
        if ctx.needs_input_grad[0]:
            # silu' through autograd's own fused kernel (one pass, recomputing σ(gate)): the
            # same ops as plain autograd, so the same gradients bit for bit
            grad_gate = torch.ops.aten.silu_backward(grad * up, gate)  # (..., I)
        if ctx.needs_input_grad[1]:
            grad_up = grad * F.silu(gate)  # (..., I)
        return grad_gate, grad_up


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
        gate, up = self.gate_proj(x), self.up_proj(x)  # (B, T, I) each
        gated = (SiLUMulFunction.apply(gate, up) if _needs_grad(gate, up)
                 else F.silu(gate) * up)  # (B, T, I): the same ops either way
        return self.dropout(self.down_proj(gated))  # (B, T, C)
