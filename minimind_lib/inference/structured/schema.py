"""From a JSON Schema to a regular expression (notebook 18), and a validator for the same subset.

The subset is what tool parameters and OpenAI's strict structured outputs use: ``type``
(object, string, integer, number, boolean, null, array, or a list of them), ``properties`` +
``required`` (properties in the schema's order, optional ones may be left out), ``enum`` /
``const`` of scalars, ``anyOf``, ``items`` + ``minItems`` / ``maxItems``, ``minLength`` /
``maxLength``, ``additionalProperties: false``. Annotations (``description``, ``title``,
``default``, ``examples``) are read past. Any other keyword is a ``SchemaError`` naming it and
where it sits: a constraint the grammar would silently drop (``minimum``, ``pattern``) would let
through output that fails the schema.

The pieces follow outlines-core's conventions (its ``build_regex_from_schema``), so the two
describe the same language and the token masks can be compared exactly: strings without
control characters, ``\\"`` ``\\\\`` ``\\/`` ``\\b`` ``\\f`` ``\\n`` ``\\r`` ``\\t`` escapes;
numbers without leading zeros, the exponent signed; at most one space (``[ ]?``) around the
punctuation.

>>> schema_to_regex({"type": "object", "properties": {"n": {"type": "integer"}},
...                  "required": ["n"]})
'\\\\{[ ]?"n"[ ]?:[ ]?(-)?(0|[1-9][0-9]*)[ ]?\\\\}'
>>> validate({"n": 1.5}, {"type": "object", "properties": {"n": {"type": "integer"}}})
['$.n: 1.5 is not of type integer']
"""

from __future__ import annotations

import json
import math
import re

WHITESPACE = r"[ ]?"
STRING_INNER = r'([^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])'
STRING = f'"{STRING_INNER}*"'
INTEGER = r"(-)?(0|[1-9][0-9]*)"
NUMBER = rf"({INTEGER})(\.[0-9]+)?([eE][+-][0-9]+)?"
BOOLEAN = r"(true|false)"
NULL = "null"
_SCALARS = {"string": STRING, "integer": INTEGER, "number": NUMBER, "boolean": BOOLEAN,
            "null": NULL}
_ANNOTATIONS = {"description", "title", "default", "examples", "$comment", "$schema",
                "strict"}
_KEYWORDS = {"type", "properties", "required", "enum", "const", "anyOf", "items", "minItems",
             "maxItems", "minLength", "maxLength", "additionalProperties"} | _ANNOTATIONS
GENERIC_DEPTH = 3  # {"type": "object"} without properties: JSON nested this deep at most
MAX_SCHEMA_DEPTH = 16


class SchemaError(ValueError):
    """A schema outside the supported subset; ``keyword`` and ``path`` say where."""

    def __init__(self, keyword: str, path: str, what: str) -> None:
        super().__init__(f"schema {path}: {what}")
        self.keyword, self.path = keyword, path


def _escape(text: str) -> str:
    return re.sub(r"([\\.^$|?*+()\[\]{}-])", r"\\\1", text)


def _literal(value: object, path: str) -> str:
    if isinstance(value, dict | list):
        raise SchemaError("enum", path, "enum and const values must be strings, numbers, "
                          "booleans or null")
    if isinstance(value, float) and not math.isfinite(value):
        raise SchemaError("enum", path, f"{value} is not a JSON number")
    return _escape(json.dumps(value, ensure_ascii=False))


def _int(schema: dict, key: str, path: str) -> int | None:
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1000:
        raise SchemaError(key, path, f"{key} must be an integer in 0..1000, got {value!r:.40}")
    return value


def _repeat(low: int, high: int | None) -> str:
    return f"{{{low},}}" if high is None else f"{{{low},{high}}}"


def schema_to_regex(schema: object, whitespace: str = WHITESPACE, path: str = "$",
                    depth: int = 0) -> str:
    """A regular expression whose matches are exactly the JSON texts this schema's grammar
    writes (each of them valid under the schema); ``SchemaError`` outside the subset."""
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaError("properties", path, f"nested deeper than {MAX_SCHEMA_DEPTH}")
    if schema is True or schema == {}:
        return _generic(whitespace, GENERIC_DEPTH)
    if not isinstance(schema, dict):
        raise SchemaError("type", path, f"a schema must be an object, got {schema!r:.40}")
    unknown = sorted(set(schema) - _KEYWORDS)
    if unknown:
        raise SchemaError(unknown[0], path, f"the keyword {unknown[0]!r:.40} is not supported "
                          "(supported: " + ", ".join(sorted(_KEYWORDS - _ANNOTATIONS)) + ")")
    ws = whitespace
    if "const" in schema:
        return _literal(schema["const"], f"{path}.const")
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            raise SchemaError("enum", path, "enum must be a non-empty list")
        return "(" + "|".join(_literal(v, f"{path}.enum") for v in values) + ")"
    if "anyOf" in schema:
        options = schema["anyOf"]
        if not isinstance(options, list) or not options:
            raise SchemaError("anyOf", path, "anyOf must be a non-empty list of schemas")
        return "(" + "|".join(schema_to_regex(s, ws, f"{path}.anyOf[{i}]", depth + 1)
                              for i, s in enumerate(options)) + ")"
    kind = schema.get("type")
    if isinstance(kind, list):
        if not kind:
            raise SchemaError("type", path, "type must not be an empty list")
        return "(" + "|".join("(?:" + schema_to_regex({**schema, "type": k}, ws, path, depth)
                              + ")" for k in kind) + ")"
    if kind == "object" or (kind is None and "properties" in schema):
        return _object(schema, ws, path, depth)
    if kind == "array":
        return _array(schema, ws, path, depth)
    if kind == "string":
        low, high = _int(schema, "minLength", path), _int(schema, "maxLength", path)
        if low is None and high is None:
            return STRING
        return f'"{STRING_INNER}{_repeat(low or 0, high)}"'
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind is None:
        return _generic(ws, GENERIC_DEPTH)
    raise SchemaError("type", path, f"type {kind!r:.40} is not one of "
                      + ", ".join(["object", "array", *_SCALARS]))


def _object(schema: dict, ws: str, path: str, depth: int) -> str:
    properties = schema.get("properties")
    extra = schema.get("additionalProperties", False if properties else None)
    if extra not in (False, None):
        raise SchemaError("additionalProperties", path, "only additionalProperties: false is "
                          "supported (the grammar writes the listed properties only)")
    if not properties:
        if properties is None and extra is None:
            return _generic_object(ws, GENERIC_DEPTH)
        return rf"\{{{ws}\}}"
    if not isinstance(properties, dict):
        raise SchemaError("properties", path, "properties must be an object")
    required = schema.get("required", [])
    if not isinstance(required, list) or any(r not in properties for r in required):
        raise SchemaError("required", path, "required must list names from properties")
    items = [(f'{ws}"{_escape(json.dumps(name, ensure_ascii=False)[1:-1])}"{ws}:{ws}'
              + schema_to_regex(sub, ws, f"{path}.{name}", depth + 1), name in required)
             for name, sub in properties.items()]
    if any(req for _, req in items):
        first = next(i for i, (_, req) in enumerate(items) if req)
        body = "".join(f"({item}{ws},)?" for item, _ in items[:first]) + items[first][0]
        for item, req in items[first + 1:]:
            body += f"{ws},{item}" if req else f"({ws},{item})?"
    else:  # which property comes first decides the rest
        options = []
        for k, (item, _) in enumerate(items):
            options.append(item + "".join(f"({ws},{later})?" for later, _ in items[k + 1:]))
        body = "(" + "|".join(options) + ")?"
    return rf"\{{{body}{ws}\}}"


def _array(schema: dict, ws: str, path: str, depth: int) -> str:
    item = schema_to_regex(schema.get("items", {}), ws, f"{path}.items", depth + 1)
    low, high = _int(schema, "minItems", path) or 0, _int(schema, "maxItems", path)
    if high is not None and high < low:
        raise SchemaError("maxItems", path, "maxItems must be >= minItems")
    if high == 0:
        return rf"\[{ws}\]"
    more = _repeat(max(low - 1, 0), None if high is None else high - 1)
    body = f"(({item})(,{ws}({item})){more})"
    return rf"\[{ws}{body if low else body + '?'}{ws}\]"


def _generic(ws: str, depth: int) -> str:
    """Any JSON value, containers nested at most ``depth`` deep."""
    scalars = [STRING, NUMBER, BOOLEAN, NULL]
    if depth > 0:
        scalars += [_generic_object(ws, depth), _generic_array(ws, depth)]
    return "(" + "|".join(scalars) + ")"


def _generic_object(ws: str, depth: int) -> str:
    pair = f"{STRING}{ws}:{ws}{_generic(ws, depth - 1)}"
    return rf"\{{{ws}({pair}({ws},{ws}{pair})*)?{ws}\}}"


def _generic_array(ws: str, depth: int) -> str:
    value = _generic(ws, depth - 1)
    return rf"\[{ws}({value}(,{ws}{value})*)?{ws}\]"


# ---------------------------------------------------------------- validation

_TYPES = {"string": lambda v: isinstance(v, str),
          "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
          "boolean": lambda v: isinstance(v, bool), "null": lambda v: v is None,
          "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list)}


def validate(instance: object, schema: object, path: str = "$") -> list[str]:
    """What is wrong with ``instance`` under ``schema`` (the subset above); [] when valid."""
    if schema is True or schema == {} or not isinstance(schema, dict):
        return []
    if "const" in schema:
        ok = instance == schema["const"] and type(instance) is type(schema["const"])
        return [] if ok else [f"{path}: {instance!r:.40} is not {schema['const']!r:.40}"]
    if "enum" in schema:
        ok = any(instance == v and type(instance) is type(v) for v in schema["enum"])
        return [] if ok else [f"{path}: {instance!r:.40} is not one of the enum"]
    if "anyOf" in schema:
        if any(not validate(instance, s, path) for s in schema["anyOf"]):
            return []
        return [f"{path}: {instance!r:.40} matches none of anyOf"]
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds] if kinds else []
    if kinds and not any(_TYPES[k](instance) for k in kinds if k in _TYPES):
        return [f"{path}: {instance!r:.40} is not of type {' or '.join(kinds)}"]
    problems: list[str] = []
    if isinstance(instance, dict):
        properties = schema.get("properties", {})
        problems += [f"{path}: missing required {name!r}" for name in schema.get("required", [])
                     if name not in instance]
        for name, value in instance.items():
            if name in properties:
                problems += validate(value, properties[name], f"{path}.{name}")
            elif schema.get("additionalProperties") is False:
                problems.append(f"{path}: property {name!r:.40} is not allowed")
    if isinstance(instance, list):
        if len(instance) < schema.get("minItems", 0):
            problems.append(f"{path}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(instance) > schema["maxItems"]:
            problems.append(f"{path}: more than {schema['maxItems']} items")
        for i, value in enumerate(instance):
            problems += validate(value, schema.get("items", {}), f"{path}[{i}]")
    if isinstance(instance, str):
        if len(instance) < schema.get("minLength", 0):
            problems.append(f"{path}: shorter than {schema['minLength']} characters")
        if "maxLength" in schema and len(instance) > schema["maxLength"]:
            problems.append(f"{path}: longer than {schema['maxLength']} characters")
    return problems
