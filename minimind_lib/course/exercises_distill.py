"""Notebook 16's exercise checks (distillation): the KD loss's gradient, the soft-target
cross-entropy, and black-box distillation's data. Each compares the answer with the formula or
the library's rule on small random inputs and names the likely mistake; ``course.exercises``
registers them (``NOTEBOOK_16``), so this module needs nothing from it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from minimind_lib.evaluation.questions import Answer
from minimind_lib.tokenizer.special import IM_END, IM_START
from minimind_lib.training.distill import kd_loss


def _logits(seed: int, n: int = 5, vocab: int = 11) -> tuple[Tensor, Tensor]:
    """Student and teacher logits (n, vocab), float64 so the checks' tolerances can be tight."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, vocab, generator=g, dtype=torch.float64) * 2,
            torch.randn(n, vocab, generator=g, dtype=torch.float64) * 3)


def _kd_float64(s: Tensor, t: Tensor, temperature: float) -> Tensor:
    """``training.distill.kd_loss`` in float64 (the library's runs in fp32): the reference."""
    log_p_s = F.log_softmax(s / temperature, -1)  # (N, V)
    log_p_t = F.log_softmax(t / temperature, -1)  # (N, V)
    return temperature ** 2 * (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1).mean()


def _autograd_kd(s: Tensor, t: Tensor, temperature: float) -> Tensor:
    """The gradient of the library's ``kd_loss`` (fp32) with respect to ``s``."""
    x = s.float().requires_grad_(True)
    kd_loss(x, t.float(), temperature).backward()
    return x.grad


def _tensor(got: object, shape: tuple[int, ...], what: str) -> Tensor:
    assert isinstance(got, Tensor), f"{what}: return a tensor, got {type(got).__name__}"
    assert tuple(got.shape) == shape, f"{what}: shape {tuple(got.shape)}, expected {shape}"
    return got.detach().double()


def _kd_gradient(answer: Callable) -> None:
    """``answer(s, t, T)`` = d kd_loss(s, t, T) / d s, (N, V): T (p_s - p_t) / N."""
    for seed, temperature in [(0, 1.0), (1, 2.0), (2, 0.5), (3, 4.0)]:
        s, t = _logits(seed)
        x = s.clone().requires_grad_(True)
        _kd_float64(x, t, temperature).backward()
        want = x.grad  # (N, V)
        assert torch.allclose(want.float(), _autograd_kd(s, t, temperature), atol=1e-6)
        got = _tensor(answer(s.clone(), t.clone(), temperature), tuple(s.shape),
                      f"T = {temperature}")
        if torch.allclose(got, want, rtol=1e-5, atol=1e-8):  # float32 answers are right too
            continue
        where = f"T = {temperature}"
        for factor, mistake in [(-1.0, "the sign is flipped: the loss falls as p_s moves "
                                       "toward p_t, so the gradient is p_s - p_t"),
                                (temperature ** -2, "the T^2 in front of the KL is missing: "
                                                    "it multiplies the gradient too"),
                                (len(s), "the 1/N of the mean over positions is missing"),
                                (temperature, "the chain rule's 1/T is missing: "
                                              "d(s/T)/ds = 1/T"),
                                (1 / temperature, "a factor T is missing: the T^2 in front "
                                                  "times the chain rule's 1/T leaves T")]:
            assert not torch.allclose(got, factor * want, rtol=1e-5, atol=1e-8), (
                f"{where}: {mistake}")
        raise AssertionError(f"{where}: got {got[0, :3].tolist()}..., expected "
                             f"{want[0, :3].tolist()}... (autograd of the KD loss)")


def _soft_cross_entropy(answer: Callable) -> None:
    """``answer(s, t, T)`` = T^2 x the mean over positions of -sum_v p_t log p_s (both at T)."""
    for seed, temperature in [(4, 1.0), (5, 1.5), (6, 3.0)]:
        s, t = _logits(seed)
        got = answer(s.clone(), t.clone(), temperature)
        assert (isinstance(got, float) or isinstance(got, Tensor) and got.numel() == 1), (
            f"return one number (a float or a 0-d tensor: the mean over positions), got "
            f"{type(got).__name__}{tuple(got.shape) if isinstance(got, Tensor) else ''}")
        got = float(got)
        log_p_s = F.log_softmax(s / temperature, -1)  # (N, V)
        p_t = F.softmax(t / temperature, -1)  # (N, V)
        want = temperature ** 2 * float(-(p_t * log_p_s).sum(-1).mean())
        def near(x: float, y: float) -> bool:  # float32's precision: a float32 answer is right
            return abs(x - y) <= 1e-5 * max(1.0, abs(y))

        if near(got, want):
            continue
        hard = temperature ** 2 * float(F.cross_entropy(s / temperature, t.argmax(-1)))
        kl = float(_kd_float64(s, t, temperature))
        where = f"T = {temperature}"
        assert not near(got, hard), (f"{where}: that is the cross-entropy with the teacher's "
                                     "top token as a hard label; weight every token's "
                                     "-log p_s by the teacher's probability p_t")
        assert not near(got, kl), (f"{where}: that is the KL (kd_loss); the cross-entropy "
                                   "adds the teacher's entropy: -sum p_t log p_s, no log p_t")
        assert not near(got, want / temperature ** 2), f"{where}: the T^2 factor is missing"
        raise AssertionError(f"{where}: got {got:.9g}, expected {want:.9g} (they differ by "
                             f"{got - want:.2g})")


def _finished(conversation: list[dict], answer: Answer) -> list[dict] | None:
    """The conversation with its last assistant turn replaced by ``answer``; None when the
    teacher did not finish it (``training.distill.teacher_answers``' rule)."""
    if not answer.follows_format:
        return None
    last = max(i for i, m in enumerate(conversation) if m["role"] == "assistant")
    return conversation[:last] + [{"role": "assistant", "content": answer.text}]


def _black_box_data(answer: Callable) -> None:
    """``answer(conversations, answers)``: each conversation whose ``Answer`` follows the format
    with its last assistant turn replaced by the answer's text; the others dropped."""
    user = lambda text: {"role": "user", "content": text}  # noqa: E731
    assistant = lambda text: {"role": "assistant", "content": text}  # noqa: E731
    conversations = [
        [user("2 + 7 是多少？"), assistant("9")],
        [{"role": "system", "content": "Be brief."}, user("74 和 50 中较大的数是？"),
         assistant("74")],
        [user("Hi"), assistant("Hello!"), user("Which word comes first in \"Dogs bark.\"?"),
         assistant("Dogs")],
        [user("“昨日到城廓”出自谁的诗？"), assistant("张俞")],
        [user("Write \"I may say so\" back to me."), assistant("I may say so")],
        [user("请接下句：“野寺人来少”"), assistant("云峰晓更深")],
    ]
    answers = [Answer("9", ended=True), Answer("50", ended=True), Answer("Dogs", ended=True),
               Answer("李白李白李白", ended=False),   # cut at the budget: no end of turn
               Answer("  ", ended=True),              # empty
               Answer(f"一{IM_START}user", ended=True)]  # a role marker inside
    want = [c for c in (_finished(c, a) for c, a in zip(conversations, answers, strict=True)) if c]
    got = answer([list(c) for c in conversations], list(answers))
    assert isinstance(got, list), f"return a list of conversations, got {type(got).__name__}"
    if got == want:
        return
    assert len(got) <= len(want), (
        f"{len(got)} conversations kept, {len(want)} expected: keep only answers that follow "
        f"the format (Answer.follows_format: ended with {IM_END}, not empty, no special "
        "token inside); an answer cut mid-way is not one to imitate")
    for conversation in got:
        assert isinstance(conversation, list) and conversation, (
            f"each item is a conversation (a list of messages), got {conversation!r:.80}")
        assistants = [m for m in conversation if m.get("role") == "assistant"]
        references = {c[-1]["content"] for c in conversations}
        assert not (len(conversation) > 1 and conversation[-2].get("role") == "assistant"
                    and conversation[-2].get("content") in references), (
            "the reference answer is still there: replace the last assistant turn, do not "
            "append the teacher's answer after it")
        assert assistants, f"no assistant turn in {conversation!r:.80}"
    raise AssertionError(f"got {got!r:.200}, expected {want!r:.200}")


#: exercise id -> its check (``course.exercises`` registers them)
NOTEBOOK_16 = {"16.1": _kd_gradient, "16.2": _soft_cross_entropy, "16.3": _black_box_data}
