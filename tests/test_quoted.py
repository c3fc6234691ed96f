"""Every rate and decimal figure a notebook's "What you should see" box quotes is a range its run
asserts.

``course.quoted.check_quoted`` prints and asserts the ranges of a ``QUOTED`` dict; this test
reads each notebook's boxes and its ``QUOTED`` literals (per profile: ``{"smoke": {...},
"cpu": {...}}``) and fails on a percentage or a decimal figure in a box that no quoted bound
matches. A whole number written with a thousands separator (1,069; 17,610) must be a bound of a
quoted range or a number in the notebook's code (an assert, a setting it checks); smaller whole
numbers are not read (they are counts, steps and settings as often as figures).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from minimind_lib.course.quoted import _bound, check_quoted, describe

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
#: notebooks whose boxes are not yet ranges checked by their run (empty since issue 31; keep it
#: so: a new notebook must not be added here)
NOT_YET: set[str] = set()
PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*%")
RANGE = re.compile(r"(\d+(?:\.\d+)?)\s*%?\s*[-–]\s*(\d+(?:\.\d+)?)\s*%")
#: a decimal figure (2.71, 1,048.5); not one after "=" (a setting: β = 0.1), not in code or maths
DECIMAL = re.compile(r"(?<![\w.=])(?<!= )(\d[\d,]*\.\d+)(?![\w.])")
#: a whole number with a thousands separator (1,069), not part of a decimal
THOUSANDS = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+)(?![\w,]|\.\d)")


def _cells(path: Path) -> list[tuple[str, str]]:
    return [(c["cell_type"], "".join(c["source"])) for c in json.loads(path.read_text())["cells"]]


def boxes(path: Path) -> list[str]:
    """Each box's text: from "What you should see" to the next heading of its cell."""
    found = []
    for kind, source in _cells(path):
        if kind == "markdown" and "What you should see" in source:
            start = source.rfind("\n", 0, source.index("What you should see")) + 1
            found.append(re.split(r"\n#+ ", source[start:])[0])
    return found


def quoted_ranges(path: Path) -> list[tuple]:
    """Every range of every ``QUOTED = {...}`` literal in the notebook's code, and of every dict
    literal handed to ``check_quoted`` directly."""
    literals = []
    for kind, source in _cells(path):
        if kind != "code" or ("QUOTED" not in source and "check_quoted" not in source):
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "QUOTED" for t in node.targets):
                literals.append(node.value)
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "check_quoted"
                  and node.args and isinstance(node.args[0], ast.Dict)):
                literals.append(node.args[0])
    found = []
    stack = [ast.literal_eval(node) for node in literals]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        else:
            found.append(tuple(value))
    return found


def uncovered(box: str, ranges: list[tuple]) -> list[str]:
    """The box's percentages that are not bounds of a quoted rate range, and its decimal figures
    that are not bounds of any range (to the precision the box writes them)."""
    bounds = {_bound(b) for r in ranges if len(r) == 2 for b in r}
    numbers = [n for pair in RANGE.findall(box) for n in pair] + PERCENT.findall(box)
    missing = {n for n in numbers if f"{float(n):.4g}" not in bounds}
    # a decimal may be any bound: a formatted one as written, a rate's as a fraction or percent
    values = [float(b) * scale for r in ranges for b in r[:2]
              for scale in ((1,) if len(r) == 3 else (1, 100))]
    prose = re.sub(r"\$[^$]*\$", "", re.sub(r"`[^`]*`", "", box))    # code and maths: names
    for n in DECIMAL.findall(prose):
        tolerance = 0.5 * 10 ** -len(n.split(".")[1]) + 1e-12
        if not any(abs(float(n.replace(",", "")) - v) <= tolerance for v in values):
            missing.add(n)
    return sorted(missing)


def code_numbers(path: Path) -> set[float]:
    """Every int and float literal in the notebook's code cells (``1_069`` included)."""
    found = set()
    for kind, source in _cells(path):
        if kind != "code":
            continue
        lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.Constant) and type(node.value) in (int, float):
                found.add(float(node.value))
    return found


def uncovered_counts(box: str, ranges: list[tuple], numbers: set[float]) -> list[str]:
    """The box's thousands-separated whole numbers that are neither a bound of a range nor a
    number in the code."""
    bounds = {float(b) for r in ranges for b in r[:2]} | numbers
    prose = re.sub(r"\$[^$]*\$", "", re.sub(r"`[^`]*`", "", box))
    return sorted({n for n in THOUSANDS.findall(prose) if float(n.replace(",", "")) not in bounds})


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_large_whole_number_is_checked(path):
    ranges, numbers = quoted_ranges(path), code_numbers(path)
    for box in boxes(path):
        missing = uncovered_counts(box, ranges, numbers)
        assert not missing, (f"{path.name}: the box {box[:60]!r}... quotes {missing}, which "
                             "no QUOTED range or number in the notebook's code checks")


def test_uncovered_counts_reads_only_thousands():
    box = "What you should see: 17,610 conversations, 80 steps, 1,042,138 tokens, 4,458.5 ppl"
    assert uncovered_counts(box, [], set()) == ["1,042,138", "17,610"]
    assert uncovered_counts(box, [(17610, 17610, "{:,}")], {1042138.0}) == []


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem not in NOT_YET],
                         ids=lambda p: p.stem)
def test_every_quoted_rate_is_a_checked_range(path):
    ranges = quoted_ranges(path)
    for box in boxes(path):
        missing = uncovered(box, ranges)
        assert not missing, (f"{path.name}: the box {box[:60]!r}... quotes {missing}, "
                             "which no QUOTED range of the notebook checks")


def test_uncovered_finds_a_figure_no_range_checks():
    box = "**What you should see**: format rate 85-100%, skill 30%, loss 2.50-3.10 at β = 0.1."
    assert uncovered(box, [(0.85, 1.0), (2.5, 3.1, "{:.2f}")]) == ["30"]
    assert uncovered(box, [(0.85, 1.0), (0.2, 0.3)]) == ["2.50", "3.10"]
    assert uncovered(box, [(0.85, 1.0), (0.2, 0.3), (2.5, 3.1, "{:.2f}")]) == []
    assert uncovered("What you should see: `x = 2.5` in the code", []) == []
    assert describe((0.025, 0.5)) == ("2.5-50%", "{:.1%}")


def test_check_quoted_fails_on_a_drifted_or_missing_figure():
    check_quoted({"a": (0.1, 0.2)}, {"a": 0.15})
    with pytest.raises(AssertionError, match="a: the text says 10-20%, this run 30.0%"):
        check_quoted({"a": (0.1, 0.2)}, {"a": 0.3})
    with pytest.raises(KeyError, match="quoted but not measured: b"):
        check_quoted({"b": (0.0, 1.0)}, {})
