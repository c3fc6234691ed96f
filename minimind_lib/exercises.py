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


# --- notebook 13: vision ------------------------------------------------------------------


@check("13.1")
def _patchify(answer):
    """``answer(pixels, p)`` cuts (B, C, H, W) into (B, N, C*p*p) row-major patches."""
    import torch

    from minimind_lib.vision import patchify

    pixels = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).reshape(2, 3, 8, 8)
    for p in (2, 4):
        got, want = answer(pixels, p), patchify(pixels, p)
        assert tuple(got.shape) == tuple(want.shape), \
            f"patch size {p}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        assert torch.equal(got, want), (f"patch size {p}: the shape is right but the numbers "
                                        "are not: each patch must hold its own p x p pixels of "
                                        "every channel (permute before the last reshape)")


@check("13.2")
def _caption_retrieval(answer):
    """``answer(similarity)``: the share of captions (columns) whose best picture is their own."""
    import torch

    similarity = torch.tensor([[5.0, 1.0, 0.0], [4.0, 3.0, 0.0], [0.0, 2.0, 1.0]])
    # by column: caption 0 -> picture 0 (right), caption 1 -> picture 1 (right), caption 2 ->
    # picture 2 (right); by row, picture 1 would pick caption 0 (wrong)
    got = float(answer(similarity))
    assert abs(got - 1.0) < 1e-6, (f"got {got}; read each column (a caption) and ask which "
                                    "picture (row) scores highest")
    shuffled = similarity[:, [1, 0, 2]]
    got = float(answer(shuffled))
    assert abs(got - 1 / 3) < 1e-6, f"with captions 0 and 1 swapped: got {got}, expected 1/3"


@check("13.3")
def _splice(answer):
    """``answer(embeds, input_ids, image_embeds)`` = ``vlm.splice``."""
    import torch

    from minimind_lib.vlm import IMAGE_TOKEN_ID, splice

    g = torch.Generator().manual_seed(0)
    slot = IMAGE_TOKEN_ID
    ids = torch.tensor([[1, slot, slot, slot, 5, 6], [slot, slot, slot, 7, 8, 9]])
    embeds = torch.randn(2, 6, 4, generator=g)
    images = torch.randn(2, 3, 4, generator=g)
    got = answer(embeds.clone(), ids, images)
    assert torch.equal(got, splice(embeds, ids, images)), (
        "row b's slots must hold image_embeds[b] in order, and every other position keep "
        "its token embedding")
