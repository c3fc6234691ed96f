"""Data: validated readers for MiniMind's jsonl formats (notebook 00).

The formats are MiniMind's own (MiniMind2's and MiniMind-3's), so its real datasets drop in
unchanged:

* ``pretrain``: ``{"text": "..."}``
* ``sft``: ``{"conversations": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."},
  ...]}``; a system message may carry ``tools`` and an assistant ``tool_calls`` (each a list or
  its JSON string) and ``reasoning_content`` (``tokenizer.chat3.normalise_messages`` says how);
* ``dpo``: ``{"chosen": [messages], "rejected": [messages]}``
* ``rl``: RL prompts (``rlaif.jsonl``): ``conversations`` ending with the assistant turn the
  policy samples (its content, often empty, is not used);
* ``agent_rl``: the same plus ``gt``, the list of strings or numbers a final answer must hold
  (``agent_rl.jsonl``, ``agent_rl_math.jsonl``).

Extra keys are allowed (the bundled files carry ``"task"`` and ``"answer"`` for
exact-match evaluation).  Anything malformed raises ``DataFormatError`` naming the
file, the line and what is wrong, e.g. ``data/x.jsonl:3: field 'text' is missing``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path

from minimind_lib import DATA_DIR
from minimind_lib.core.download import MINIMIND_FILES
from minimind_lib.tokenizer.bpe import text_problem
from minimind_lib.tokenizer.chat3 import normalise_messages

SCHEMAS = ("pretrain", "sft", "dpo", "rl", "agent_rl")


class DataFormatError(ValueError):
    """A jsonl file does not follow its schema; the message names file and line."""


def _check_messages(messages: object, field: str) -> str | None:
    """Return what is wrong with a message list, or None when it is valid.

    >>> _check_messages([{"role": "user", "content": "hi"}, {"role": "bot", "content": "x"}], "c")
    "c[1].role is 'bot'; expected one of system, user, assistant, tool"
    """
    if not isinstance(messages, list):
        return f"field {field!r} must be a list of messages, got {type(messages).__name__}"
    if not messages:
        return f"field {field!r} is an empty conversation"
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"{field}[{i}] must be an object with 'role' and 'content'"
        for key in ("role", "content"):
            if key not in m and not (key == "content" and m.get("tool_calls")):
                return f"{field}[{i}] has no {key!r}"
    try:
        normalised, _ = normalise_messages(messages, field)
    except ValueError as e:
        return str(e)
    for i, m in enumerate(normalised):
        for key in ("content", "reasoning_content"):
            problem = text_problem(m.get(key) or "")
            if problem:
                return f"{field}[{i}].{key} {problem}"
    if not any(m["role"] == "assistant" for m in messages):
        return f"field {field!r} has no assistant message (nothing to learn from)"
    return None


def _check_gt(record: dict) -> str | None:
    """``gt``: the strings (or numbers) an agent's final answer must contain."""
    if "gt" not in record:
        return "field 'gt' is missing (the answer an agent-RL rollout is checked against)"
    gt = record["gt"]
    if not isinstance(gt, list) or not all(
            isinstance(g, str | int | float) and not isinstance(g, bool) for g in gt):
        return f"field 'gt' must be a list of strings or numbers, got {gt!r:.80}"
    return gt_problem(gt)


def gt_problem(gt: list) -> str | None:
    """An entry of ``gt`` no answer can be checked against: an empty string (every answer
    contains it) or a number that is not finite (NaN, inf); None when all can be.

    >>> gt_problem(["9472", 12.5]) is None
    True
    >>> gt_problem([""])
    "field 'gt' holds an empty string: every answer contains it"
    >>> gt_problem([float("nan")])
    "field 'gt' holds nan: not a number an answer can contain"
    """
    for g in gt:
        if isinstance(g, str) and not g.strip():
            return "field 'gt' holds an empty string: every answer contains it"
        if isinstance(g, float) and not math.isfinite(g):
            return f"field 'gt' holds {g}: not a number an answer can contain"
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
    if schema in ("sft", "rl", "agent_rl"):
        if "conversations" not in record:
            return "field 'conversations' is missing"
        problem = _check_messages(record["conversations"], "conversations")
        if problem or schema == "sft":
            return problem
        if record["conversations"][-1]["role"] != "assistant":
            return ("field 'conversations' must end with the assistant turn the policy samples "
                    f"(its content is not used), got role {record['conversations'][-1]['role']!r}")
        if len(record["conversations"]) < 2:
            return "field 'conversations' has no prompt before its assistant turn"
        return _check_gt(record) if schema == "agent_rl" else None
    for key in ("chosen", "rejected"):  # dpo
        if key not in record:
            return f"field {key!r} is missing"
        problem = _check_messages(record[key], key)
        if problem:
            return problem
        if record[key][-1]["role"] != "assistant":
            return f"field {key!r} must end with an assistant message"
    return None


#: One record's line at most (MiniMind's longest SFT and pretraining lines are tens of KB): a
#: longer one is an error before it is read into memory or tokenised.
MAX_LINE_BYTES = 8 * 2**20


def read_jsonl(path: str | Path, schema: str) -> Iterator[dict]:
    """Yield the records of a jsonl file, validated against ``schema``.

    Blank lines are skipped; a file with no records is an error, and so is a line longer than
    ``MAX_LINE_BYTES`` (named with its number, before it is read whole). Validation happens
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
        for lineno, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), start=1):
            if len(raw) > MAX_LINE_BYTES:  # read no further than the limit: nothing is held
                raise DataFormatError(
                    f"{path}:{lineno}: the line is longer than {MAX_LINE_BYTES:,} bytes (the "
                    "limit of one record); split the document into several records")
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
    except ValueError as e:  # e.g. an integer of more than 4,300 digits (Python's own limit)
        raise DataFormatError(f"{path}:{lineno}: a value JSON cannot be read here ({e})") \
            from None
#: Bundled samples (``data/``); CC BY-SA-derived lines live in ``*_cc_by_sa.jsonl`` beside them.
BUNDLED_FILES = {"pretrain": "pretrain_sample", "sft": "sft_sample", "dpo": "dpo_sample",
                 "agent_rl": "agent_rl"}
#: Further bundled files of a schema, read after the sample: the tool-use and thinking
#: conversations (``scripts/build_tool_data.py``, notebook 14)
BUNDLED_EXTRA = {"sft": ("sft_tools",)}


def dataset_files(schema: str, data_dir: str | Path | None = None) -> list[Path]:
    """The jsonl files that make up the ``schema`` training set.

    With ``data_dir`` (else ``$MINIMIND_DATA_DIR``) set, MiniMind's file there: the first of
    ``MINIMIND_FILES[schema]`` present (MiniMind-3's quick file, its full one, MiniMind2's), an
    error naming the ``download`` command when none is; otherwise the bundled sample and its
    CC BY-SA companion when present, then its ``BUNDLED_EXTRA`` files (SFT: the tool-use data).
    """
    if schema not in SCHEMAS:
        raise ValueError(f"unknown schema {schema!r}; choose one of {', '.join(SCHEMAS)}")
    external = data_dir or os.environ.get("MINIMIND_DATA_DIR")
    if external:
        for name in MINIMIND_FILES[schema]:
            if (Path(external) / name).is_file():
                return [Path(external) / name]
        names = " or ".join(MINIMIND_FILES[schema])
        raise FileNotFoundError(
            f"{external} has no {names}: expected MiniMind's {schema} data there; get it with "
            f"`python -m minimind_lib download data --to {external}` (or point "
            "MINIMIND_DATA_DIR at it, or unset it to use the bundled data)")
    if schema not in BUNDLED_FILES:
        raise FileNotFoundError(f"the course bundles no {schema} file; download MiniMind's "
                                f"({' or '.join(MINIMIND_FILES[schema])}) and set "
                                "MINIMIND_DATA_DIR")
    stem = BUNDLED_FILES[schema]
    paths = [DATA_DIR / f"{stem}.jsonl", DATA_DIR / f"{stem}_cc_by_sa.jsonl",
             *(DATA_DIR / f"{extra}.jsonl" for extra in BUNDLED_EXTRA.get(schema, ()))]
    return [p for p in paths if p.is_file()]
