"""The notebooks' exercises: one convention, checks that can fail.

An exercise in a notebook is a markdown cell saying what to build, a code cell with a stub
that raises ``NotImplementedError``, and a check cell::

    def my_merge_pair(word, pair, new_id):      # exercise 01.2: your code here
        raise NotImplementedError("exercise 01.2")

    exercise("01.2", my_merge_pair)

``exercise`` prints "not done yet" for the stub (so the notebook still runs top to bottom), and
for an answer runs the exercise's check: "correct", or an ``AssertionError`` saying what is
wrong. Worked answers live in ``notebooks/solutions/NN_name.ipynb`` (run under nbval too), and
``tests/test_exercises.py`` calls every check with a plausible wrong answer to prove it fails.

A check is registered here with ``@check("NN.k")``: a function taking the student's answer (a
function, a number, a tensor...) that asserts what a right answer must satisfy, on small inputs
(no trained model: the test must be able to run it in milliseconds).

>>> @check("99.1")
... def _square(answer):
...     assert answer(3) == 9, f"answer(3) = {answer(3)}, expected 9"
>>> exercise("99.1", lambda x: x * x)
exercise 99.1: correct
True
>>> def stub(x):
...     raise NotImplementedError("exercise 99.1")
>>> exercise("99.1", stub)
exercise 99.1: not done yet (a worked answer: notebooks/solutions/99_*.ipynb)
False
>>> del CHECKS["99.1"]
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minimind_lib.dpo import answer_logprobs, dpo_loss
from minimind_lib.grpo import grpo_loss

#: exercise id ("01.2": notebook 01, exercise 2) -> its check
CHECKS: dict[str, Callable[[object], None]] = {}


def check(exercise_id: str) -> Callable[[Callable[[object], None]], Callable[[object], None]]:
    """Register the check of exercise ``exercise_id`` (``"NN.k"``)."""
    def wrap(fn: Callable[[object], None]) -> Callable[[object], None]:
        if exercise_id in CHECKS:
            raise ValueError(f"exercise {exercise_id} has two checks")
        CHECKS[exercise_id] = fn
        return fn
    return wrap


def exercise(exercise_id: str, answer: object) -> bool:
    """Check a student's ``answer`` to exercise ``exercise_id``: True when right; False (and a
    note) while it is still the stub; an ``AssertionError`` saying what is wrong otherwise."""
    if exercise_id not in CHECKS:
        raise KeyError(f"no exercise {exercise_id!r}; known: {', '.join(sorted(CHECKS))}")
    try:
        CHECKS[exercise_id](answer)
    except NotImplementedError:
        notebook = exercise_id.split(".")[0]
        print(f"exercise {exercise_id}: not done yet (a worked answer: "
              f"notebooks/solutions/{notebook}_*.ipynb)")
        return False
    print(f"exercise {exercise_id}: correct")
    return True


# --- notebook 06: DPO ------------------------------------------------------------------------


@check("06.1")
def _dpo_gradient_weight(grad_weight) -> None:
    """``grad_weight(margin, beta, B)`` == d loss / d log pi(y_w|x) of each pair (eq. 8)."""
    g = torch.Generator().manual_seed(1)
    pi_w = (-30 * torch.rand(6, generator=g)).requires_grad_()
    pi_l, ref_w, ref_l = (-30 * torch.rand(6, generator=g) for _ in range(3))
    for beta in (0.1, 0.7):
        loss, rw, rl = dpo_loss(pi_w, pi_l, ref_w, ref_l, beta)
        (grad,) = torch.autograd.grad(loss, pi_w)
        got = torch.as_tensor(grad_weight(rw - rl, beta, 6), dtype=grad.dtype)
        assert got.shape == grad.shape, f"expected shape {tuple(grad.shape)}, got {tuple(got.shape)}"
        assert torch.allclose(got, grad, atol=1e-6), f"beta={beta}: {got} != autograd {grad}"


@check("06.2")
def _average_logprob(avg_logprob) -> None:
    """``avg_logprob(logits, labels)`` == the mean log-prob per answer token."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 7, 11, generator=g)
    labels = torch.tensor([[-100, -100, 4, 5, 6, -100, -100], [-100, 1, 2, 3, 4, 5, 6],
                           [-100, -100, -100, -100, -100, 9, -100]])
    expected = answer_logprobs(logits, labels, average=True)
    got = torch.as_tensor(avg_logprob(logits, labels), dtype=expected.dtype)
    assert got.shape == expected.shape, f"expected shape {tuple(expected.shape)}, got {tuple(got.shape)}"
    assert torch.allclose(got, expected, atol=1e-5), f"{got} != {expected} (mean over answer tokens)"


@check("06.3")
def _implicit_reward_accuracy(reward_accuracy) -> None:
    """``reward_accuracy(policy_logps, reference_logps)``: share of pairs whose chosen answer
    gained more log-prob (relative to the reference) than the rejected one; ties are wrong."""
    policy = torch.tensor([[-1.0, -2.0], [-3.0, -2.0], [-1.0, -5.0], [-2.0, -2.0]])
    reference = torch.tensor([[-1.0, -1.0], [-4.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    got = float(reward_accuracy(policy, reference))
    assert abs(got - 0.75) < 1e-6, f"got {got}; expected 0.75 (3 of 4 pairs; a tie counts as wrong)"


@check("06.4")
def _dpo_with_nll(rpo_loss) -> None:
    """``rpo_loss(pi_w, pi_l, ref_w, ref_l, n_w, beta, alpha)``: the DPO loss plus ``alpha``
    times the chosen answers' NLL per token (``n_w`` answer tokens each), as ``DPOLoss`` with
    ``nll_weight=alpha`` computes it (Pang et al. 2024)."""
    g = torch.Generator().manual_seed(4)
    pi_w, pi_l, ref_w, ref_l = (-20 * torch.rand(5, generator=g) for _ in range(4))
    n_w = torch.tensor([3, 7, 1, 12, 5])
    for beta, alpha in ((0.1, 1.0), (0.5, 0.3)):
        expected = dpo_loss(pi_w, pi_l, ref_w, ref_l, beta)[0] + alpha * (-(pi_w / n_w)).mean()
        got = float(rpo_loss(pi_w, pi_l, ref_w, ref_l, n_w, beta, alpha))
        assert abs(got - expected.item()) < 1e-5, \
            f"beta={beta}, alpha={alpha}: got {got:.6f}, expected {expected.item():.6f}"


# --- notebook 10: GRPO -----------------------------------------------------------------------


@check("10.1")
def _leave_one_out_advantages(rloo) -> None:
    """``rloo(rewards)`` (P, G) -> advantages: each reward minus the mean of the *other*
    G - 1 rewards of its group (RLOO, Ahmadian et al. 2024)."""
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.5, 1.0, 0.0]])
    expected = torch.tensor([[r - (sum(row) - r) / 3 for r in row] for row in rewards.tolist()])
    got = torch.as_tensor(rloo(rewards), dtype=expected.dtype)
    assert got.shape == expected.shape, f"expected shape {tuple(expected.shape)}, got {tuple(got.shape)}"
    assert torch.allclose(got, expected, atol=1e-6), f"{got}\n!= {expected}"


@check("10.2")
def _kl_k2(k2) -> None:
    """``k2(logp, ref_logp)`` = 0.5 (logp - ref_logp)^2 per token (Schulman's k2)."""
    logp = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    ref = torch.tensor([-1.5, -1.0, -0.5, -0.2])
    expected = 0.5 * (logp - ref) ** 2
    got = torch.as_tensor(k2(logp, ref), dtype=expected.dtype)
    assert got.shape == expected.shape and torch.allclose(got, expected, atol=1e-6), \
        f"{got} != {expected}"


@check("10.3")
def _clip_fraction(clip_fraction) -> None:
    """``clip_fraction(ratio, advantages, mask, eps)``: share of answer tokens where the clipped
    term is the smaller one (where PPO's objective stops the gradient)."""
    g = torch.Generator().manual_seed(3)
    ratio = 0.6 + 0.8 * torch.rand(4, 6, generator=g)  # (B, T) around 1
    advantages = torch.tensor([1.0, -1.0, 0.5, -2.0])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0],
                         [1, 1, 1, 0, 0, 0]]).bool()
    for eps in (0.1, 0.2):
        _, metrics = grpo_loss(ratio.log(), torch.zeros(4, 6), None, advantages, mask,
                               clip_eps=eps)
        got = float(clip_fraction(ratio, advantages, mask, eps))
        expected = metrics["clip_fraction"].item()
        assert abs(got - expected) < 1e-6, f"eps={eps}: got {got}, expected {expected}"
