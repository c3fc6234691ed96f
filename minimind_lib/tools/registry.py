"""The course's tools (notebook 14): OpenAI function schemas (``tool_schemas``) and the safe
executor (``execute_tool``). A model's call is data: a name looked up in a fixed table and
arguments checked against the schema (required, known, typed) before a plain Python function
runs; no text is ever evaluated as code. Whatever goes wrong comes back as the JSON string the
model reads next (``{"error": ...}``), never as an exception.

>>> execute_tool("calculate", {"expression": "256 * 37"})
'{"result": "9472"}'
>>> execute_tool("calculate", '{"expression": "__import__(\\'os\\')"}')
'{"error": "only numbers and + - * / // % ** ( ) are allowed; found a call (__import__)"}'
>>> print(execute_tool("rm", {}))  # doctest: +NORMALIZE_WHITESPACE
{"error": "unknown tool 'rm'; the tools are calculate, convert_units, days_between, weekday,
poem_author"}
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from minimind_lib.tools.arithmetic import calculate
from minimind_lib.tools.lookup import poem_author
from minimind_lib.tools.measures import UNITS, convert_units, days_between, weekday

MAX_ARGUMENT_CHARS = 2000  # a JSON arguments string longer than this is refused unread


@dataclass(frozen=True)
class Tool:
    """One tool: its name, what the model is told about it, its parameters (JSON-schema types
    ``string`` / ``number`` / ``integer``, all required) and the function that answers."""

    name: str
    description: str
    parameters: dict[str, tuple[str, str]]  # name -> (JSON type, description)
    function: Callable[..., object]

    def schema(self) -> dict:
        """The OpenAI function schema (what ``tools=[...]`` carries)."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object",
                           "properties": {k: {"type": t, "description": d}
                                          for k, (t, d) in self.parameters.items()},
                           "required": list(self.parameters)}}}


_UNIT_LIST = ", ".join(UNITS)
TOOLS: dict[str, Tool] = {t.name: t for t in (
    Tool("calculate", "Evaluate an arithmetic expression exactly: integers and decimals with "
         "+ - * / // % ** and parentheses.",
         {"expression": ("string", "the expression, e.g. (12.5 + 3) * 4")}, calculate),
    Tool("convert_units", f"Convert a quantity between units of length, mass, time, volume or "
         f"temperature ({_UNIT_LIST}).",
         {"value": ("number", "the quantity"), "from_unit": ("string", "its unit"),
          "to_unit": ("string", "the unit wanted")}, convert_units),
    Tool("days_between", "The number of days from one date to another (YYYY-MM-DD).",
         {"start": ("string", "the first date"), "end": ("string", "the second date")},
         days_between),
    Tool("weekday", "The day of the week of a date (YYYY-MM-DD).",
         {"date": ("string", "the date")}, weekday),
    Tool("poem_author", "Who wrote a classical Chinese poem, by its title.",
         {"title": ("string", "the poem's title, e.g. 静夜思")}, poem_author),
)}


def tool_schemas(names: list[str] | None = None) -> list[dict]:
    """The course's tools as OpenAI function schemas (all, or those ``names``).

    >>> [s["function"]["name"] for s in tool_schemas()][:2]
    ['calculate', 'convert_units']
    """
    unknown = sorted(set(names or ()) - set(TOOLS))
    if unknown:
        raise ValueError(f"unknown tool(s) {', '.join(unknown)}; the tools are "
                         f"{', '.join(TOOLS)}")
    return [TOOLS[n].schema() for n in (names or TOOLS)]


_JSON_TYPES = {"string": (str,), "number": (int, float), "integer": (int,)}


def _arguments(tool: Tool, arguments: object) -> dict:
    """The call's arguments as a dict, checked against the schema; ``ValueError`` naming the
    first problem."""
    if isinstance(arguments, str):
        if len(arguments) > MAX_ARGUMENT_CHARS:
            raise ValueError(f"arguments are longer than {MAX_ARGUMENT_CHARS} characters")
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError) as e:
            raise ValueError(f"arguments are not valid JSON ({getattr(e, 'msg', 'too deep')})") \
                from None
    if not isinstance(arguments, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(arguments).__name__}")
    extra = sorted(set(arguments) - set(tool.parameters), key=str)
    if extra:
        raise ValueError(f"{tool.name} has no argument {extra[0]!r:.40}; its arguments are "
                         f"{', '.join(tool.parameters)}")
    for name, (kind, _) in tool.parameters.items():
        if name not in arguments:
            raise ValueError(f"{tool.name} needs the argument {name!r}")
        value = arguments[name]
        if isinstance(value, bool) or not isinstance(value, _JSON_TYPES[kind]):
            raise ValueError(f"{tool.name}: {name} must be a {kind}, got "
                             f"{type(value).__name__}")
    return arguments


def execute_tool(name: object, arguments: object) -> str:
    """Run the course's tool ``name`` on ``arguments`` (a dict or its JSON string); the JSON
    string the model reads: ``{"result": ...}`` or ``{"error": ...}``."""
    try:
        if not isinstance(name, str) or name not in TOOLS:
            raise ValueError(f"unknown tool {name!r:.40}; the tools are {', '.join(TOOLS)}")
        tool = TOOLS[name]
        result = tool.function(**_arguments(tool, arguments))
    except ValueError as e:  # CalculatorError is one: every refusal is a message
        return json.dumps({"error": str(e)}, ensure_ascii=False)
    return json.dumps({"result": result}, ensure_ascii=False)
