"""Reading the files the library keeps (run folders, tokenizers, configs): the one checked
JSON and TOML loader. Whatever is wrong (missing, not UTF-8, not JSON, nested past Python's
stack, the wrong kind of value at the top) is a ``FileProblem`` whose message starts with the
file's path and says what is wrong, never a bare ``JSONDecodeError``, ``KeyError`` or
``RecursionError``.

>>> import tempfile
>>> p = Path(tempfile.mkdtemp()) / "stage.json"
>>> _ = p.write_text('{"stage": "sft", "run_id"')
>>> def problem(path, **kw):
...     try:
...         read_json(path, **kw)
...     except FileProblem as e:
...         print(e)
>>> problem(p)
/.../stage.json: not valid JSON (Expecting ':' delimiter at line 1, column 26): the file is ...
>>> _ = p.write_text('[1, 2]')
>>> problem(p)
/.../stage.json: expected a JSON object, got a list
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

_KINDS = {dict: "a JSON object", list: "a JSON list", str: "a string"}


class FileProblem(ValueError):
    """A file that is not what it should be; the message names it and what is wrong."""


def _kind(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "true/false",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def read_text(path: str | os.PathLike) -> str:
    """``path`` as UTF-8 text; a missing file or one that is not UTF-8 is named."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise FileProblem(f"{path}: a folder, not a file") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileProblem(f"{path}: not UTF-8 text (byte {e.start} is {data[e.start]:#04x})"
                          ) from None


def read_json(path: str | os.PathLike, expect: type = dict) -> Any:
    """The JSON value of ``path``, which must be of type ``expect`` (an object by default)."""
    text = read_text(path)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise FileProblem(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column "
                          f"{e.colno}): the file is cut short or damaged") from None
    except RecursionError:
        raise FileProblem(f"{path}: JSON nested too deeply to read") from None
    if not isinstance(value, expect):
        raise FileProblem(f"{path}: expected {_KINDS.get(expect, expect.__name__)}, got "
                          f"{_kind(value)}")
    return value


def read_toml(path: str | os.PathLike) -> dict:
    """The tables of a TOML file (``--config FILE.toml``), its problems named."""
    text = read_text(path)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise FileProblem(f"{path}: not valid TOML ({e})") from None
    except RecursionError:
        raise FileProblem(f"{path}: TOML nested too deeply to read") from None
