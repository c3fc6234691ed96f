"""The pretraining stream (notebook 04): the corpus tokenized once into memory-mapped
``train.bin`` / ``val.bin`` (documents joined by ``<|endoftext|>``; ``tokenize_corpus``, reused
while the source files are unchanged) and ``PretrainDataset``, fixed-length windows over it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from minimind_lib.core.atomic import atomic_write_text
from minimind_lib.core.checked_files import read_json
from minimind_lib.core.filenames import PRETOKENIZED_META
from minimind_lib.data.readers import read_jsonl
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.special import END_OF_TEXT

# --- pretraining data: a pre-tokenised uint16 memmap (notebook 04) ----------------------

SPLITS = ("train", "val")


def _file_fingerprint(path: Path) -> dict:
    stat = path.stat()
    return {"path": str(path.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _previous_sources(meta_path: Path) -> dict | None:
    """What an earlier ``tokenize_corpus`` into this folder read (None: a damaged meta.json,
    which the next tokenisation replaces)."""
    try:
        return read_json(meta_path).get("sources")
    except ValueError:
        return None


def tokenize_corpus(
    files: list[str | Path],
    tokenizer_path: str | Path,
    out_dir: str | Path,
    *,
    max_examples: int | None = None,
    val_fraction: float = 0.02,
    eos_token: str = END_OF_TEXT,
    docs_per_batch: int = 512,
    progress: bool = True,
) -> Path:
    """Tokenise pretraining jsonl ``files`` into ``out_dir/{train,val}.bin`` + ``meta.json``.

    Each document's ids are followed by ``eos_token`` and appended to one long ``uint16``
    stream (a 6,400-token vocabulary fits in 2 bytes: half of int32's disk and page cache).
    Every ``round(1 / val_fraction)``-th document goes to the validation stream instead, so
    no document is split between the two. At most ``max_examples`` documents are read.
    Documents are encoded ``docs_per_batch`` at a time by ``BPETokenizer.encode_batch`` (the HF
    fast path, all cores) with ``allowed_special="all"``: special-token strings in the text
    become special ids, as MiniMind's pretraining data (``<|im_start|>``-wrapped) expects.

    ``meta.json`` is written last and records the sources, so a second call with the same
    inputs returns at once, and a half-written output is never mistaken for a finished one.
    """
    files, out_dir = [Path(f) for f in files], Path(out_dir)
    if not files:
        raise ValueError("tokenize_corpus: no input files")
    if not 0.0 <= val_fraction < 0.5:
        raise ValueError(f"val_fraction must be in [0, 0.5), got {val_fraction}")
    tokenizer = BPETokenizer.from_file(tokenizer_path)
    if eos_token not in tokenizer.vocab:
        raise ValueError(f"{tokenizer_path}: the tokenizer has no {eos_token!r} token")
    eos_id = tokenizer.token_to_id(eos_token)
    if len(tokenizer) > np.iinfo(np.uint16).max + 1:
        raise ValueError(f"{tokenizer_path}: vocabulary of {len(tokenizer)} does not fit uint16")
    sources = {"files": [_file_fingerprint(f) for f in files],
               "tokenizer": _file_fingerprint(Path(tokenizer_path)),
               "max_examples": max_examples, "val_fraction": val_fraction, "eos_id": eos_id}
    meta_path = out_dir / PRETOKENIZED_META
    if meta_path.is_file() and _previous_sources(meta_path) == sources:
        return out_dir

    out_dir.mkdir(parents=True, exist_ok=True)
    meta_path.unlink(missing_ok=True)
    val_every = round(1 / val_fraction) if val_fraction > 0 else 0
    counts = {s: {"tokens": 0, "documents": 0} for s in SPLITS}
    # written under temporary names: a reader of the previous streams never sees them change
    tmp = {s: out_dir / f"{s}.bin.tmp-{os.getpid()}" for s in SPLITS}
    n_docs = 0
    try:
        with contextlib.ExitStack() as stack:
            outs = {s: stack.enter_context(tmp[s].open("wb")) for s in SPLITS}
            bar = stack.enter_context(tqdm(total=max_examples, unit="doc", desc="tokenise",
                                           disable=not progress))
            texts: list[str] = []
            records = (r for f in files for r in read_jsonl(f, "pretrain"))
            for record in itertools.islice(records, max_examples):
                texts.append(record["text"])
                if len(texts) == docs_per_batch:
                    n_docs = _write_docs(tokenizer, texts, n_docs, val_every, eos_id, outs, counts)
                    bar.update(len(texts))
                    texts = []
            n_docs = _write_docs(tokenizer, texts, n_docs, val_every, eos_id, outs, counts)
            bar.update(len(texts))
    except BaseException:  # a bad line or an interrupt: leave no half-written stream behind
        for path in tmp.values():
            path.unlink(missing_ok=True)
        raise
    for s in SPLITS:
        os.replace(tmp[s], out_dir / f"{s}.bin")
    meta = {"dtype": "uint16", "vocab_size": len(tokenizer), "eos_id": eos_id,
            "splits": counts, "sources": sources}
    atomic_write_text(meta_path, json.dumps(meta, indent=2) + "\n")
    return out_dir


def _write_docs(tokenizer: BPETokenizer, texts: list[str], n_docs: int, val_every: int,
                eos_id: int, outs: dict, counts: dict) -> int:
    """Encode a batch of documents and append each (+ eos) to its split's stream."""
    for doc_ids in tokenizer.encode_batch(texts, allowed_special="all"):
        split = "val" if val_every and n_docs % val_every == val_every - 1 else "train"
        ids = np.asarray(doc_ids + [eos_id], dtype=np.uint16)  # (L + 1,)
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
            raise FileNotFoundError(f"{self.path}: no such token file (run tokenize_corpus first)")
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
    """The ``split`` ("train" or "val") of a ``tokenize_corpus`` output folder."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose train or val")
    if not (Path(out_dir) / PRETOKENIZED_META).is_file():
        raise FileNotFoundError(f"{out_dir}: no {PRETOKENIZED_META} "
                                "(tokenize_corpus did not finish)")
    return PretrainDataset(Path(out_dir) / f"{split}.bin", seq_len)
