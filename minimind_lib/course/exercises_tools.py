"""Notebook 14's exercise checks (tools and thinking): reading calls out of a reply, a
calculator that walks the parse tree, comparing a call with the expected one. Each compares
the answer with the library's own piece on small cases; ``course.exercises`` registers them
(``NOTEBOOK_14``), so this module needs nothing from it.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from contextlib import contextmanager

from minimind_lib.evaluation.tool_use import same_arguments
from minimind_lib.tokenizer.special import TOOL_CALL, TOOL_CALL_END
from minimind_lib.tools.calls import parse_tool_calls

_REPLIES = [f"{TOOL_CALL}\n{body}\n{TOOL_CALL_END}" for body in (
    '{"name": "weekday", "arguments": {"date": "2026-04-01"}}',
    '{"name": "calculate", "arguments": "{\\"expression\\": \\"7*6\\"}"}',  # a JSON string
    '{"name": "calculate", "arguments": {oops}',  # not JSON
    '["not", "an", "object"]',
    '{"name": 5, "arguments": {"expression": "1+1"}}',  # a name that is not a string
    '{"name": "calculate", "arguments": ["1+1"]}',  # arguments that are not an object
    '{"name": "weekday", "arguments": {"date": "2026-04-01"}, "id": "c1"}',  # an extra key
)] + [
    f'Two calls.\n{TOOL_CALL}\n{{"name": "calculate", "arguments": {{"expression": "2+2"}}}}'
    f'\n{TOOL_CALL_END}\n{TOOL_CALL}\n{{"name": "poem_author", "arguments": {{"title": '
    f'"静夜思"}}}}\n{TOOL_CALL_END}',
    "No call here, just an answer.",
]


def _answer(answer: Callable, *args: object) -> object:
    """The student's result; an exception it raises is a failed check, saying so."""
    try:
        return answer(*args)
    except NotImplementedError:
        raise
    except Exception as e:
        raise AssertionError(f"your function raised {type(e).__name__}: {e} on "
                             f"{', '.join(repr(a)[:80] for a in args)}") from None


def _read_calls(answer: Callable) -> None:
    """``answer(text)`` -> the list of ``{"name", "arguments"}`` (a dict) of every block that
    parses; a malformed block is skipped, never raised."""
    for text in _REPLIES:
        want = parse_tool_calls(text).calls
        got = _answer(answer, text)
        assert got == want, f"on {text!r:.90}: got {got!r:.120}, expected {want!r:.120}"


@contextmanager
def _no_eval():
    """``eval`` and ``exec`` raise while the check runs: the answer must walk the tree
    itself."""
    saved = {n: getattr(builtins, n) for n in ("eval", "exec")}

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("evaluating the text as Python (eval/exec) is what this "
                             "exercise must never do")

    try:
        for name in saved:
            setattr(builtins, name, refuse)
        yield
    finally:
        for name, f in saved.items():
            setattr(builtins, name, f)


def _walk_arithmetic(answer: Callable) -> None:
    """``answer(tree)`` for ``tree = ast.parse(expression, mode="eval").body``: the value of
    + - * / and unary minus over numbers; anything else raises ``ValueError``."""
    import ast

    cases = {"1 + 2 * 3": 7, "(1 + 2) * 3": 9, "-4 / 8": -0.5, "2.5 * 4 - 1": 9.0,
             "-(3 - 10)": 7}
    hostile = ("__import__('os').getcwd()", "x + 1", "2 ** 10", "(1).__class__", "[1, 2]",
               "'a' * 3", "True + 1", "7 % 3", "7 // 2", "+5", "not 1", "1 < 2", "2j",
               "-True")
    trees = {text: ast.parse(text, mode="eval").body for text in (*cases, *hostile)}
    with _no_eval():
        for text, want in cases.items():
            got = _answer(answer, trees[text])
            assert isinstance(got, int | float) and math.isclose(got, want), \
                f"{text}: got {got!r}, expected {want}"
        for text in hostile:
            try:
                got = answer(trees[text])
            except ValueError:
                continue
            except Exception as e:
                raise AssertionError(f"{text}: raised {type(e).__name__}, expected a "
                                     "ValueError naming what is not allowed") from None
            raise AssertionError(f"{text}: got {got!r}; it must be refused with ValueError")


def _same_call(answer: Callable) -> None:
    """``answer(got, want)``: the call ``got`` (``{"name", "arguments"}`` or None) is the
    expected ``want``: same tool, arguments equal after parsing (``same_arguments``)."""
    want = {"name": "convert_units", "arguments": {"value": 3, "from_unit": "km",
                                                   "to_unit": "m"}}
    one = {"name": "convert_units", "arguments": {"value": 1, "from_unit": "km",
                                                  "to_unit": "m"}}
    cases = [
        (want, want), (None, want),
        ({"name": "convert_units", "arguments": {"value": 3.0, "from_unit": "km",
                                                 "to_unit": "m"}}, want),
        ({"name": "convert_units", "arguments": {"value": 3, "from_unit": " km",
                                                 "to_unit": "m"}}, want),
        ({"name": "calculate", "arguments": want["arguments"]}, want),
        ({"name": "convert_units", "arguments": {"value": "3", "from_unit": "km",
                                                 "to_unit": "m"}}, want),
        ({"name": "convert_units", "arguments": {"value": 3, "from_unit": "km"}}, want),
        ({"name": "convert_units", "arguments": {**want["arguments"], "round": 2}}, want),
        ({"name": "convert_units", "arguments": {**one["arguments"], "value": True}}, one),
        ({"name": "convert_units", "arguments": {**want["arguments"], "from_unit": "KM"}},
         want),
    ]
    for got, wanted in cases:
        verdict = _answer(answer, got, wanted)
        expected = got is not None and got["name"] == wanted["name"] and \
            same_arguments(got["arguments"], wanted["arguments"])
        assert verdict == expected, (f"{got} against {wanted['arguments']}: your answer says "
                                     f"{verdict}, expected {expected}")


#: exercise id -> its check (``course.exercises`` registers them)
NOTEBOOK_14 = {"14.1": _read_calls, "14.2": _walk_arithmetic, "14.3": _same_call}
