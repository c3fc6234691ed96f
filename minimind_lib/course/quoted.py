"""Figures a notebook quotes, checked by the run that shows them.

A "What you should see" box gives each figure as a range (``85-100%``); the code cell after
it names the same ranges in a ``QUOTED`` dict and calls ``check_quoted`` with this run's
values. It prints both and fails (so nbval fails) the day the text and the code part ways.

A range is ``(low, high)`` for a rate, printed as percentages, or ``(low, high, "{:.2f}")``
for any other number, printed with that format. A measured value may be a list (one figure
for several models, or every step): every one must fall in the range.
``tests/test_quoted.py`` reads every box and fails on a percentage or a decimal figure that no
``QUOTED`` range of its notebook covers.

With ``$MINIMIND_QUOTED_RECORD`` set to a file, each check also appends one JSON line per figure
(name, range, values) to that file and prints a drift instead of raising, so one run collects
every figure of a notebook: ``benchmarks/quoted_spread.py`` runs the notebooks that way over
seeds, thread counts, precisions and CPU code paths and prints the ranges that are too tight.

>>> check_quoted({"format rate": (0.85, 1.0), "loss": (2.0, 3.5, "{:.2f}")},
...              {"format rate": 0.925, "loss": 2.71})
the text says 85-100% for format rate: this run 92.5%
the text says 2.00-3.50 for loss: this run 2.71
>>> check_quoted({"loss": (2.0, 3.5, "{:.2f} nats")}, {"loss": [2.71, 3.02]})
the text says 2.00-3.50 nats for loss: this run 2.71 nats, 3.02 nats
>>> check_quoted({"documents": (7526, 7526, "{:,}"), "share": (0.0119, 0.0119)},
...              {"documents": 7526, "share": 0.0119})
the text says 7,526 for documents: this run 7,526
the text says 1.19% for share: this run 1.19%
>>> check_quoted({"format rate": (0.85, 1.0)}, {"format rate": 0.5})  # doctest: +ELLIPSIS
Traceback (most recent call last):
AssertionError: format rate: the text says 85-100%, this run 50.0%: the notebook's text (or...
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

#: ``(low, high)`` (a rate) or ``(low, high, format)``
Range = tuple[float, float] | tuple[float, float, str]
#: a file that collects every checked figure as JSON lines (and turns drifts into prints)
RECORD_ENV = "MINIMIND_QUOTED_RECORD"


def _bound(value: float) -> str:
    """A rate's bound as the box writes it: ``0.85`` -> ``85``, ``0.025`` -> ``2.5``."""
    return f"{value * 100:.4g}"


def describe(quoted: Range) -> tuple[str, str]:
    """(the range as the text writes it, the format of a measured value)."""
    if len(quoted) == 3:
        low, high, fmt = quoted
        number, _, unit = fmt.rpartition("}")          # "{:.2f} nats": the unit once
        number += "}"
        text = number.format(low) if low == high else f"{number.format(low)}-{number.format(high)}"
        return text + unit, fmt
    low, high = quoted
    decimals = max(len(_bound(b).partition(".")[2]) for b in (low, high))
    text = f"{_bound(low)}%" if low == high else f"{_bound(low)}-{_bound(high)}%"
    return text, f"{{:.{max(1, decimals)}%}}"        # a value as precise as its bounds


def check_quoted(quoted: Mapping[str, Range],
                 measured: Mapping[str, float | Sequence[float]]) -> None:
    """Print each quoted range beside this run's value; raise ``AssertionError`` naming every
    figure outside its range (or quoted and not measured)."""
    missing = sorted(set(quoted) - set(measured))
    if missing:
        raise KeyError(f"quoted but not measured: {', '.join(missing)}")
    drifted, records = [], []
    for name, bounds in quoted.items():
        text, fmt = describe(bounds)
        got = measured[name]
        values = [v if isinstance(v, int) else float(v)
                  for v in (got if isinstance(got, Sequence) else [got])]
        shown = (", ".join(fmt.format(v) for v in values) if len(values) <= 4 else
                 f"{fmt.format(min(values))} to {fmt.format(max(values))} ({len(values)} values)")
        print(f"the text says {text} for {name}: this run {shown}")
        records.append({"name": name, "range": list(bounds), "text": text, "values": values})
        if not all(bounds[0] <= v <= bounds[1] for v in values):
            drifted.append(f"{name}: the text says {text}, this run {shown}")
    record_to = os.environ.get(RECORD_ENV)
    if record_to:
        with open(record_to, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        if drifted:
            print("drifted (recorded, not raised):", "; ".join(drifted))
    elif drifted:
        raise AssertionError("; ".join(drifted) + ": the notebook's text (or the run) has drifted")
