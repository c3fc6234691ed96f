"""Sampling the next token (notebook 08): temperature, top-k and top-p (nucleus) filtering
of one step's logits, and the one check of those settings (``sampling_problem``) that the
library, the CLI and the server share.

>>> import torch
>>> sample_next_token(torch.tensor([[0.0, 3.0, 1.0]]), temperature=0).tolist()  # greedy
[1]
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: Below this temperature sampling is greedy. Dividing float32 logits by a smaller one can
#: overflow (1e-40 is not even a normal float32) and gains nothing: at T = 1e-8 a runner-up
#: only 1e-6 below the best logit is already exp(-100) times less likely.
MIN_TEMPERATURE = 1e-8


def sampling_problem(temperature: float, top_k: int | None = None,
                     top_p: float | None = None) -> tuple[str, str] | None:
    """``(field, what is wrong)`` for sampling settings ``sample_next_token`` cannot use, or None.

    The one rule book: ``sample_next_token`` and ``inference.chat.SamplingParams`` both apply it.

    >>> sampling_problem(float("nan"))
    ('temperature', 'temperature must be a finite number >= 0, got nan')
    >>> sampling_problem(0.7, top_p=0) is not None, sampling_problem(0.0, top_k=5, top_p=1e-46)
    (True, None)
    """
    def is_number(x: object) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)

    if not is_number(temperature) or temperature < 0:
        return "temperature", f"temperature must be a finite number >= 0, got {temperature!r}"
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        return "top_k", f"top_k must be an integer >= 1, got {top_k!r}"
    if top_p is not None and (not is_number(top_p) or not 0 < top_p <= 1):
        return "top_p", f"top_p must be a number in (0, 1], got {top_p!r}"
    return None


def sample_next_token(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One token per row from ``logits`` (B, V): greedy at temperature 0 (and below
    ``MIN_TEMPERATURE``), else temperature → top-k → top-p (Holtzman et al. 2019) →
    multinomial sample.

    >>> sample_next_token(torch.tensor([[0.0, 3.0, 1.0]]), temperature=0)
    tensor([1])
    >>> sample_next_token(torch.tensor([[0.0, 3.0, 1.0]]), top_k=1)
    tensor([1])
    >>> sample_next_token(torch.tensor([[0.0, 3.0, 1.0]]), temperature=1e-40, top_p=1e-46)
    tensor([1])
    """
    problem = sampling_problem(temperature, top_k, top_p)
    if problem:
        raise ValueError(problem[1])
    if temperature < MIN_TEMPERATURE:
        return logits.argmax(dim=-1)  # (B,)
    logits = logits / temperature  # (B, V)
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
        probs = sorted_logits.softmax(dim=-1)
        # drop a token when the ones ranked above it already reach top_p
        drop_sorted = probs.cumsum(dim=-1) - probs >= top_p  # (B, V)
        # subtle: the best token always stays. A top_p below float32's resolution (1e-46 is 0
        # in float32) would otherwise drop it too, leaving nothing to sample.
        drop_sorted[:, 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)
