"""Notebook 15's exercise checks (RL for an agent): an episode's ids and response mask, CISPO's
objective, and GAE over one answer. Each compares the answer with the library's rule on small
inputs and names the likely mistake; ``course.exercises`` registers them (``NOTEBOOK_15``), so
this module needs nothing from it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from minimind_lib.training.grpo import cispo_objective
from minimind_lib.training.ppo import gae


def _episode_mask(answer: Callable) -> None:
    """``answer(prompt, turns)`` -> (ids, mask): ``turns`` is a list of (sampled ids,
    observation ids) pairs; ids = prompt + each turn's sampled ids then its observation; mask 0
    on the prompt, 1 on sampled ids, 0 on observations."""
    cases = [([5, 6], [([7, 8, 2], [9, 9, 9]), ([10, 2], [])]),
             ([1], [([3, 2], [])]),
             ([4, 4, 4], [([2], [8]), ([2], [8]), ([11, 12, 2], [])])]
    for prompt, turns in cases:
        want_ids, want_mask = list(prompt), [0] * len(prompt)
        for sampled, observed in turns:
            want_ids += sampled + observed
            want_mask += [1] * len(sampled) + [0] * len(observed)
        got = answer(list(prompt), [(list(s), list(o)) for s, o in turns])
        assert isinstance(got, tuple) and len(got) == 2, "return a pair (ids, mask)"
        ids, mask = (list(x.tolist() if isinstance(x, Tensor) else x) for x in got)
        assert ids == want_ids, (f"prompt {prompt}, turns {turns}: ids {ids}, expected "
                                 f"{want_ids} (the prompt, then each turn's sampled ids and "
                                 "its observation, in order, nothing re-encoded)")
        assert len(mask) == len(ids), f"the mask must have one entry per id ({len(ids)})"
        if mask[:len(prompt)] != [0] * len(prompt):
            raise AssertionError("the prompt is the environment's, not the policy's: mask 0")
        assert [int(m) for m in mask] == want_mask, (
            f"prompt {prompt}, turns {turns}: mask {mask}, expected {want_mask}: 1 on the "
            "sampled ids only (observations are the tools' words, not the model's)")


def _cispo(answer: Callable) -> None:
    """``answer(logp, old_logp, advantages, max_ratio)`` -> the per-token objective (B, T)
    whose value is ``sg(min(rho, max_ratio)) A logp`` and whose gradient is
    ``min(rho, max_ratio) A``."""
    g = torch.Generator().manual_seed(0)
    for max_ratio in (5.0, 1.5):
        logp = (torch.rand(3, 4, generator=g, dtype=torch.float64) * -3)
        old = logp + torch.randn(3, 4, generator=g, dtype=torch.float64)
        adv = torch.randn(3, generator=g, dtype=torch.float64)
        x = logp.clone().requires_grad_(True)
        want, _ = cispo_objective(x, old, adv, max_ratio)
        want.sum().backward()
        want_grad = x.grad.clone()
        y = logp.clone().requires_grad_(True)
        got = answer(y, old.clone(), adv.clone(), max_ratio)
        assert isinstance(got, Tensor) and got.shape == want.shape, (
            f"return the per-token objective, shape {tuple(want.shape)}")
        assert got.requires_grad, "the objective must keep the gradient through logp"
        ratio = torch.exp(logp - old)
        if torch.allclose(got.detach(), ratio.clamp(max=max_ratio) * adv[:, None], atol=1e-9):
            raise AssertionError("multiply the weight by the log-prob: the gradient goes "
                                 "through logp, the weight is a constant")
        assert torch.allclose(got.detach(), want.detach(), atol=1e-9), (
            f"max_ratio {max_ratio}: value {got[0, :2].tolist()}, expected "
            f"{want[0, :2].tolist()}: min(rho, max_ratio) * A * logp (only an upper clip)")
        got.sum().backward()
        if not torch.allclose(y.grad, want_grad, atol=1e-9):
            raise AssertionError("the gradient is not min(rho, max_ratio) * A: detach the "
                                 "weight (.detach()), or the ratio's own gradient leaks in")


def _gae_one(answer: Callable) -> None:
    """``answer(rewards, values, gamma, lam)`` over one answer's T tokens (lists or tensors)
    -> the advantages (T,): delta_t = r_t + gamma V_{t+1} - V_t (V_T = 0), A_t = delta_t +
    gamma lam A_{t+1}."""
    g = torch.Generator().manual_seed(1)
    for gamma, lam in [(1.0, 0.95), (0.9, 0.5), (1.0, 1.0), (0.99, 0.0)]:
        T = 6
        rewards = torch.randn(1, T, generator=g, dtype=torch.float64)
        values = torch.randn(1, T, generator=g, dtype=torch.float64)
        want, _ = gae(rewards, values, torch.ones(1, T, dtype=torch.bool), gamma, lam)
        got = answer(rewards[0].clone(), values[0].clone(), gamma, lam)
        got = torch.as_tensor(got, dtype=torch.float64).flatten()
        assert got.shape == (T,), f"return one advantage per token ({T}), got {tuple(got.shape)}"
        where = f"gamma {gamma}, lambda {lam}"
        if torch.allclose(got, want[0], atol=1e-9):
            continue
        returns = want[0] + values[0]
        assert not torch.allclose(got, returns, atol=1e-9), (
            f"{where}: these are the returns (A + V); the advantage subtracts V_t")
        assert not torch.allclose(got[:-1], want[0, 1:], atol=1e-9), (
            f"{where}: shifted by one: A_t starts from delta_t of the same t")
        raise AssertionError(f"{where}: got {got[:3].tolist()}..., expected "
                             f"{want[0, :3].tolist()}...: run backwards from the last token, "
                             "whose next value is 0")


NOTEBOOK_15 = {"15.1": _episode_mask, "15.2": _cispo, "15.3": _gae_one}
