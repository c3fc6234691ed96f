"""The output head and its cross-entropy without the full logits (a training-memory saving).

``causal_lm_loss(lm_head(hidden), labels)`` materialises the logits (B, T, V) and autograd keeps
a (B, T, V) fp32 tensor (the log-softmax) until backward: at MiniMind2-Small's vocabulary
(6,400) that is 25 KiB per token, more than any one layer's largest activation. Here the head
and the loss run together, a chunk of positions at a time, so no tensor with V entries per
position outlives its chunk. Two ways to get the gradient ``softmax - onehot`` without keeping
the logits: forward keeps each position's log-sum-exp and backward recomputes each chunk's
logits (one more head matmul), or, for a scalar loss, forward computes the gradients of the
head's input and weight right away and backward only scales them (no extra matmul; the weight's
gradient, V x C, is kept instead). Positions whose label is ignored (prompts, padding:
``IGNORE_INDEX``) are dropped before the head runs.

The idea is Liger Kernel's fused linear cross-entropy and Wijmans et al. 2024, *Cut Your Losses
in Large-Vocabulary Language Models* (they fuse it into GPU kernels; this is plain PyTorch).

* ``chunked_causal_lm_loss``: the mean next-token loss of ``causal_lm_loss`` from the hidden
  states (pretraining, SFT);
* ``chunked_token_logprobs``: per-row ``log softmax(logits / temperature)[target]`` (DPO, GRPO:
  ``minimind_lib.training.logprobs.token_logprobs``).

Both give what the plain path gives: to fp32 rounding in fp32, and under ``torch.autocast`` the
same mixed precision (head matmul in the autocast dtype, softmax and loss in fp32).

>>> _ = torch.manual_seed(0)
>>> hidden, weight = torch.randn(2, 5, 8), torch.randn(16, 8)
>>> labels = torch.randint(0, 16, (2, 5))
>>> from minimind_lib.model.decoder import causal_lm_loss
>>> plain = causal_lm_loss(F.linear(hidden, weight), labels)
>>> torch.allclose(chunked_causal_lm_loss(hidden, weight, labels, chunk_size=3), plain)
True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: The label of a position that gets no loss (``F.cross_entropy``'s ``ignore_index``): prompts
#: and padding in SFT/DPO batches, the last position of every sequence in ``causal_lm_loss``.
IGNORE_INDEX = -100

#: Positions per chunk: each chunk's logits are ``chunk_size x V`` fp32 (13 MB at V = 6,400);
#: smaller chunks stay in cache, much smaller ones gain nothing (docs/benchmarks.md measures it).
DEFAULT_CHUNK_SIZE = 512


def head_weight(head: nn.Module) -> Tensor | None:
    """The weight (V, C) of an output head the chunked functions can run: a bias-free
    ``nn.Linear``; None for any other head (int8 ``QuantLinear``, a LoRA wrapper, a bias),
    which must run as a module on the hidden states.

    >>> head_weight(nn.Linear(4, 8, bias=False)).shape, head_weight(nn.Linear(4, 8))
    (torch.Size([8, 4]), None)
    """
    return head.weight if type(head) is nn.Linear and head.bias is None else None


def chunked_causal_lm_loss(hidden: Tensor, weight: Tensor, labels: Tensor,
                           chunk_size: int = DEFAULT_CHUNK_SIZE,
                           grad_in_forward: bool = True) -> Tensor:
    """``causal_lm_loss(F.linear(hidden, weight), labels)`` without the (B, T, V) logits.

    ``hidden`` (B, T, C): the trunk's final hidden states; ``weight`` (V, C): the output head
    (tied to the embedding or not; its gradient reaches whichever Parameter it is); ``labels``
    (B, T) aligned with the inputs, ``IGNORE_INDEX`` where no loss is wanted: position t is
    scored on token t+1. Returns the mean cross-entropy over the scored positions (a scalar;
    nan when none is scored, as ``F.cross_entropy`` gives).

    ``grad_in_forward`` (the default; used when a gradient is wanted, and not under fp16
    autocast): forward also computes the gradients, ``chunk_size`` positions at a time, and
    autograd keeps them: (N, C) for the hidden rows and (V, C) for the weight, in the matmul's
    dtype. Three head matmuls, as the plain path. Otherwise autograd keeps the scored hidden
    rows, the targets and one fp32 log-sum-exp per row, and backward recomputes the logits
    chunk by chunk: less memory (no V x C), one more matmul.

    >>> hidden, weight = torch.zeros(1, 3, 4), torch.zeros(8, 4)   # uniform over 8 tokens
    >>> round(chunked_causal_lm_loss(hidden, weight, torch.tensor([[0, 1, 2]])).item(), 4)  # ln 8
    2.0794
    """
    if labels.shape != hidden.shape[:2]:
        raise ValueError(f"labels shape {tuple(labels.shape)} must equal the hidden states' "
                         f"(batch, seq_len) {tuple(hidden.shape[:2])}")
    targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX).reshape(-1)  # (B*T,): token t+1
    rows = (targets != IGNORE_INDEX).nonzero().squeeze(1)  # (N,): the scored positions
    scored = hidden.reshape(-1, hidden.shape[-1])[rows]  # (N, C)
    dtype = _compute_dtype(hidden)
    wants_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    # subtle: not under fp16: (softmax - onehot) / N cast to fp16 before a GradScaler's factor
    # reaches it underflows; in backward the factor is in the gradient before the cast
    if grad_in_forward and wants_grad and dtype != torch.float16:
        return _LinearCrossEntropyEager.apply(scored, weight, targets[rows], chunk_size, dtype)
    logprobs = _LinearLogSoftmax.apply(scored, weight, targets[rows], 1.0, chunk_size,
                                       dtype)  # (N,)
    # subtle: a sum over an empty set is 0 and 0 / 0 = nan: F.cross_entropy's value when
    # every label is ignored
    return -logprobs.sum() / rows.numel()


def chunked_token_logprobs(hidden_rows: Tensor, weight: Tensor, targets: Tensor,
                           temperature: float = 1.0,
                           chunk_size: int = DEFAULT_CHUNK_SIZE) -> Tensor:
    """``log softmax(F.linear(hidden_rows, weight) / temperature)[targets]`` per row (N,),
    without the (N, V) logits; 0 (and no gradient) where a target is ``IGNORE_INDEX``.

    Equals ``-F.cross_entropy(F.linear(h, w).float() / temperature, targets,
    ignore_index=IGNORE_INDEX, reduction="none")``; backward recomputes the logits
    ``chunk_size`` rows at a time.

    >>> rows, weight = torch.zeros(2, 4), torch.zeros(8, 4)          # uniform over 8 tokens
    >>> chunked_token_logprobs(rows, weight, torch.tensor([3, -100]))  # ln(1/8), ignored
    tensor([-2.0794,  0.0000])
    """
    if hidden_rows.dim() != 2 or targets.shape != hidden_rows.shape[:1]:
        raise ValueError(f"hidden_rows must be (N, C) and targets (N,), got "
                         f"{tuple(hidden_rows.shape)} and {tuple(targets.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    dtype = _compute_dtype(hidden_rows)
    valid = targets != IGNORE_INDEX  # (N,)
    if bool(valid.all()):
        return _LinearLogSoftmax.apply(hidden_rows, weight, targets, temperature, chunk_size,
                                       dtype)  # (N,)
    rows = valid.nonzero().squeeze(1)  # (n,)
    logprobs = _LinearLogSoftmax.apply(hidden_rows[rows], weight, targets[rows], temperature,
                                       chunk_size, dtype)  # (n,)
    return logprobs.new_zeros(targets.shape).index_put((rows,), logprobs)  # (N,)


def _compute_dtype(hidden: Tensor) -> torch.dtype:
    """The dtype the head's matmul runs in: the autocast dtype where autocast is on (as
    ``nn.Linear`` would run), else the hidden states' own."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return hidden.dtype


class _LinearLogSoftmax(torch.autograd.Function):
    """``log_softmax(h @ w.T / temperature)[targets]`` (N,), chunked, recomputed in backward.

    Inputs: ``h`` (N, C), ``w`` (V, C), ``targets`` (N,) all in [0, V), ``temperature``,
    ``chunk_size`` (rows per chunk), ``dtype`` (the matmul's dtype). The softmax math runs in
    fp32 (or the inputs' dtype if wider, e.g. float64 for gradcheck).
    """

    @staticmethod
    def forward(ctx, h: Tensor, w: Tensor, targets: Tensor, temperature: float,
                chunk_size: int, dtype: torch.dtype) -> Tensor:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        acc = torch.promote_types(dtype, torch.float32)  # the softmax's dtype
        # subtle: autocast is still on inside a Function's forward but not in its backward; cast
        # by hand in both (to ``dtype``) so the backward's recomputed logits are the forward's
        with torch.autocast(h.device.type, enabled=False):
            hc, wc = h.to(dtype), w.to(dtype)  # (N, C), (V, C): a 2-byte copy under autocast
            out = torch.empty(h.shape[0], dtype=acc, device=h.device)  # (N,)
            lse = torch.empty_like(out)  # (N,)
            for start in range(0, h.shape[0], chunk_size):
                end = start + chunk_size
                z = _logits(hc[start:end], wc, acc, temperature)  # (n, V), freed per chunk
                lse[start:end] = torch.logsumexp(z, dim=1)  # (n,)
                target = z.gather(1, targets[start:end, None]).squeeze(1)  # (n,)
                out[start:end] = target - lse[start:end]
        # the weight itself, not its cast copy: a Parameter costs no memory, the cast is redone
        ctx.save_for_backward(hc, w, targets, lse)
        ctx.temperature, ctx.chunk_size, ctx.h_dtype = temperature, chunk_size, h.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # grad_out (N,)
        hc, w, targets, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[:2]
        t = ctx.temperature
        acc = lse.dtype
        grad_h = torch.empty(hc.shape, dtype=ctx.h_dtype, device=hc.device) if need_h else None
        grad_w = torch.zeros(w.shape, dtype=acc, device=w.device) if need_w else None
        with torch.autocast(hc.device.type, enabled=False):
            wc = w.to(hc.dtype)  # (V, C): the forward's copy, cast again
            scale = grad_out.to(acc) / t  # (N,): d out_i / d logits_i = (onehot - softmax) / t
            for start in range(0, hc.shape[0], ctx.chunk_size):
                end = start + ctx.chunk_size
                h = hc[start:end]  # (n, C)
                z = _logits(h, wc, acc, t)  # (n, V): the forward's logits, recomputed
                # -(softmax - onehot) * grad / t, built in place in z's buffer
                g = z.sub_(lse[start:end, None]).exp_().mul_(-scale[start:end, None])  # (n, V)
                g.scatter_add_(1, targets[start:end, None], scale[start:end, None])
                g = g.to(hc.dtype)  # (n, V): the matmuls run in the forward's dtype
                if need_h:
                    grad_h[start:end] = g @ wc  # (n, C)
                if need_w and g.dtype == acc:
                    grad_w.addmm_(g.T, h)  # (V, C): summed over the chunks
                elif need_w:
                    grad_w += (g.T @ h).to(acc)  # (V, C): summed over the chunks in fp32
        return grad_h, None if grad_w is None else grad_w.to(w.dtype), None, None, None, None


class _LinearCrossEntropyEager(torch.autograd.Function):
    """The mean of ``-log_softmax(h @ w.T)[targets]`` (a scalar), its gradients computed in
    forward chunk by chunk and kept for backward, which only scales them by its incoming
    gradient: three matmuls of the head instead of four (no recomputed logits).

    Kept for backward: d loss / d h (N, C) and d loss / d w (V, C), in the matmul's dtype.
    """

    @staticmethod
    def forward(ctx, h: Tensor, w: Tensor, targets: Tensor, chunk_size: int,
                dtype: torch.dtype) -> Tensor:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        acc = torch.promote_types(dtype, torch.float32)
        need_h, need_w = ctx.needs_input_grad[:2]
        n = h.shape[0]
        with torch.autocast(h.device.type, enabled=False):
            hc, wc = h.to(dtype), w.to(dtype)  # (N, C), (V, C)
            total = torch.zeros((), dtype=acc, device=h.device)
            grad_h = torch.empty(hc.shape, dtype=dtype, device=h.device) if need_h else None
            grad_w = torch.zeros(w.shape, dtype=acc, device=w.device) if need_w else None
            for start in range(0, n, chunk_size):
                end = start + chunk_size
                hk, tk = hc[start:end], targets[start:end, None]  # (n, C), (n, 1)
                z = _logits(hk, wc, acc, 1.0)  # (n, V)
                target = z.gather(1, tk)  # (n, 1)
                top = z.amax(dim=1, keepdim=True)  # (n, 1): exp cannot overflow below it
                # (softmax - onehot) / N: the loss's gradient for an incoming gradient of 1,
                # built in place in z's buffer (one exp pass, no (n, V) temporary), then in the
                # matmul's dtype as nn.Linear gets it
                e = z.sub_(top).exp_()  # (n, V): exp(z - max)
                sums = e.sum(dim=1, keepdim=True)  # (n, 1)
                total += (top + sums.log() - target).sum()  # log-sum-exp - target logit
                g = e.mul_(1 / (sums * n)).scatter_add_(1, tk, torch.full_like(sums, -1 / n))
                g = g.to(dtype)  # (n, V)
                if need_h:
                    grad_h[start:end] = g @ wc  # (n, C)
                if need_w and g.dtype == acc:
                    grad_w.addmm_(g.T, hk)  # (V, C)
                elif need_w:
                    grad_w += (g.T @ hk).to(acc)  # (V, C): summed over the chunks in fp32
        if grad_w is not None:
            # subtle: under autocast nn.Linear's weight gradient is a bf16/fp16 matmul's output,
            # so keeping ours in that dtype loses nothing the plain path keeps (half the bytes)
            grad_w = grad_w.to(dtype)  # (V, C)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = h.dtype, w.dtype
        return total / n  # nan for n = 0, as F.cross_entropy

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # grad_out: a scalar
        grad_h, grad_w = ctx.saved_tensors
        h_dtype, w_dtype = ctx.dtypes
        # subtle: the incoming gradient is 1 for loss.backward() and a power of 2 for a
        # GradScaler, so scaling after the matmuls gives the same numbers as scaling before
        dh = None if grad_h is None else grad_h.to(h_dtype) * grad_out  # (N, C)
        dw = None if grad_w is None else grad_w.to(w_dtype) * grad_out  # (V, C)
        return dh, dw, None, None, None


def _logits(h: Tensor, w: Tensor, acc: torch.dtype, temperature: float) -> Tensor:
    """``(h @ w.T)`` in ``acc`` (n, V), divided by ``temperature`` unless it is 1."""
    z = (h @ w.T).to(acc)  # (n, V): a no-op cast in fp32
    return z if temperature == 1.0 else z.div_(temperature)
