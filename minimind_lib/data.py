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

import contextlib
import itertools
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from minimind_lib import DATA_DIR
from minimind_lib.files import PRETOKENIZED_META, atomic_write_text
from minimind_lib.model import IGNORE_INDEX
from minimind_lib.tokenizer import (
    END_OF_TEXT,
    IM_END,
    IM_START,
    BPETokenizer,
    chat_parts,
    text_problem,
)

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
    minimind_lib.data.DataFormatError: ...t.jsonl:2: field 'text' is missing
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
    minimind_lib.data.DataFormatError: x.jsonl:7: not valid UTF-8 (byte 0xe9 at column 14)
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


# --- where the data lives -------------------------------------------------------------

#: MiniMind's own file names, used when ``$MINIMIND_DATA_DIR`` points at them.
MINIMIND_FILES = {"pretrain": "pretrain_hq.jsonl", "sft": "sft_mini_512.jsonl", "dpo": "dpo.jsonl"}
#: Where ``python -m minimind_lib download data`` puts MiniMind's files by default.
DOWNLOAD_DIR = DATA_DIR / "minimind"
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


# --- pretraining data: a pre-tokenised uint16 memmap (notebook 04) ----------------------

SPLITS = ("train", "val")


def _file_fingerprint(path: Path) -> dict:
    stat = path.stat()
    return {"path": str(path.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


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
    if meta_path.is_file() and json.loads(meta_path.read_text())["sources"] == sources:
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
        raise FileNotFoundError(f"{out_dir}: no {PRETOKENIZED_META} (tokenize_corpus did not finish)")
    return PretrainDataset(Path(out_dir) / f"{split}.bin", seq_len)


# --- SFT: ChatML conversations with answer-only labels (notebook 05) ---------------------

def sft_segments(messages: Sequence[dict]) -> list[tuple[str, bool, bool]]:
    """The rendered conversation (``apply_chat_template``) as ``(text, is_special, supervised)``
    pieces: the assistant's content and the ``<|im_end|>`` closing its turn are supervised;
    system and user turns, role markers and newlines are not.

    >>> for seg in sft_segments([{"role": "user", "content": "1+1?"},
    ...                          {"role": "assistant", "content": "2"}])[4:]:
    ...     print(seg)
    ('<|im_start|>', True, False)
    ('user\\n1+1?', False, False)
    ('<|im_end|>', True, False)
    ('\\n', False, False)
    ('<|im_start|>', True, False)
    ('assistant\\n', False, False)
    ('2', False, True)
    ('<|im_end|>', True, True)
    ('\\n', False, False)
    """
    segments: list[tuple[str, bool, bool]] = []
    parts = chat_parts(messages)
    in_reply = False
    for k, (text, special) in enumerate(parts):
        if special:
            segments.append((text, True, in_reply and text == IM_END))
            in_reply = False
            continue
        role, _, content = text.partition("\n")
        if k > 0 and parts[k - 1][0] == IM_START and role == "assistant":
            # subtle: the role header and the reply are encoded apart, exactly as at inference,
            # where the prompt ends with the generation prompt "assistant\n" and the model
            # writes the reply's tokens after it (joined, BPE could merge across the "\n").
            segments += [("assistant\n", False, False), (content, False, True)]
            in_reply = True
        else:
            segments.append((text, False, False))
    return segments


def _assemble(tokenizer: BPETokenizer, segments: Sequence[tuple[str, bool, bool]],
              encoded: Iterator[list[int]], seq_len: int) -> tuple[list[int], list[int]]:
    """Join segment ids (``encoded`` holds the non-special ones, in order) and their labels."""
    ids: list[int] = []
    labels: list[int] = []
    for text, special, supervised in segments:
        piece = [tokenizer.token_to_id(text)] if special else next(encoded)
        ids += piece
        labels += piece if supervised else [IGNORE_INDEX] * len(piece)
    return ids[:seq_len], labels[:seq_len]


def sft_example(tokenizer: BPETokenizer, messages: Sequence[dict],
                seq_len: int) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of one conversation, cut to ``seq_len`` tokens.

    ``input_ids`` is the ChatML rendering; ``labels`` equals it on the assistant's content
    tokens and the ``<|im_end|>`` closing each assistant turn (every turn of a multi-turn
    chat), and is ``IGNORE_INDEX`` (-100) everywhere else. Labels are aligned with the inputs
    (the model shifts them). Truncation can leave no supervised token: ``SFTDataset`` skips
    and counts such examples.

    >>> from minimind_lib.tokenizer import load_tokenizer
    >>> tokenizer = load_tokenizer()
    >>> ids, labels = sft_example(tokenizer, [{"role": "user", "content": "Hi"},
    ...                                 {"role": "assistant", "content": "Hello!"}], 64)
    >>> tokenizer.decode([t for t in labels if t != IGNORE_INDEX])
    'Hello!<|im_end|>'
    >>> sum(t != IGNORE_INDEX for t in sft_example(tokenizer, [{"role": "user", "content": "Hi"},
    ...                                          {"role": "assistant", "content": "Hello!"}], 8)[1])
    0
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    segments = sft_segments(messages)
    encoded = (tokenizer.encode(t, allowed_special=set()) for t, special, _ in segments
               if not special)
    return _assemble(tokenizer, segments, encoded, seq_len)


class SFTDataset(Dataset):
    """Conversations as ``sft_example``s, for ``train(..., collate_fn=dataset.collate)``.

    ``answer_only=False`` puts the loss on every token instead (the notebook's ablation);
    the examples kept are the same either way. Examples whose truncation to ``seq_len``
    leaves no supervised token are dropped and counted in ``skipped``. Tokenisation runs
    once, in batches through ``BPETokenizer.encode_batch`` (the fast path, identical ids); ids
    live in one flat array.

    >>> from minimind_lib.tokenizer import load_tokenizer
    >>> chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    >>> ds = SFTDataset([{"conversations": chat}] * 2, load_tokenizer(), seq_len=64,
    ...                 progress=False)
    >>> batch = ds.collate([ds[0], ds[1]])
    >>> len(ds), ds.skipped, batch["input_ids"].shape == batch["labels"].shape
    (2, 0, True)
    >>> ds.lengths.tolist(), ds.num_targets   # per chat: "Hello!" (4 tokens) + <|im_end|>
    ([33, 33], 10)
    """

    def __init__(self, records: Iterable[dict], tokenizer: BPETokenizer, seq_len: int, *,
                 answer_only: bool = True, max_examples: int | None = None,
                 chunk_size: int = 2048, progress: bool = True):
        if seq_len <= 0:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        self.seq_len, self.answer_only = seq_len, answer_only
        self.pad_id = tokenizer.token_to_id(END_OF_TEXT)  # pads are never a target
        # 2 bytes per id when the vocabulary fits (MiniMind's 6,400 does): half of int32
        id_dtype = np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max + 1 else np.int32
        self.skipped = 0
        ids_parts: list[np.ndarray] = []
        mask_parts: list[np.ndarray] = []
        lengths: list[int] = []
        bar = tqdm(total=max_examples, unit="chat", desc="tokenise SFT", disable=not progress)
        records = iter(itertools.islice(records, max_examples))
        while chunk := list(itertools.islice(records, chunk_size)):
            all_segments = [sft_segments(r["conversations"]) for r in chunk]
            texts = [t for segs in all_segments for t, special, _ in segs if not special]
            encoded = iter(tokenizer.encode_batch(texts, allowed_special=set()))
            for segments in all_segments:
                ids, labels = _assemble(tokenizer, segments, encoded, seq_len)
                supervised = np.asarray(labels) != IGNORE_INDEX  # (L,)
                if not supervised.any():
                    self.skipped += 1
                    continue
                ids_parts.append(np.asarray(ids, dtype=id_dtype))
                mask_parts.append(supervised)
                lengths.append(len(ids))
            bar.update(len(chunk))
        bar.close()
        if not lengths:
            raise ValueError(f"no SFT example has a supervised token within seq_len "
                             f"{seq_len} ({self.skipped} skipped); raise seq_len")
        self._ids = np.concatenate(ids_parts)  # (total tokens,)
        self._supervised = np.concatenate(mask_parts)  # (total tokens,)
        self._offsets = np.concatenate([[0], np.cumsum(lengths)])  # (N + 1,)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """Tokens of every example, (N,)."""
        return np.diff(self._offsets)

    @property
    def num_targets(self) -> int:
        """Tokens that get a loss, over all examples (every token when not ``answer_only``)."""
        return int(self._supervised.sum()) if self.answer_only else len(self._ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        start, end = self._offsets[i], self._offsets[i + 1]
        ids = torch.from_numpy(self._ids[start:end].astype(np.int64))  # (L,)
        if not self.answer_only:
            return {"input_ids": ids, "labels": ids.clone()}
        keep = torch.from_numpy(self._supervised[start:end])  # (L,)
        return {"input_ids": ids, "labels": ids.masked_fill(~keep, IGNORE_INDEX)}

    def collate(self, batch: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Right-pad to the longest example of the batch: pad id in the inputs, -100 in the
        labels (causal attention keeps real tokens from seeing the pads on their right)."""
        return pad_sft_batch(batch, self.pad_id)


def pad_sft_batch(batch: Sequence[dict[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """Stack ``{"input_ids", "labels"}`` examples of different lengths into (B, T_max) tensors.

    >>> b = pad_sft_batch([{"input_ids": torch.tensor([5, 6, 7]), "labels": torch.tensor([-100, 6, 7])},
    ...                    {"input_ids": torch.tensor([5]), "labels": torch.tensor([-100])}], pad_id=0)
    >>> b["input_ids"].tolist(), b["labels"].tolist()
    ([[5, 6, 7], [5, 0, 0]], [[-100, 6, 7], [-100, -100, -100]])
    """
    width = max(len(x["input_ids"]) for x in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # (B, T)
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)  # (B, T)
    for row, x in enumerate(batch):
        input_ids[row, :len(x["input_ids"])] = x["input_ids"]
        labels[row, :len(x["labels"])] = x["labels"]
    return {"input_ids": input_ids, "labels": labels}
