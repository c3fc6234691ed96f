"""Data: validated readers for MiniMind's three jsonl formats (notebook 00).

The formats are MiniMind's own, so its real datasets drop in unchanged:

* ``pretrain``: ``{"text": "..."}``
* ``sft``: ``{"conversations": [{"role": "user"|"assistant"|"system", "content": "..."}, ...]}``
* ``dpo``: ``{"chosen": [messages], "rejected": [messages]}``

Extra keys are allowed (the bundled files carry ``"task"`` and ``"answer"`` for
exact-match evaluation).  Anything malformed raises ``DataFormatError`` naming the
file, the line and what is wrong, e.g. ``data/x.jsonl:3: field 'text' is missing``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from minimind_lib import DATA_DIR
from minimind_lib.core.download import MINIMIND_FILES
from minimind_lib.tokenizer.bpe import text_problem
from minimind_lib.tokenizer.chat import CHAT_ROLES

SCHEMAS = ("pretrain", "sft", "dpo")


class DataFormatError(ValueError):
    """A jsonl file does not follow its schema; the message names file and line."""


def _check_messages(messages: object, field: str) -> str | None:
    """Return what is wrong with a message list, or None when it is valid.

    >>> _check_messages([{"role": "user", "content": "hi"}, {"role": "bot", "content": "x"}], "c")
    "c[1].role is 'bot'; expected one of system, user, assistant"
    """
    if not isinstance(messages, list):
        return f"field {field!r} must be a list of messages, got {type(messages).__name__}"
    if not messages:
        return f"field {field!r} is an empty conversation"
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"{field}[{i}] must be an object with 'role' and 'content'"
        for key in ("role", "content"):
            if key not in m:
                return f"{field}[{i}] has no {key!r}"
        if m["role"] not in CHAT_ROLES:
            return f"{field}[{i}].role is {m['role']!r}; expected one of {', '.join(CHAT_ROLES)}"
        if not isinstance(m["content"], str):
            return f"{field}[{i}].content must be a string, got {type(m['content']).__name__}"
        problem = text_problem(m["content"])
        if problem:
            return f"{field}[{i}].content {problem}"
    if not any(m["role"] == "assistant" for m in messages):
        return f"field {field!r} has no assistant message (nothing to learn from)"
    return None


def validate_record(record: object, schema: str) -> str | None:
    """What is wrong with one parsed record under ``schema``, or None when valid."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    if schema == "pretrain":
        if "text" not in record:
            return "field 'text' is missing"
        if not isinstance(record["text"], str):
            return f"field 'text' must be a string, got {type(record['text']).__name__}"
        if not record["text"].strip():
            return "field 'text' is empty"
        problem = text_problem(record["text"])
        return f"field 'text' {problem}" if problem else None
    if schema == "sft":
        if "conversations" not in record:
            return "field 'conversations' is missing"
        return _check_messages(record["conversations"], "conversations")
    for key in ("chosen", "rejected"):  # dpo
        if key not in record:
            return f"field {key!r} is missing"
        problem = _check_messages(record[key], key)
        if problem:
            return problem
        if record[key][-1]["role"] != "assistant":
            return f"field {key!r} must end with an assistant message"
    return None


def read_jsonl(path: str | Path, schema: str) -> Iterator[dict]:
    """Yield the records of a jsonl file, validated against ``schema``.

    Blank lines are skipped; a file with no records is an error.  Validation happens
    as lines are read, so a bad line 10,000 raises after the first 9,999 were yielded.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "t.jsonl")
    >>> _ = open(p, "w").write('{"text": "hello"}\\n{"txt": "oops"}\\n')
    >>> list(read_jsonl(p, "pretrain"))
    Traceback (most recent call last):
    ...
    minimind_lib.data.readers.DataFormatError: ...t.jsonl:2: field 'text' is missing
    """
    if schema not in SCHEMAS:
        raise ValueError(f"unknown schema {schema!r}; choose one of {', '.join(SCHEMAS)}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    n = 0
    with path.open("rb") as f:  # bytes: a line that is not UTF-8 is reported by its number
        for lineno, raw in enumerate(f, start=1):
            record = _parse_line(raw, path, lineno)
            if record is None:
                continue
            problem = validate_record(record, schema)
            if problem:
                raise DataFormatError(f"{path}:{lineno}: {problem}")
            n += 1
            yield record
    if n == 0:
        raise DataFormatError(f"{path}: the file has no records")


def _parse_line(raw: bytes, path: Path, lineno: int) -> object | None:
    """The JSON value of one line (None for a blank line); a ``DataFormatError`` naming
    ``path:lineno`` when the line is not UTF-8 or not JSON.

    >>> _parse_line(b'{"text": "caf\\xc3\\xa9"}\\n', Path("x.jsonl"), 1)
    {'text': 'café'}
    >>> _parse_line(b'{"text": "caf\\xe9"}', Path("x.jsonl"), 7)
    Traceback (most recent call last):
    ...
    minimind_lib.data.readers.DataFormatError: x.jsonl:7: not valid UTF-8 (byte 0xe9 at column 14)
    """
    try:
        # utf-8-sig on the first line: an editor's byte-order mark is not part of the JSON
        line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as e:
        raise DataFormatError(f"{path}:{lineno}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at "
                              f"column {e.start + 1})") from None
    if not line.strip():
        return None
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise DataFormatError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") \
            from None
    except RecursionError:  # json recurses once per nesting level
        raise DataFormatError(f"{path}:{lineno}: JSON nested too deeply to read") from None
#: Bundled samples (``data/``); CC BY-SA-derived lines live in ``*_cc_by_sa.jsonl`` beside them.
BUNDLED_FILES = {"pretrain": "pretrain_sample", "sft": "sft_sample", "dpo": "dpo_sample"}


def dataset_files(schema: str, data_dir: str | Path | None = None) -> list[Path]:
    """The jsonl files that make up the ``schema`` training set.

    With ``data_dir`` (else ``$MINIMIND_DATA_DIR``) set, MiniMind's file there (an error naming
    the ``download`` command when it is missing); otherwise the bundled sample and its CC
    BY-SA companion when present.
    """
    if schema not in SCHEMAS:
        raise ValueError(f"unknown schema {schema!r}; choose one of {', '.join(SCHEMAS)}")
    external = data_dir or os.environ.get("MINIMIND_DATA_DIR")
    if external:
        path = Path(external) / MINIMIND_FILES[schema]
        if not path.is_file():
            raise FileNotFoundError(
                f"{external} has no {MINIMIND_FILES[schema]}: expected MiniMind's "
                f"{', '.join(MINIMIND_FILES.values())} there; get them with `python -m "
                f"minimind_lib download data --to {external}` (or point MINIMIND_DATA_DIR at "
                "them, or unset it to use the bundled data)")
        return [path]
    stem = BUNDLED_FILES[schema]
    paths = [DATA_DIR / f"{stem}.jsonl", DATA_DIR / f"{stem}_cc_by_sa.jsonl"]
    return [p for p in paths if p.is_file()]
