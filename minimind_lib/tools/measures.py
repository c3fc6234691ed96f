"""Unit conversion and date arithmetic for the course's tools (notebook 14): exact decimal
factors (an inch is 0.0254 m by definition), ISO dates, and an error naming the bad argument.

>>> convert_units(3, "ft", "cm"), convert_units(100, "C", "F"), convert_units(1, "lb", "g")
('91.44', '212', '453.59237')
>>> days_between("2026-01-01", "2026-12-03"), weekday("2026-12-03")
(336, 'Thursday')
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal, InvalidOperation

#: unit -> (quantity, size in the quantity's base unit: metre, kilogram, second, litre)
UNITS: dict[str, tuple[str, Decimal]] = {
    "mm": ("length", Decimal("0.001")), "cm": ("length", Decimal("0.01")),
    "m": ("length", Decimal(1)), "km": ("length", Decimal(1000)),
    "in": ("length", Decimal("0.0254")), "ft": ("length", Decimal("0.3048")),
    "yd": ("length", Decimal("0.9144")), "mi": ("length", Decimal("1609.344")),
    "mg": ("mass", Decimal("0.000001")), "g": ("mass", Decimal("0.001")),
    "kg": ("mass", Decimal(1)), "t": ("mass", Decimal(1000)),
    "oz": ("mass", Decimal("0.028349523125")), "lb": ("mass", Decimal("0.45359237")),
    "s": ("time", Decimal(1)), "min": ("time", Decimal(60)), "h": ("time", Decimal(3600)),
    "day": ("time", Decimal(86400)), "week": ("time", Decimal(604800)),
    "ml": ("volume", Decimal("0.001")), "l": ("volume", Decimal(1)),
    "C": ("temperature", Decimal(1)), "F": ("temperature", Decimal(1)),
    "K": ("temperature", Decimal(1)),
}
MAX_MAGNITUDE = Decimal("1e15")  # of the value converted: no quantity a question needs is larger
PLACES = Decimal("0.000001")  # results are rounded to six decimal places
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def _number(value: object, field: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{field} must be a number, got {type(value).__name__}")
    try:
        number = Decimal(repr(value) if isinstance(value, float) else str(value).strip())
    except InvalidOperation:
        raise ValueError(f"{field} must be a number, got {value!r:.40}") from None
    if not number.is_finite() or abs(number) > MAX_MAGNITUDE:
        raise ValueError(f"{field} must be a finite number within ±{MAX_MAGNITUDE:.0e}")
    return number


def _unit(name: object, field: str) -> tuple[str, Decimal]:
    if not isinstance(name, str) or name.strip() not in UNITS:
        raise ValueError(f"{field} {name!r:.40} is not a unit I know; known: "
                         f"{', '.join(UNITS)}")
    return UNITS[name.strip()]


def _to_kelvin(value: Decimal, unit: str) -> Decimal:
    return {"K": value, "C": value + Decimal("273.15"),
            "F": (value - 32) * 5 / 9 + Decimal("273.15")}[unit]


def _from_kelvin(value: Decimal, unit: str) -> Decimal:
    return {"K": value, "C": value - Decimal("273.15"),
            "F": (value - Decimal("273.15")) * 9 / 5 + 32}[unit]


def _text(x: Decimal) -> str:
    x = x.quantize(PLACES)
    return str(int(x)) if x == x.to_integral_value() else format(x.normalize(), "f")


def convert_units(value: object, from_unit: object, to_unit: object) -> str:
    """``value`` in ``from_unit`` expressed in ``to_unit`` (same quantity), as text."""
    number = _number(value, "value")
    (kind, size), (to_kind, to_size) = _unit(from_unit, "from_unit"), _unit(to_unit, "to_unit")
    if kind != to_kind:
        raise ValueError(f"cannot convert {kind} ({from_unit}) to {to_kind} ({to_unit})")
    if kind == "temperature":
        return _text(_from_kelvin(_to_kelvin(number, from_unit.strip()), to_unit.strip()))
    return _text(number * size / to_size)


_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _date(value: object, field: str) -> dt.date:
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a date string YYYY-MM-DD, got {type(value).__name__}")
    text = value.strip()
    # exactly YYYY-MM-DD: fromisoformat alone also reads 20200101 and 2020-W01-1
    if not _ISO_DATE.fullmatch(text):
        raise ValueError(f"{field} {value!r:.40} is not a date YYYY-MM-DD")
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{field} {value!r:.40} is not a date YYYY-MM-DD") from None


def days_between(start: object, end: object) -> int:
    """Days from ``start`` to ``end`` (negative when ``end`` comes first)."""
    return (_date(end, "end") - _date(start, "start")).days


def weekday(date: object) -> str:
    """The English name of the day of the week of ``date``."""
    return WEEKDAYS[_date(date, "date").weekday()]
