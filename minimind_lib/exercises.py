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
