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

import errno
import glob
import json
import os
import shutil
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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: the permissions a new file or folder gets from the user's umask (0644 / 0755 usually)
FILE_MODE, DIR_MODE = 0o666 & ~_umask(), 0o777 & ~_umask()
#: below this much free space a failed write is taken for a full disk
_NEARLY_FULL = 1 << 20


@contextmanager
def disk_full_named(path: str | Path) -> Iterator[None]:
    """Turn a write that failed because the disk is full (``OSError`` 28, or a library's own
    error, e.g. safetensors' ``SafetensorError ... os error 28`` or ``torch.save``'s
    ``unexpected pos``, while the disk has next to no space left) into ``OSError(ENOSPC)``
    naming ``path``.

    >>> import tempfile
    >>> with disk_full_named(Path(tempfile.mkdtemp()) / "x"):
    ...     raise OSError(errno.ENOSPC, "No space left on device")
    Traceback (most recent call last):
    ...
    OSError: [Errno 28] No space left on device: '/.../x'
    """
    try:
        yield
    except Exception as e:
        full = isinstance(e, OSError) and e.errno == errno.ENOSPC
        # a library's own error may carry only the words (safetensors: "os error 28", Rust's
        # "StorageFull"), and its partial file may be gone by now, freeing the space again
        said = any(w in str(e) for w in ("No space left on device", "os error 28",
                                        "StorageFull"))
        if full or said or _nearly_full(Path(path)):
            raise OSError(errno.ENOSPC, "No space left on device", str(path)) from e
        raise


def _nearly_full(path: Path) -> bool:
    folder = next((p for p in (path, *path.parents) if p.is_dir()), None)
    try:
        return folder is not None and shutil.disk_usage(folder).free < _NEARLY_FULL
    except OSError:
        return False


def remove_stale_temporaries(path: str | Path) -> None:
    """Delete the ``<name>.tmp-<pid>`` files or folders a killed process left beside ``path``
    (its pid no longer runs); a live process's are left alone."""
    path = Path(path)
    prefix = f"{path.name}.tmp-"
    if not path.parent.is_dir():
        return
    for stale in path.parent.glob(f"{glob.escape(path.name)}.tmp-*"):
        pid = stale.name[len(prefix):]
        if pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # somebody else's process: alive
        return True
    return True


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
    remove_stale_temporaries(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with disk_full_named(path):
            yield tmp
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.chmod(tmp, FILE_MODE)  # as a plain open() would: some writers make 0600 files
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
