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

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from minimind_lib import DATA_DIR
from minimind_lib.checkpoint import atomic_write_text

SCHEMAS = ("pretrain", "sft", "dpo")
ROLES = ("system", "user", "assistant")


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
        if m["role"] not in ROLES:
            return f"{field}[{i}].role is {m['role']!r}; expected one of {', '.join(ROLES)}"
        if not isinstance(m["content"], str):
            return f"{field}[{i}].content must be a string, got {type(m['content']).__name__}"
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
        return None
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
    minimind_lib.data.DataFormatError: ...t.jsonl:2: field 'text' is missing
    """
    if schema not in SCHEMAS:
        raise ValueError(f"unknown schema {schema!r}; choose one of {', '.join(SCHEMAS)}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    n = 0
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFormatError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
            problem = validate_record(record, schema)
            if problem:
                raise DataFormatError(f"{path}:{lineno}: {problem}")
            n += 1
            yield record
    if n == 0:
        raise DataFormatError(f"{path}: the file has no records")


# --- where the data lives -------------------------------------------------------------

#: MiniMind's own file names, used when ``$MINIMIND_DATA_DIR`` points at them.
MINIMIND_FILES = {"pretrain": "pretrain_hq.jsonl", "sft": "sft_mini_512.jsonl", "dpo": "dpo.jsonl"}
#: Bundled samples (``data/``); CC BY-SA-derived lines live in ``*_cc_by_sa.jsonl`` beside them.
BUNDLED_FILES = {"pretrain": "pretrain_sample", "sft": "sft_sample", "dpo": "dpo_sample"}


def dataset_files(schema: str, data_dir: str | Path | None = None) -> list[Path]:
    """The jsonl files that make up the ``schema`` training set.

    With ``$MINIMIND_DATA_DIR`` (or ``data_dir``) set and MiniMind's file there, that
    one file; otherwise the bundled sample and its CC BY-SA companion when present.
    """
    if schema not in SCHEMAS:
        raise ValueError(f"unknown schema {schema!r}; choose one of {', '.join(SCHEMAS)}")
    external = data_dir or os.environ.get("MINIMIND_DATA_DIR")
    if external:
        path = Path(external) / MINIMIND_FILES[schema]
        if not path.is_file():
            raise FileNotFoundError(
                f"MINIMIND_DATA_DIR={external} has no {MINIMIND_FILES[schema]}; expected MiniMind's "
                f"{', '.join(MINIMIND_FILES.values())} there (or unset it to use the bundled data)"
            )
        return [path]
    stem = BUNDLED_FILES[schema]
    paths = [DATA_DIR / f"{stem}.jsonl", DATA_DIR / f"{stem}_cc_by_sa.jsonl"]
    return [p for p in paths if p.is_file()]


# --- pretraining data: a pre-tokenised uint16 memmap (notebook 04) ----------------------

PRETOKENIZED_META = "meta.json"
SPLITS = ("train", "val")


def _file_fingerprint(path: Path) -> dict:
    stat = path.stat()
    return {"path": str(path.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def pretokenize(
    files: list[str | Path],
    tokenizer_path: str | Path,
    out_dir: str | Path,
    *,
    max_examples: int | None = None,
    val_fraction: float = 0.02,
    eos_token: str = "<|endoftext|>",
    docs_per_batch: int = 512,
    progress: bool = True,
) -> Path:
    """Tokenise pretraining jsonl ``files`` into ``out_dir/{train,val}.bin`` + ``meta.json``.

    Each document's ids are followed by ``eos_token`` and appended to one long ``uint16``
    stream (a 6,400-token vocabulary fits in 2 bytes: half of int32's disk and page cache).
    Every ``round(1 / val_fraction)``-th document goes to the validation stream instead, so
    no document is split between the two. At most ``max_examples`` documents are read.
    Documents are encoded ``docs_per_batch`` at a time by the Rust tokenizer (all cores).

    ``meta.json`` is written last and records the sources, so a second call with the same
    inputs returns at once, and a half-written output is never mistaken for a finished one.
    """
    from tokenizers import Tokenizer

    files, out_dir = [Path(f) for f in files], Path(out_dir)
    if not files:
        raise ValueError("pretokenize: no input files")
    if not 0.0 <= val_fraction < 0.5:
        raise ValueError(f"val_fraction must be in [0, 0.5), got {val_fraction}")
    tok = Tokenizer.from_file(str(tokenizer_path))
    eos_id = tok.token_to_id(eos_token)
    if eos_id is None:
        raise ValueError(f"{tokenizer_path}: the tokenizer has no {eos_token!r} token")
    if tok.get_vocab_size() > np.iinfo(np.uint16).max + 1:
        raise ValueError(f"{tokenizer_path}: vocabulary of {tok.get_vocab_size()} does not fit uint16")
    sources = {"files": [_file_fingerprint(f) for f in files],
               "tokenizer": _file_fingerprint(Path(tokenizer_path)),
               "max_examples": max_examples, "val_fraction": val_fraction, "eos_id": eos_id}
    meta_path = out_dir / PRETOKENIZED_META
    if meta_path.is_file() and json.loads(meta_path.read_text())["sources"] == sources:
        return out_dir

    out_dir.mkdir(parents=True, exist_ok=True)
    meta_path.unlink(missing_ok=True)
    val_every = round(1 / val_fraction) if val_fraction > 0 else 0
    counts = {s: {"tokens": 0, "documents": 0} for s in SPLITS}
    outs = {s: (out_dir / f"{s}.bin").open("wb") for s in SPLITS}
    bar = tqdm(total=max_examples, unit="doc", desc="tokenise", disable=not progress)
    n_docs = 0
    try:
        texts: list[str] = []
        records = (r for f in files for r in read_jsonl(f, "pretrain"))
        for record in itertools.islice(records, max_examples):
            texts.append(record["text"])
            if len(texts) == docs_per_batch:
                n_docs = _write_docs(tok, texts, n_docs, val_every, eos_id, outs, counts)
                bar.update(len(texts))
                texts = []
        n_docs = _write_docs(tok, texts, n_docs, val_every, eos_id, outs, counts)
        bar.update(len(texts))
    finally:
        bar.close()
        for f in outs.values():
            f.close()
    meta = {"dtype": "uint16", "vocab_size": tok.get_vocab_size(), "eos_id": eos_id,
            "splits": counts, "sources": sources}
    atomic_write_text(meta_path, json.dumps(meta, indent=2) + "\n")
    return out_dir


def _write_docs(tok, texts: list[str], n_docs: int, val_every: int, eos_id: int,
                outs: dict, counts: dict) -> int:
    """Encode a batch of documents and append each (+ eos) to its split's stream."""
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        split = "val" if val_every and n_docs % val_every == val_every - 1 else "train"
        ids = np.asarray(enc.ids + [eos_id], dtype=np.uint16)  # (L + 1,)
        ids.tofile(outs[split])
        counts[split]["tokens"] += len(ids)
        counts[split]["documents"] += 1
        n_docs += 1
    return n_docs


class PretrainDataset(Dataset):
    """Windows of ``seq_len + 1`` tokens from a pre-tokenised stream, as training examples.

    Window ``i`` is ``tokens[i*T : i*T + T + 1]`` (``T = seq_len``): consecutive windows
    share one token, so every token after the first is a prediction target exactly once.
    The model shifts labels itself, so ``input_ids`` and ``labels`` are the same window and
    the loss covers its ``T`` next-token predictions.

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "train.bin"
    >>> np.arange(10, dtype=np.uint16).tofile(p)
    >>> ds = PretrainDataset(p, seq_len=4)
    >>> len(ds), ds[1]["input_ids"].tolist()
    (2, [4, 5, 6, 7, 8])
    """

    def __init__(self, path: str | Path, seq_len: int):
        self.path, self.seq_len = Path(path), seq_len
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such token file (run pretokenize first)")
        n_tokens = self.path.stat().st_size // np.dtype(np.uint16).itemsize
        self.num_windows = (n_tokens - 1) // seq_len
        if self.num_windows <= 0:
            raise ValueError(f"{self.path}: {n_tokens} tokens do not fill one window of "
                             f"{seq_len + 1}; lower seq_len or add data")
        self._tokens: np.memmap | None = None

    def __len__(self) -> int:
        return self.num_windows

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self._tokens is None:  # opened lazily, so worker processes each map the file
            self._tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        start = i * self.seq_len
        window = torch.from_numpy(self._tokens[start:start + self.seq_len + 1].astype(np.int64))
        return {"input_ids": window, "labels": window}  # (T + 1,) each

    def __getstate__(self) -> dict:  # pickled for spawn-started workers: never ship the map
        return {**self.__dict__, "_tokens": None}


def load_pretrain_split(out_dir: str | Path, split: str, seq_len: int) -> PretrainDataset:
    """The ``split`` ("train" or "val") of a ``pretokenize`` output folder."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose train or val")
    if not (Path(out_dir) / PRETOKENIZED_META).is_file():
        raise FileNotFoundError(f"{out_dir}: no {PRETOKENIZED_META} (pretokenize did not finish)")
    return PretrainDataset(Path(out_dir) / f"{split}.bin", seq_len)
