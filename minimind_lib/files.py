"""File names and atomic writes: the one place that knows what a run folder holds.

Every file the library writes has its name here, so a reader (and ``grep``) finds one
definition.  Writes are atomic: a file is written under a temporary name, flushed to disk, then
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

# --- a model folder (``checkpoint.save_model`` / ``load_model``) ---------------------------
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"  # the MiniMindConfig fields as one flat json object
QUANT_FILE = "quantization.json"  # present in int8 folders: the format and the int8 groups
TOKENIZER_FILE = "tokenizer.json"  # HF tokenizer.json

# --- the vision stage's folders (``vision.save_clip``, ``vlm.save_vlm``) -----------------------
CLIP_DIR = "clip"  # <out>/vision/clip/: the tiny CLIP (a CLIP folder)
VLM_DIR = "vlm"  # <out>/vision/vlm/: the vision-language model (a VLM folder)
CLIP_CONFIG_FILE = "clip_config.json"  # a CLIP folder: the CLIPConfig (+ model.safetensors)
VISION_FILE = "vision.safetensors"  # a VLM folder: image encoder + projector weights
VISION_CONFIG_FILE = "vision.json"  # a VLM folder: their config (+ the LM's own files)
# --- a LoRA adapter folder (``lora.save_adapter``: PEFT's file names) ------------------------
ADAPTER_CONFIG_FILE = "adapter_config.json"  # PEFT's LoraConfig fields
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"  # base_model.model.<module>.lora_A.weight ...
MERGED_DIR = "merged"  # the lora stage's merged model (a model folder)

# --- a training run (``train.train``) -------------------------------------------------------
METRICS_FILE = "metrics.jsonl"  # one json object per optimizer step
CHECKPOINTS_DIR = "checkpoints"  # step_NNNNNNN/ folders and the ``latest`` pointer
LATEST_FILE = "latest"
STATE_FILE = "train_state.pt"  # optimizer, scaler, RNG, data position
PRETOKENIZED_META = "meta.json"  # beside train.bin / val.bin (``data.tokenize_corpus``)

# --- a stage folder (``pipeline.ensure``) and the run report ---------------------------------
MARKER_FILE = "stage.json"  # written last: the stage finished, and from what
RUN_CONFIG_FILE = "run_config.json"  # written first: the fully resolved settings it runs with
EVAL_FILE = "eval.json"  # held-out scores of the models a stage compares
FORMATS_FILE = "formats.md"  # the quantize stage's format table
REPORT_FILE = "report.md"
FIGURES_DIR = "figures"


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
