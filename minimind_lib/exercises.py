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


# --- notebook 09: LoRA ----------------------------------------------------------------------


def _lora_case():
    """Small random tensors for the LoRA checks: x (2, 3, 8), W (6, 8), A (2, 8), B (6, 2)."""
    import torch

    gen = torch.Generator().manual_seed(9)
    shapes = ((2, 3, 8), (6, 8), (2, 8), (6, 2))
    return [torch.randn(s, generator=gen) for s in shapes]


@check("09.1")
def _lora_forward(answer) -> None:
    """``answer(x, W, A, B, alpha)``: the adapted layer's output, ``x W^T + (alpha/r) x A^T B^T``."""
    import torch

    x, W, A, B = _lora_case()
    want = x @ W.T + (4.0 / A.shape[0]) * (x @ A.T) @ B.T  # (2, 3, 6)
    got = answer(x, W, A, B, 4.0)
    assert tuple(got.shape) == tuple(want.shape), f"shape {tuple(got.shape)}, want (2, 3, 6)"
    assert torch.allclose(got, want, atol=1e-5), ("wrong values: is the update scaled by "
                                                  "alpha / r, with r = A.shape[0]?")


@check("09.2")
def _lora_merge(answer) -> None:
    """``answer(W, A, B, alpha)``: the merged weight ``W + (alpha/r) B A``, shape of W."""
    import torch

    x, W, A, B = _lora_case()
    got = answer(W, A, B, 4.0)
    assert tuple(got.shape) == tuple(W.shape), f"shape {tuple(got.shape)}, want {tuple(W.shape)}"
    unmerged = x @ W.T + (4.0 / A.shape[0]) * (x @ A.T) @ B.T
    assert torch.allclose(x @ got.T, unmerged, atol=1e-5), ("x @ merged.T differs from the "
                                                           "adapted layer's output")


@check("09.3")
def _lora_count(answer) -> None:
    """``answer(config, rank, targets)``: trainable LoRA parameters of a MiniMind model."""
    from minimind_lib.lora import add_lora, count_parameters
    from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM

    for heads, kv_heads, targets in ((4, 4, ("q_proj", "v_proj")),
                                     (4, 2, ("k_proj", "o_proj", "down_proj"))):
        config = MiniMindConfig(vocab_size=32, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=heads, num_key_value_heads=kv_heads)
        model = MiniMindForCausalLM(config)
        add_lora(model, rank=4, alpha=8, target_modules=targets)
        want = count_parameters(model).trainable
        got = answer(config, 4, targets)
        assert got == want, (f"{got:,} for {targets} with {kv_heads} of {heads} heads as kv "
                             f"heads; want {want:,} (r (d_in + d_out) per matrix)")
