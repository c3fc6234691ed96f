"""Tokenizer: byte-level BPE from scratch, identical to HF ``tokenizers`` (notebook 01).

MiniMind's tokenizer is a GPT-2 style byte-level BPE with 6,400 tokens: ids 0, 1, 2
are ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, then the 256 byte symbols,
then one token per learned merge.  The pipeline, one function per step:

1. ``pretokenize``: GPT-2's regex cuts text into words (merges never cross them);
2. ``to_byte_level``: each word's UTF-8 bytes become printable characters
   (``bytes_to_unicode``), so a "word" is a plain string over a 256-symbol alphabet;
3. ``learn_merges``: repeatedly merge the most frequent adjacent pair (Sennrich et
   al. 2016, "Neural Machine Translation of Rare Words with Subword Units", Alg. 1),
   with HF's tie-breaking, so ``train_bpe`` gives the same merges and ids as
   ``tokenizers.BpeTrainer``;
4. ``BPETokenizer.encode``: split out special tokens, pre-tokenize, apply the merges
   in rank order; ``decode`` maps ids back to bytes, then to text.

>>> tok = train_bpe(["low lower lowest"] * 3, vocab_size=262, show_progress=False)
>>> tok.merges
[('l', 'o'), ('lo', 'w'), ('Ġ', 'low')]
>>> tok.encode("lowest<|im_end|>")
[260, 71, 85, 86, 2]
>>> tok.decode(tok.encode("lowest<|im_end|>"))
'lowest<|im_end|>'
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import regex
from tqdm.auto import tqdm

from minimind_lib import DATA_DIR
from minimind_lib.files import TOKENIZER_FILE

#: The special tokens, ids 0, 1, 2 (the only home of these strings in the library).
END_OF_TEXT = "<|endoftext|>"  # ends a document in the pretraining stream; also the pad token
IM_START = "<|im_start|>"  # opens a chat turn: <|im_start|>role\ncontent<|im_end|>
IM_END = "<|im_end|>"  # closes a chat turn: the chat model's stop token
SPECIAL_TOKENS = [END_OF_TEXT, IM_START, IM_END]
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant"
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
GPT2_SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
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


def count_words(texts: Iterable[str]) -> Counter[str]:
    """How often each byte-level word occurs in ``texts``.

    >>> count_words(["the cat", "the dog"])
    Counter({'the': 2, 'Ġcat': 1, 'Ġdog': 1})
    """
    raw: Counter[str] = Counter()
    for text in texts:
        raw.update(_SPLIT.findall(text))
    counts: Counter[str] = Counter()
    for word, n in raw.items():
        counts[to_byte_level(word)] += n  # distinct raw words stay distinct once mapped
    return counts


# --- 3. learning the merges ----------------------------------------------------------------


def merge_pair(word: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace each occurrence of ``pair`` in ``word`` by ``new_id``, left to right.

    >>> merge_pair([1, 1, 1, 2], (1, 1), 9)   # overlapping: the first (1, 1) wins
    [9, 1, 2]
    """
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def learn_merges(word_counts: dict[str, int], id_to_token: list[str], vocab_size: int,
                 min_frequency: int = 0, show_progress: bool = True) -> list[tuple[int, int, int]]:
    """BPE training with incremental pair counts; returns ``(left, right, new)`` id triples.

    ``id_to_token`` holds the initial symbols (specials, then the alphabet) and grows
    with each merge.  The algorithm is HF ``BpeTrainer``'s, step for step:

    * a max-heap of pairs ordered by (count, then smallest ``(left, right)``), with
      lazy updates: a popped pair whose count went stale is pushed back, corrected;
    * ``where[pair]`` indexes the words holding a pair, so a merge only rewrites
      those words and only the counts of the pairs next to each merged occurrence
      change (no recount of every pair after every merge);
    * stop at ``vocab_size`` tokens or when the best count falls under ``min_frequency``.

    >>> ids = ["a", "b", "c"]
    >>> learn_merges({"abc": 2, "ab": 1}, ids, 5, show_progress=False), ids
    ([(0, 1, 3), (3, 2, 4)], ['a', 'b', 'c', 'ab', 'abc'])
    """
    token_to_id = {t: i for i, t in enumerate(id_to_token)}
    words = [[token_to_id[c] for c in w] for w in word_counts]
    counts = list(word_counts.values())
    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set[int]] = defaultdict(set)
    for wi, word in enumerate(words):
        for pair in itertools.pairwise(word):
            pair_counts[pair] += counts[wi]
            where[pair].add(wi)
    # heap entries: (-count, left, right, tiebreak, words holding the pair)
    tiebreak = itertools.count()
    heap = [(-pair_counts[p], *p, next(tiebreak), pos) for p, pos in where.items()]
    heapq.heapify(heap)
    merges: list[tuple[int, int, int]] = []
    bar = tqdm(total=max(vocab_size - len(id_to_token), 0), desc="BPE merges",
               disable=not show_progress)
    while len(token_to_id) < vocab_size and heap:
        neg, a, b, _, pos = heapq.heappop(heap)
        count = pair_counts[(a, b)]
        if -neg != count:  # stale entry: earlier merges lowered this pair's count
            heapq.heappush(heap, (-count, a, b, next(tiebreak), pos))
            continue
        if count < 1 or count < min_frequency:
            break
        token = id_to_token[a] + id_to_token[b]
        # subtle: two merge paths can spell the same string ("ab"+"c", "a"+"bc"); the
        # second one reuses the id (HF does the same), so the vocab grows by one less
        new = token_to_id.get(token)
        if new is None:
            new = token_to_id[token] = len(id_to_token)
            id_to_token.append(token)
            bar.update(1)
        merges.append((a, b, new))
        created: dict[tuple[int, int], set[int]] = defaultdict(set)
        for wi in pos:
            word, n = words[wi], counts[wi]
            i = 0
            while True:
                try:  # list.index scans in C; the last symbol cannot start a pair
                    i = word.index(a, i, len(word) - 1)
                except ValueError:
                    break
                if word[i + 1] == b:
                    if i > 0:  # (prev, a) disappears, (prev, new) appears
                        prev = word[i - 1]
                        pair_counts[(prev, a)] -= n
                        pair_counts[(prev, new)] += n
                        created[(prev, new)].add(wi)
                    word[i:i + 2] = [new]
                    if i < len(word) - 1:  # (b, next) disappears, (new, next) appears
                        nxt = word[i + 1]
                        pair_counts[(b, nxt)] -= n
                        pair_counts[(new, nxt)] += n
                        created[(new, nxt)].add(wi)
                i += 1
        for pair, holders in created.items():
            if pair_counts[pair] > 0:
                heapq.heappush(heap, (-pair_counts[pair], *pair, next(tiebreak), holders))
    bar.close()
    return merges


def _initial_symbols(vocab_size: int, special_tokens: Sequence[str]) -> list[str]:
    """Specials in order, then the 256 byte symbols sorted by code point (HF's order)."""
    symbols = list(dict.fromkeys(special_tokens))
    symbols += [c for c in sorted(_BYTE_TABLE.values()) if c not in symbols]
    if vocab_size < len(symbols):
        raise ValueError(
            f"vocab_size={vocab_size} is too small: a byte-level BPE needs the 256 byte "
            f"symbols plus {len(symbols) - 256} special token(s), i.e. vocab_size >= {len(symbols)}")
    return symbols


def train_bpe(texts: Iterable[str], vocab_size: int, special_tokens: Sequence[str] = SPECIAL_TOKENS,
              min_frequency: int = 0, show_progress: bool = True) -> BPETokenizer:
    """Train a byte-level BPE in pure Python: same merges and ids as ``tokenizers.BpeTrainer``.

    Ids: ``special_tokens`` in order, the 256 byte symbols by code point, then one per
    merge.  Special-token strings inside ``texts`` are ordinary text here (HF too).

    >>> train_bpe(["aaa aaa"], vocab_size=261, show_progress=False).merges
    [('a', 'a'), ('aa', 'a')]
    >>> train_bpe([""], vocab_size=300)
    Traceback (most recent call last):
    ...
    ValueError: the training corpus is empty: train_bpe needs at least one non-empty text
    """
    id_to_token = _initial_symbols(vocab_size, special_tokens)
    word_counts = count_words(texts)
    if not word_counts:
        raise ValueError("the training corpus is empty: train_bpe needs at least one non-empty text")
    merges = learn_merges(word_counts, id_to_token, vocab_size, min_frequency, show_progress)
    # subtle: HF keeps merges in a map pair -> rank, so a pair merged twice keeps its last rank
    ranks = {(a, b): rank for rank, (a, b, _) in enumerate(merges)}
    pairs = [(id_to_token[a], id_to_token[b]) for a, b in sorted(ranks, key=ranks.get)]
    vocab = {t: i for i, t in enumerate(id_to_token)}
    specials = [AddedToken(t, vocab[t]) for t in dict.fromkeys(special_tokens)]
    return BPETokenizer(vocab, pairs, specials)


def train_bpe_fast(texts: Iterable[str], vocab_size: int,
                   special_tokens: Sequence[str] = SPECIAL_TOKENS, min_frequency: int = 0,
                   show_progress: bool = False) -> BPETokenizer:
    """The same training through HF ``tokenizers`` (Rust), MiniMind's own recipe.

    ``show_progress`` stays off by default: the Rust bar prints blank lines in notebooks.

    >>> fast = train_bpe_fast(["low lower lowest"] * 3, vocab_size=262)
    >>> fast.merges == train_bpe(["low lower lowest"] * 3, 262, show_progress=False).merges
    True
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    _initial_symbols(vocab_size, special_tokens)  # same argument checks as train_bpe
    texts = list(texts)
    if not any(texts):
        raise ValueError("the training corpus is empty: train_bpe_fast needs at least one non-empty text")
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(special_tokens), show_progress=show_progress,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(texts, trainer=trainer)
    return BPETokenizer.from_dict(json.loads(hf.to_str()), source="tokenizers.BpeTrainer")


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
        self.add_prefix_space, self.use_regex, self.ignore_merges = add_prefix_space, use_regex, ignore_merges
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

    def encode_batch(self, texts: Sequence[str], allowed_special: str | set[str]) -> list[list[int]]:
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
        >>> tok.encode_batch([text], allowed_special=set()) == [tok.encode(text, allowed_special=set())]
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
            raise ValueError(f"allowed_special must be 'all' or a set of strings, got {allowed_special!r}")
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
            "added_tokens": [{"id": t.id, "content": t.content, "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": t.normalized, "special": t.special}
                             for t in sorted(self.added_tokens, key=lambda t: t.id)],
            "normalizer": None,
            "pre_tokenizer": byte_level,
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": self.ignore_merges,
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
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: dict, source: str = "<dict>") -> BPETokenizer:
        """Build from the parsed ``tokenizer.json``; unsupported settings raise ``ValueError``."""
        supported = ("supported: model BPE, pre_tokenizer ByteLevel, normalizer null, "
                     "decoder ByteLevel or null, post_processor ByteLevel or null")
        model = data.get("model") or {}
        pre = data.get("pre_tokenizer") or {}

        def fail(what: str) -> ValueError:
            return ValueError(f"{source}: {what}; {supported}")

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
        added = []
        for t in data.get("added_tokens", []):
            flags = [f for f in ("lstrip", "rstrip", "single_word") if t.get(f)]
            if flags:
                raise fail(f"added token {t['content']!r} uses {'/'.join(flags)}, not supported")
            added.append(AddedToken(t["content"], t["id"], t.get("special", False),
                                    t.get("normalized", False)))
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        try:
            return cls(model["vocab"], merges, added, add_prefix_space=pre.get("add_prefix_space", True),
                       use_regex=pre.get("use_regex", True),
                       ignore_merges=model.get("ignore_merges", False))
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None


@lru_cache(maxsize=64)
def _added_pattern(tokens: frozenset[str]) -> regex.Pattern | None:
    """Leftmost-longest matcher (HF uses Aho-Corasick, LeftmostLongest)."""
    if not tokens:
        return None
    return regex.compile("|".join(regex.escape(t) for t in sorted(tokens, key=lambda t: (-len(t), t))))


def _token_bytes(token: str) -> bytes:
    """The bytes of a token as HF's ByteLevel decoder sees them: mapped characters back to
    bytes, or the raw UTF-8 when some character is not a byte symbol (e.g. a space)."""
    if all(c in _CHAR_TO_BYTE for c in token):
        return bytes(_CHAR_TO_BYTE[c] for c in token)
    return token.encode("utf-8")


def load_tokenizer(path: str | os.PathLike | None = None) -> BPETokenizer:
    """The course tokenizer (``data/tokenizer/tokenizer.json``), or the one at ``path``.

    >>> tok = load_tokenizer()
    >>> len(tok), tok.special_tokens
    (6400, ['<|endoftext|>', '<|im_start|>', '<|im_end|>'])
    """
    path = Path(path) if path is not None else COURSE_TOKENIZER
    if path is COURSE_TOKENIZER and not path.is_file():
        raise FileNotFoundError(f"{path} is missing; rebuild it with `python scripts/train_tokenizer.py`")
    return BPETokenizer.from_file(path)


# --- ChatML: MiniMind2's chat template ----------------------------------------------------

#: MiniMind2's Jinja chat template (its tool-calling branch left out), saved in
#: tokenizer_config.json so ``transformers``' ``apply_chat_template`` renders the same text.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else -%}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if not (loop.first and message['role'] == 'system') -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' }}{%- endif -%}"
)
CHAT_ROLES = ("system", "user", "assistant")


def chat_parts(messages: Sequence[dict], add_generation_prompt: bool = False) -> list[tuple[str, bool]]:
    """The rendered conversation as ``(text, is_special_marker)`` parts.

    >>> chat_parts([{"role": "user", "content": "hi"}], add_generation_prompt=True)[-3:]
    [('\\n', False), ('<|im_start|>', True), ('assistant\\n', False)]
    """
    if not messages:
        raise ValueError("a conversation needs at least one message")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES or not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}] must be {{'role': one of {', '.join(CHAT_ROLES)}, "
                             f"'content': str}}, got {m!r}")
    turns = [(m["role"], m["content"]) for m in messages]
    if turns[0][0] != "system":
        turns.insert(0, ("system", DEFAULT_SYSTEM_PROMPT))
    parts: list[tuple[str, bool]] = []
    for role, content in turns:
        parts += [(IM_START, True), (f"{role}\n{content}", False), (IM_END, True),
                  ("\n", False)]
    if add_generation_prompt:
        parts += [(IM_START, True), ("assistant\n", False)]
    return parts


def apply_chat_template(messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
    """Render ``messages`` in MiniMind2's ChatML (default system message when none).

    >>> print(apply_chat_template([{"role": "user", "content": "你好"}], add_generation_prompt=True))
    <|im_start|>system
    You are a helpful assistant<|im_end|>
    <|im_start|>user
    你好<|im_end|>
    <|im_start|>assistant
    <BLANKLINE>
    """
    return "".join(text for text, _ in chat_parts(messages, add_generation_prompt))


def encode_chat(tokenizer: BPETokenizer, messages: Sequence[dict],
                add_generation_prompt: bool = False) -> list[int]:
    """Ids of the rendered chat: role markers are special ids, and message content is
    never parsed for special tokens, so typed ``<|im_end|>`` text cannot forge a turn.

    >>> tok = load_tokenizer()
    >>> ids = encode_chat(tok, [{"role": "user", "content": "<|im_end|>"}])
    >>> ids.count(tok.token_to_id("<|im_end|>"))   # system + user turns only
    2
    """
    ids: list[int] = []
    for text, special in chat_parts(messages, add_generation_prompt):
        ids += ([tokenizer.token_to_id(text)] if special
                else tokenizer.encode(text, allowed_special=set()))
    return ids


def _transformers_config(tokenizer: BPETokenizer) -> dict[str, dict]:
    """tokenizer_config.json and special_tokens_map.json as MiniMind ships them."""
    def tag(content: str) -> dict:
        return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                "single_word": False, "special": True}

    specials = {"bos_token": IM_START, "eos_token": IM_END, "pad_token": END_OF_TEXT,
                "unk_token": END_OF_TEXT}
    config = {
        "add_bos_token": False, "add_eos_token": False, "add_prefix_space": tokenizer.add_prefix_space,
        "added_tokens_decoder": {str(t.id): {**tag(t.content), "special": t.special}
                                 for t in sorted(tokenizer.added_tokens, key=lambda t: t.id)},
        "additional_special_tokens": [], **specials,
        "clean_up_tokenization_spaces": False, "legacy": True, "model_max_length": 32768,
        "spaces_between_special_tokens": False, "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }
    return {"tokenizer_config.json": config,
            "special_tokens_map.json": {k: tag(v) for k, v in specials.items()}}
