"""Atomic writes, and reading the append-only logs a kill may have torn.

Writes are atomic: a file is written under a temporary name, flushed to disk, then
renamed over its target (``os.replace`` is atomic on POSIX and Windows), so a kill at any moment
leaves either the old file or the new one, never half of one.

>>> import tempfile
>>> p = Path(tempfile.mkdtemp()) / "x.txt"
>>> atomic_write_text(p, "hello")
>>> p.read_text()
'hello'
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Flush a folder's entries to disk (after a rename inside it)."""
    if os.name == "posix":  # a rename is durable only once its folder entry is flushed
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it over ``path``.

    If the body raises (or the process dies), ``path`` keeps its old content and the
    temporary file is removed (or left as ``*.tmp-<pid>``, ignored by every reader).

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "x.txt"
    >>> with atomic_path(p) as tmp:
    ...     _ = tmp.write_text("hello")
    >>> p.read_text()
    'hello'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (see ``atomic_path``)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")



def read_json_lines(path: str | Path) -> list[dict]:
    """The objects of an append-only jsonl log such as ``metrics.jsonl``, one per line.

    A kill -9 or a full disk can leave the last line half-written; that line is dropped with a
    warning (it is the row being logged when the run died). A broken line before the last one
    is not from an interrupted append: ``ValueError`` naming ``file:line``.

    >>> import tempfile, warnings
    >>> p = Path(tempfile.mkdtemp()) / "metrics.jsonl"
    >>> _ = p.write_text('{"step": 1}\\n{"step": 2, "lo')
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     rows = read_json_lines(p)
    >>> rows, str(caught[0].message).endswith("dropped a torn last line (an interrupted write)")
    ([{'step': 1}], True)
    """
    path = Path(path)
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    rows = []
    for k, (n, line) in enumerate(numbered):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, or nested past Python's stack
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif k == len(numbered) - 1:
            warnings.warn(f"{path}:{n}: dropped a torn last line (an interrupted write)",
                          stacklevel=2)
        else:
            raise ValueError(f"{path}:{n}: not a JSON object: {line[:60]!r}")
    return rows
