"""Byte-level BPE, the tokenizer half (notebook 01): GPT-2's bytes -> characters map, its
pre-tokenization regex, and ``BPETokenizer``, which applies learned merges (``encode``), maps
ids back to text (``decode``) and reads and writes HF's ``tokenizer.json``. Training the merges
is ``tokenizer.training``.

>>> tok = load_tokenizer()
>>> tok.decode(tok.encode("你好, world"))
'你好, world'
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import regex

from minimind_lib import DATA_DIR
from minimind_lib.core.checked_files import read_json
from minimind_lib.core.filenames import TOKENIZER_FILE, TOKENIZER_FILES
from minimind_lib.tokenizer.chat3 import jinja_template_of
from minimind_lib.tokenizer.special import END_OF_TEXT, IM_END, IM_START

#: The course tokenizer: ``train_bpe(<texts of COURSE_CORPUS>, COURSE_VOCAB_SIZE)``,
#: rebuilt by ``python scripts/train_tokenizer.py``.
COURSE_TOKENIZER_DIR = DATA_DIR / "tokenizer"  # also tokenizer_config.json for transformers
COURSE_TOKENIZER = COURSE_TOKENIZER_DIR / TOKENIZER_FILE
COURSE_CORPUS = DATA_DIR / "pretrain_sample.jsonl"
COURSE_VOCAB_SIZE = 6400

#: GPT-2's pre-tokenization regex, exactly as HF ``ByteLevel(use_regex=True)`` uses it:
#: contractions, letters (with one leading space), digits, other symbols, whitespace.
#: subtle: ``\s+(?!\S)`` leaves the last space of a run for the next word, so
#: "a   b" -> ["a", "  ", " b"] and every word but the first keeps its leading space.
#: subtle: ``\p{L}`` / ``\p{N}`` come from the ``regex`` package's Unicode tables, which
#: are newer than those of tokenizers' Oniguruma: 17,480 code points (e.g. U+0558), all
#: unassigned in Python 3.11's Unicode 14, are letters to one and not the other.  Every
#: character Python's tables know splits identically (tests/test_tokenizer.py).
GPT2_SPLIT_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_SPLIT = regex.compile(GPT2_SPLIT_PATTERN)


# --- 1-2. bytes, the byte -> character map, pre-tokenization ---------------------------


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte (0-255) to a printable character.

    Printable Latin-1 bytes map to themselves; the other 68 (control bytes, space,
    ...) map to ``chr(256 + k)`` in byte order, so a byte-level token is a readable,
    whitespace-free string.

    >>> m = bytes_to_unicode()
    >>> m[ord("a")], m[ord(" ")], m[ord("\\n")], len(set(m.values()))
    ('a', 'Ġ', 'Ċ', 256)
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in mapping)
    mapping.update({b: chr(256 + k) for k, b in enumerate(shifted)})
    return dict(sorted(mapping.items()))


# str.translate table: Latin-1 code point (= byte value) -> mapped character, and back
_BYTE_TABLE = bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TABLE.items()}


def to_byte_level(text: str) -> str:
    """The UTF-8 bytes of ``text``, one mapped character per byte.

    >>> to_byte_level("hi 你")   # 你 is 3 UTF-8 bytes: e4 bd a0
    'hiĠä½ł'
    """
    # subtle: decoding as Latin-1 turns each byte into the code point of the same value
    return text.encode("utf-8").decode("latin-1").translate(_BYTE_TABLE)


_SURROGATE = regex.compile("[\ud800-\udfff]")


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be encoded (it has no UTF-8 bytes), or None when it can.

    The one case: a lone surrogate (U+D800..U+DFFF), which a JSON ``"\\ud800"`` escape or a
    terminal's undecodable input can put in a Python string.

    >>> text_problem("héllo"), text_problem("ab\\ud800")
    (None, 'holds a lone surrogate U+D800 at character 2 (not valid Unicode text)')
    """
    if text.isascii():
        return None
    bad = _SURROGATE.search(text)
    if bad is None:
        return None
    return (f"holds a lone surrogate U+{ord(bad.group()):04X} at character {bad.start()} "
            f"(not valid Unicode text)")


def pretokenize(text: str) -> list[str]:
    """Split ``text`` into GPT-2 words (not yet byte-level mapped).

    >>> pretokenize("Hello world,  你好!!\\n")
    ['Hello', ' world', ',', ' ', ' 你好', '!!', '\\n']
    """
    return _SPLIT.findall(text)


# --- 4. the tokenizer: encode / decode / save / load ----------------------------------------


@dataclass(frozen=True)
class AddedToken:
    """A token matched in raw text before pre-tokenization (HF's "added token")."""

    content: str
    id: int
    special: bool = True  # specials can be skipped when decoding and disallowed when encoding
    normalized: bool = False  # HF matches normalized=True tokens in a second pass


class BPETokenizer:
    """A byte-level BPE tokenizer: vocab, ranked merges, added (special) tokens.

    Build one with ``train_bpe``, ``train_bpe_fast`` or ``BPETokenizer.from_file``.
    ``encode`` equals ``tokenizers.Tokenizer.encode(text).ids`` on any text.

    >>> tok = load_tokenizer()
    >>> ids = tok.encode("你好, world! <|im_end|>")
    >>> ids[-1], tok.decode(ids)
    (2, '你好, world! <|im_end|>')
    """

    def __init__(self, vocab: dict[str, int], merges: Sequence[tuple[str, str]],
                 added_tokens: Sequence[AddedToken] = (), *, add_prefix_space: bool = False,
                 use_regex: bool = True, ignore_merges: bool = False,
                 cache_size: int = 100_000) -> None:
        missing = [c for c in _BYTE_TABLE.values() if c not in vocab]
        if missing:
            raise ValueError(f"the vocab lacks {len(missing)} of the 256 byte symbols (e.g. "
                             f"{missing[0]!r}); supported: byte-level BPE holding all 256")
        self._model_vocab = dict(vocab)  # what BPE itself knows (added tokens aside)
        self.vocab = {**vocab, **{t.content: t.id for t in added_tokens}}  # added ids win, as in HF
        self.merges = [tuple(m) for m in merges]
        self.added_tokens = list(added_tokens)
        (self.add_prefix_space, self.use_regex,
         self.ignore_merges) = add_prefix_space, use_regex, ignore_merges
        self._id_to_token = {i: t for t, i in vocab.items()}
        self._id_to_token.update({t.id: t.content for t in added_tokens})
        # merges as ids: (left, right) -> (rank, merged id), HF's MergeMap
        self._ranks: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, (a, b) in enumerate(self.merges):
            for part in (a, b, a + b):
                if part not in vocab:
                    raise ValueError(f"merge #{rank} {a!r} + {b!r}: {part!r} is not in the vocab")
            self._ranks[(vocab[a], vocab[b])] = (rank, vocab[a + b])
        self._token_bytes = {i: _token_bytes(t) for i, t in self._id_to_token.items()}
        self._special = {t.content: t.id for t in added_tokens if t.special}
        self._added = {t.content for t in added_tokens}
        self._cache: dict[str, list[int]] = {}
        self._cache_size = cache_size
        self._fast: dict[bool, object] = {}  # encode_batch's HF tokenizers, built on first use

    # -- lookups --

    def __len__(self) -> int:
        return len(self._id_to_token)

    @property
    def vocab_size(self) -> int:
        return len(self)

    @property
    def special_tokens(self) -> list[str]:
        return list(self._special)

    def is_special(self, token: str) -> bool:
        """Whether ``token`` is one of this tokenizer's special tokens (a dict lookup)."""
        return token in self._special

    def reserves(self, token: str) -> bool:
        """Whether ``token`` is an added token (one id, never split), special or not."""
        return token in self._added

    def token_to_id(self, token: str) -> int:
        if token not in self.vocab:
            raise KeyError(f"{token!r} is not a token of this tokenizer")
        return self.vocab[token]

    def id_to_token(self, token_id: int) -> str:
        if token_id not in self._id_to_token:
            raise ValueError(f"token id {token_id} is out of range (vocab size {len(self)})")
        return self._id_to_token[token_id]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a token may hold part of a UTF-8 character)."""
        self.id_to_token(token_id)  # range check
        return self._token_bytes[token_id]

    # -- encoding --

    def encode(self, text: str, allowed_special: str | set[str] = "all") -> list[int]:
        """Token ids of ``text``; ``allowed_special`` says which special-token strings
        become special ids ("all", or a set such as ``set()``: then they are plain text).

        >>> tok = load_tokenizer()
        >>> len(tok.encode("<|im_start|>")), len(tok.encode("<|im_start|>", allowed_special=set()))
        (1, 8)
        """
        ids: list[int] = []
        for piece, token_id in self._split_added(text, self._matchable(allowed_special)):
            if token_id is not None:
                ids.append(token_id)
            else:
                ids.extend(self._encode_ordinary(piece))
        return ids

    def encode_batch(self, texts: Sequence[str],
                     allowed_special: str | set[str]) -> list[list[int]]:
        """``[self.encode(t, allowed_special) for t in texts]``, computed by HF ``tokenizers``.

        The fast path, on purpose: the Rust tokenizer built from this tokenizer's own
        ``tokenizer.json`` (``to_dict``, once per tokenizer and mode) encodes the batch on
        every core and yields the same ids as ``encode`` (``tests/test_tokenizer.py`` checks
        it on the bundled corpus). Training and evaluation data go through here; ``encode``
        stays the readable reference. ``allowed_special`` is ``"all"`` (special-token strings in
        the text become special ids, as MiniMind's pretraining data expects) or ``set()`` (they
        stay plain text, as message content does in ``encode_chat``).

        >>> tok = load_tokenizer()
        >>> text = "hi <|im_end|>"
        >>> (tok.encode_batch([text], allowed_special=set())
        ...  == [tok.encode(text, allowed_special=set())])
        True
        >>> tok.encode_batch([text], allowed_special="all")[0][-1]   # the special id of <|im_end|>
        2
        """
        if allowed_special == "all":
            as_text = False
        elif isinstance(allowed_special, (set, frozenset)) and not allowed_special:
            as_text = True
        else:
            raise ValueError(f"encode_batch takes allowed_special='all' or set() (the two modes of "
                             f"the fast path), got {allowed_special!r}; use encode for a subset")
        fast = self._fast.get(as_text)
        if fast is None:
            from tokenizers import Tokenizer

            fast = Tokenizer.from_str(json.dumps(self.to_dict()))
            fast.encode_special_tokens = as_text  # True: special-token strings are plain text
            self._fast[as_text] = fast
        return [e.ids for e in fast.encode_batch(list(texts), add_special_tokens=False)]

    def _matchable(self, allowed_special: str | set[str]) -> frozenset[str]:
        if allowed_special == "all":
            allowed = set(self._special)
        elif isinstance(allowed_special, (set, frozenset)):
            unknown = set(allowed_special) - set(self._special)
            if unknown:
                raise ValueError(f"allowed_special names unknown special tokens {sorted(unknown)}; "
                                 f"this tokenizer's are {self.special_tokens}")
            allowed = set(allowed_special)
        else:
            raise ValueError("allowed_special must be 'all' or a set of strings, "
                             f"got {allowed_special!r}")
        # non-special added tokens are always matched (as in HF)
        return frozenset(allowed | {t.content for t in self.added_tokens if not t.special})

    def _split_added(self, text: str, matchable: frozenset[str]) -> list[tuple[str, int | None]]:
        """Cut out added tokens: HF first matches the normalized=False ones, then the rest."""
        pieces: list[tuple[str, int | None]] = [(text, None)]
        for normalized in (False, True):
            pattern = _added_pattern(frozenset(
                t.content for t in self.added_tokens
                if t.content in matchable and t.normalized == normalized))
            if pattern is None:
                continue
            out: list[tuple[str, int | None]] = []
            for piece, token_id in pieces:
                if token_id is not None:
                    out.append((piece, token_id))
                    continue
                start = 0
                for m in pattern.finditer(piece):
                    if m.start() > start:
                        out.append((piece[start:m.start()], None))
                    out.append((m.group(), self.vocab[m.group()]))
                    start = m.end()
                if start < len(piece):
                    out.append((piece[start:], None))
            pieces = out
        return pieces

    def _encode_ordinary(self, text: str) -> list[int]:
        """Ids of text without added tokens: pre-tokenize, then BPE each word (cached)."""
        if self.add_prefix_space and not text.startswith(" "):
            text = " " + text
        ids: list[int] = []
        for word in (_SPLIT.findall(text) if self.use_regex else [text]):
            cached = self._cache.get(word)
            if cached is None:
                cached = self._bpe(to_byte_level(word))
                if len(self._cache) >= self._cache_size:
                    self._cache.clear()
                self._cache[word] = cached
            ids.extend(cached)
        return ids

    def _bpe(self, word: str) -> list[int]:
        """Apply merges to one byte-level word, lowest rank first (HF's ``merge_all``).

        A heap holds (rank, position) of every mergeable adjacent pair; symbols form
        a linked list, so a merge only creates the two pairs around it.
        """
        if self.ignore_merges and word in self._model_vocab:
            return [self._model_vocab[word]]
        sym = [self._model_vocab[c] for c in word]
        n = len(sym)
        nxt, prv, alive = list(range(1, n)) + [-1], list(range(-1, n - 1)), [True] * n
        get, pop, push = self._ranks.get, heapq.heappop, heapq.heappush
        heap = []  # (rank, left position, merged id)
        for i, pair in enumerate(itertools.pairwise(sym)):
            merge = get(pair)
            if merge is not None:
                heap.append((merge[0], i, merge[1]))
        heapq.heapify(heap)
        while heap:
            _, i, new = pop(heap)
            j = nxt[i]
            if j == -1 or not alive[i]:
                continue
            current = get((sym[i], sym[j]))
            if current is None or current[1] != new:  # stale: a neighbour merged first
                continue
            sym[i], alive[j], nxt[i] = new, False, nxt[j]
            k, h = nxt[j], prv[i]
            if h != -1:  # the new pair on the left
                merge = get((sym[h], new))
                if merge is not None:
                    push(heap, (merge[0], h, merge[1]))
            if k != -1:  # and on the right
                prv[k] = i
                merge = get((new, sym[k]))
                if merge is not None:
                    push(heap, (merge[0], i, merge[1]))
        return [s for s, keep in zip(sym, alive, strict=True) if keep]

    # -- decoding --

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; bytes that are not valid UTF-8 become U+FFFD (as in HF).

        >>> tok = load_tokenizer()
        >>> tok.decode(tok.encode("<|im_start|>hi<|im_end|>"), skip_special_tokens=True)
        'hi'
        """
        chunks = []
        for i in ids:
            i = int(i)
            if i not in self._token_bytes:
                raise ValueError(f"token id {i} is out of range (vocab size {len(self)})")
            if skip_special_tokens and self._id_to_token[i] in self._special:
                continue
            chunks.append(self._token_bytes[i])
        return b"".join(chunks).decode("utf-8", errors="replace")

    # -- files --

    def to_dict(self) -> dict:
        """The HF ``tokenizer.json`` structure (what ``tokenizers`` itself writes)."""
        byte_level = {"type": "ByteLevel", "add_prefix_space": self.add_prefix_space,
                      "trim_offsets": True, "use_regex": self.use_regex}
        return {
            "version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": t.id, "content": t.content, "single_word": False,
                              "lstrip": False, "rstrip": False, "normalized": t.normalized,
                              "special": t.special}
                             for t in sorted(self.added_tokens, key=lambda t: t.id)],
            "normalizer": None,
            "pre_tokenizer": byte_level,
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": self.ignore_merges,
                      "vocab": dict(sorted(self._model_vocab.items(), key=lambda kv: kv[1])),
                      "merges": [list(m) for m in self.merges]},
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write an HF ``tokenizer.json`` (loadable by ``tokenizers.Tokenizer.from_file``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), ensure_ascii=False, indent=2), encoding="utf-8")
        tmp.replace(path)  # atomic: never a half-written tokenizer.json
        return path

    def add_special_tokens(self, tokens: Sequence[str]) -> BPETokenizer:
        """A copy with ``tokens`` reserved as special ids after the last one (those it has
        already are kept where they are), as ``transformers``' ``add_special_tokens`` does.

        >>> tok = load_tokenizer().add_special_tokens(["<think>", "<|tool|>"])
        >>> len(tok), tok.encode("<think><|tool|>")   # <think> is reserved already (id 7)
        (6401, [7, 6400])
        """
        new = [t for t in dict.fromkeys(tokens) if t not in self.vocab]
        if not all(isinstance(t, str) and t for t in new):
            raise ValueError(f"special tokens must be non-empty strings, got {list(tokens)!r}")
        added = [AddedToken(t, len(self) + k) for k, t in enumerate(new)]
        return BPETokenizer(self._model_vocab, self.merges, self.added_tokens + added,
                            add_prefix_space=self.add_prefix_space, use_regex=self.use_regex,
                            ignore_merges=self.ignore_merges, cache_size=self._cache_size)

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write a ``transformers.AutoTokenizer`` folder: tokenizer.json, tokenizer_config.json
        (MiniMind's settings and ChatML ``chat_template``) and special_tokens_map.json."""
        directory = Path(directory)
        self.save(directory / TOKENIZER_FILE)
        for name, content in _transformers_config(self).items():
            (directory / name).write_text(json.dumps(content, ensure_ascii=False, indent=2) + "\n",
                                          encoding="utf-8")
        return directory

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> BPETokenizer:
        """Load an HF byte-level BPE ``tokenizer.json`` (any model trained like GPT-2's)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such tokenizer file")
        return cls.from_dict(read_json(path), source=str(path))

    @classmethod
    def from_dict(cls, data: dict, source: str = "<dict>") -> BPETokenizer:
        """Build from the parsed ``tokenizer.json``; unsupported settings raise ``ValueError``."""
        supported = ("supported: model BPE, pre_tokenizer ByteLevel, normalizer null, "
                     "decoder ByteLevel or null, post_processor ByteLevel or null")
        def fail(what: str) -> ValueError:
            return ValueError(f"{source}: {what}; {supported}")

        model, pre = data.get("model") or {}, data.get("pre_tokenizer") or {}
        for key in ("model", "pre_tokenizer", "normalizer", "decoder", "post_processor"):
            if data.get(key) is not None and not isinstance(data[key], dict):
                raise fail(f"{key} must be an object or null, got {data[key]!r:.40}")
        if model.get("type") != "BPE":
            raise fail(f"model type {model.get('type')!r} is not supported")
        if not isinstance(model.get("vocab"), dict) or not isinstance(model.get("merges"), list):
            raise fail("model.vocab (an object) or model.merges (a list) is missing")
        if pre.get("type") != "ByteLevel":
            raise fail(f"pre_tokenizer {pre.get('type')!r} is not supported")
        if data.get("normalizer") is not None:
            raise fail(f"normalizer {data['normalizer'].get('type')!r} is not supported")
        for key in ("decoder", "post_processor"):
            if data.get(key) is not None and data[key].get("type") != "ByteLevel":
                raise fail(f"{key} {data[key].get('type')!r} is not supported")
        for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback"):
            if model.get(key):  # null / 0 / false are the byte-level settings
                raise fail(f"model.{key}={model[key]!r} is not supported")
        added = [_added_token(t, i, source) for i, t in enumerate(data.get("added_tokens") or [])]
        merges = [_merge(m, i, source) for i, m in enumerate(model["merges"])]
        try:
            tokenizer = cls(model["vocab"], merges, added,
                            add_prefix_space=pre.get("add_prefix_space", True),
                            use_regex=pre.get("use_regex", True),
                            ignore_merges=model.get("ignore_merges", False))
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None
        _check_ids(model["vocab"], added, source)
        return tokenizer


def _added_token(t: object, index: int, source: str) -> AddedToken:
    """``added_tokens[index]`` of a tokenizer.json, checked."""
    where = f"{source}: added_tokens[{index}]"
    if not isinstance(t, dict) or not isinstance(t.get("content"), str) or not t["content"]:
        raise ValueError(f"{where} must be an object with a non-empty string 'content'")
    if not isinstance(t.get("id"), int) or isinstance(t["id"], bool):
        raise ValueError(f"{where} ({t['content']!r}): 'id' must be an integer, got "
                         f"{t.get('id')!r}")
    flags = [f for f in ("lstrip", "rstrip", "single_word") if t.get(f)]
    if flags:
        raise ValueError(f"{where}: {t['content']!r} uses {'/'.join(flags)}, not supported "
                         "(supported: plain added tokens)")
    return AddedToken(t["content"], t["id"], bool(t.get("special", False)),
                      bool(t.get("normalized", False)))


def _merge(m: object, rank: int, source: str) -> tuple[str, str]:
    """``model.merges[rank]``: "left right" (HF's old format) or ["left", "right"]."""
    parts = m.split(" ") if isinstance(m, str) else m
    if not (isinstance(parts, list | tuple) and len(parts) == 2
            and all(isinstance(p, str) and p for p in parts)):
        raise ValueError(f"{source}: model.merges[{rank}] must be \"left right\" or "
                         f"[\"left\", \"right\"], got {m!r:.40}")
    return parts[0], parts[1]


def _check_ids(vocab: dict, added: Sequence[AddedToken], source: str) -> None:
    """Token ids must be the integers 0 .. n-1, one token each (an added token may repeat its
    own vocab entry, as HF writes special tokens), so no id can point past the embedding."""
    owner: dict[int, str] = {}
    entries = [(f"model.vocab[{t!r}]", t, i) for t, i in vocab.items()]
    entries += [(f"added_tokens ({t.content!r})", t.content, t.id) for t in added]
    for where, token, i in entries:
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise ValueError(f"{source}: {where}: id must be a non-negative integer, got {i!r}")
        if owner.setdefault(i, token) != token:
            raise ValueError(f"{source}: {where}: id {i} is also {owner[i]!r}'s")
    if owner and max(owner) >= len(owner):
        raise ValueError(f"{source}: ids must be 0 .. {len(owner) - 1} (one per token), but id "
                         f"{max(owner)} is used: the embedding would have rows no token fills")


@lru_cache(maxsize=64)
def _added_pattern(tokens: frozenset[str]) -> regex.Pattern | None:
    """Leftmost-longest matcher (HF uses Aho-Corasick, LeftmostLongest)."""
    if not tokens:
        return None
    return regex.compile("|".join(regex.escape(t)
                                  for t in sorted(tokens, key=lambda t: (-len(t), t))))


def _token_bytes(token: str) -> bytes:
    """The bytes of a token as HF's ByteLevel decoder sees them: mapped characters back to
    bytes, or the raw UTF-8 when some character is not a byte symbol (e.g. a space)."""
    if all(c in _CHAR_TO_BYTE for c in token):
        return bytes(_CHAR_TO_BYTE[c] for c in token)
    return token.encode("utf-8")


def load_tokenizer(path: str | os.PathLike | None = None) -> BPETokenizer:
    """The course tokenizer (``data/tokenizer/tokenizer.json``), or the one at ``path``.

    >>> tok = load_tokenizer()
    >>> len(tok), tok.special_tokens[:3], len(tok.special_tokens)   # + MiniMind-3's six markers
    (6400, ['<|endoftext|>', '<|im_start|>', '<|im_end|>'], 9)
    """
    path = Path(path) if path is not None else COURSE_TOKENIZER
    if path is COURSE_TOKENIZER and not path.is_file():
        raise FileNotFoundError(f"{path} is missing; rebuild it with "
                                "`python scripts/train_tokenizer.py`")
    return BPETokenizer.from_file(path)


def copy_tokenizer_files(tokenizer_dir: str | os.PathLike, model_dir: str | os.PathLike) -> None:
    """Put the tokenizer of ``tokenizer_dir`` (a run's ``tokenizer`` stage, or any
    ``save_pretrained`` folder) beside the model in ``model_dir``, so ``serve --model``,
    ``export`` and ``transformers.AutoTokenizer`` find it there: ``TOKENIZER_FILES``, of which
    ``tokenizer.json`` and ``tokenizer_config.json`` must exist (an error names what is missing).

    >>> import tempfile
    >>> model_dir = Path(tempfile.mkdtemp())
    >>> copy_tokenizer_files(COURSE_TOKENIZER_DIR, model_dir)
    >>> sorted(p.name for p in model_dir.iterdir())
    ['special_tokens_map.json', 'tokenizer.json', 'tokenizer_config.json']
    """
    tokenizer_dir, model_dir = Path(tokenizer_dir), Path(model_dir)
    missing = [name for name in TOKENIZER_FILES[:2] if not (tokenizer_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"tokenizer folder {tokenizer_dir} lacks {', '.join(missing)} (build it with "
            "notebook 01 / `python -m minimind_lib tokenizer`)")
    model_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, model_dir / name)


def _transformers_config(tokenizer: BPETokenizer) -> dict[str, dict]:
    """tokenizer_config.json and special_tokens_map.json as MiniMind ships them, with the chat
    template the tokenizer's model speaks (``chat.template_of``)."""
    def tag(content: str) -> dict:
        return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                "single_word": False, "special": True}

    specials = {"bos_token": IM_START, "eos_token": IM_END, "pad_token": END_OF_TEXT,
                "unk_token": END_OF_TEXT}
    config = {
        "add_bos_token": False, "add_eos_token": False,
        "add_prefix_space": tokenizer.add_prefix_space,
        "added_tokens_decoder": {str(t.id): {**tag(t.content), "special": t.special}
                                 for t in sorted(tokenizer.added_tokens, key=lambda t: t.id)},
        "additional_special_tokens": [], **specials,
        "clean_up_tokenization_spaces": False, "legacy": True, "model_max_length": 32768,
        "spaces_between_special_tokens": False, "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": jinja_template_of(tokenizer),
    }
    return {"tokenizer_config.json": config,
            "special_tokens_map.json": {k: tag(v) for k, v in specials.items()}}
