"""Learning BPE merges (notebook 01): count the pre-tokenized words, then repeatedly merge the
most frequent adjacent pair (Sennrich et al. 2016, Alg. 1) with HF's tie-breaking, so
``train_bpe`` gives the same merges and ids as ``tokenizers.BpeTrainer``; ``train_bpe_fast``
asks ``tokenizers`` itself.  ``learn_merges`` is the loop to read; ``train_bpe`` runs its
twin ``learn_merges_fast`` (words as strings, scanned in C), tested to give the same merges.

>>> merge_pair([1, 2, 3, 1, 2], (1, 2), 9)
[9, 3, 9]
"""

from __future__ import annotations

import heapq
import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from tqdm.auto import tqdm

from minimind_lib.tokenizer.bpe import _BYTE_TABLE, _SPLIT, AddedToken, BPETokenizer, to_byte_level
from minimind_lib.tokenizer.special import SPECIAL_TOKENS


def count_words(texts: Iterable[str]) -> Counter[str]:
    """How often each byte-level word occurs in ``texts``.

    >>> count_words(["the cat", "the dog"])
    Counter({'the': 2, 'Ġcat': 1, 'Ġdog': 1})
    """
    raw = Counter(itertools.chain.from_iterable(map(_SPLIT.findall, texts)))  # counted in C
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


def _add_token(id_to_token: list[str], token_to_id: dict[str, int], a: int, b: int) -> int:
    """The id of the merge ``a + b``: a new one at the end, or the id its string already has.

    >>> ids = ["a", "b", "ab"]
    >>> _add_token(ids, {"a": 0, "b": 1, "ab": 2}, 0, 1), _add_token(ids, {"a": 0, "b": 1}, 0, 1)
    (2, 3)
    """
    token = id_to_token[a] + id_to_token[b]
    # subtle: two merge paths can spell the same string ("ab"+"c", "a"+"bc"); the
    # second one reuses the id (HF does the same), so the vocab grows by one less
    new = token_to_id.get(token)
    if new is None:
        new = token_to_id[token] = len(id_to_token)
        id_to_token.append(token)
    return new


def learn_merges(word_counts: dict[str, int], id_to_token: list[str], vocab_size: int,
                 min_frequency: int = 0, show_progress: bool = True) -> list[tuple[int, int, int]]:
    """BPE training with incremental pair counts; returns ``(left, right, new)`` id triples.

    The teaching version (notebook 01's ``fast_bpe`` plus HF's last details);
    ``train_bpe`` runs its twin ``learn_merges_fast``, tested to give the same merges.
    ``id_to_token`` holds the initial symbols (specials, then the alphabet) and grows
    with each merge.  The algorithm is HF ``BpeTrainer``'s, step for step:

    * a max-heap of pairs ordered by (count, then smallest ``(left, right)``), with
      lazy updates: a popped pair whose count went stale is pushed back, corrected;
    * each heap entry carries the words that held its pair when it was pushed, so a
      merge only rewrites those words and only the counts of the pairs next to each
      merged occurrence change (no recount of every pair after every merge);
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
        size = len(id_to_token)
        new = _add_token(id_to_token, token_to_id, a, b)
        bar.update(len(id_to_token) - size)  # 0 when the string already had an id
        merges.append((a, b, new))
        created: dict[tuple[int, int], set[int]] = defaultdict(set)
        for wi in pos:
            word, n, i = words[wi], counts[wi], 0
            while i < len(word) - 1:
                if word[i] == a and word[i + 1] == b:
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


# --- 3b. the same merges, faster: each word a string -----------------------------------------


def _words_as_strings(words: Iterable[str], token_to_id: dict[str, int]) -> list[str]:
    """Each word with every symbol replaced by ``chr`` of its id.

    >>> _words_as_strings(["ab", "b"], {"<s>": 0, "a": 1, "b": 2})
    ['\\x01\\x02', '\\x02']
    """
    table = {ord(t): chr(i) for t, i in token_to_id.items() if len(t) == 1}
    words = list(words)
    unknown = set("".join(words)).difference(token_to_id)
    if unknown:
        raise KeyError(f"symbol(s) missing from id_to_token: {sorted(unknown)}")
    return [w.translate(table) for w in words]


def _pair_index(words: list[str], counts: list[int]) -> tuple[dict[str, int], dict[str, list[int]]]:
    """Each adjacent pair's count, weighted by word count, and the words holding it.

    A word is listed once per occurrence of the pair (``"abab"`` twice for ``"ab"``).

    >>> pair_counts, where = _pair_index(["abab", "ba"], [1, 5])
    >>> dict(pair_counts), dict(where)
    ({'ab': 2, 'ba': 6}, {'ab': [0, 0], 'ba': [0, 1]})
    """
    pair_counts: dict[str, int] = defaultdict(int)
    where: dict[str, list[int]] = defaultdict(list)
    for wi, word in enumerate(words):
        for i in range(len(word) - 1):
            pair = word[i:i + 2]
            pair_counts[pair] += counts[wi]
            where[pair].append(wi)
    return pair_counts, where


def _merge_words(words: list[str], pos: Iterable[int], pair: str,
                 new: str) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Merge ``pair`` into ``new`` in the words ``pos``; the neighbours of each occurrence.

    Returns the symbols just left and just right of each merged occurrence, each with
    the words it was seen in (once per occurrence).  As in HF's trainer, an occurrence
    directly followed by another sees that one's first symbol on its right, and the
    next one then sees ``new`` on its left: ``abab`` gives right ``a``, left ``Z``.

    >>> words = ["xaby", "abab", "cd"]
    >>> _merge_words(words, [0, 1, 2], "ab", "Z"), words
    (({'x': [0], 'Z': [1]}, {'y': [0], 'a': [1]}), ['xZy', 'ZZ', 'cd'])
    """
    left: dict[str, list[int]] = defaultdict(list)
    right: dict[str, list[int]] = defaultdict(list)
    for wi in pos:
        word = words[wi]
        end = -1  # where the previous occurrence in this word ended
        start = word.find(pair)  # -1 when a word is visited again: nothing left to merge
        while start >= 0:
            if start > 0:
                left[new if start == end else word[start - 1]].append(wi)
            end = start + 2
            if end < len(word):
                right[word[end]].append(wi)
            start = word.find(pair, end)
        words[wi] = word.replace(pair, new)  # left to right, no overlaps: merge_pair's rule
    return dict(left), dict(right)


def _move_pair_counts(pair_counts: dict[str, int], counts: list[int], left: dict[str, list[int]],
                      right: dict[str, list[int]], pair: str, new: str) -> dict[str, list[int]]:
    """Move each neighbour's count from its pair with ``pair`` to its pair with ``new``.

    Returns the pairs that gained a count, each with the words holding it.

    >>> pair_counts = defaultdict(int, {"xa": 4, "ab": 4, "by": 1})
    >>> _move_pair_counts(pair_counts, [1, 3], {"x": [0, 1]}, {"y": [0]}, "ab", "Z")
    {'xZ': [0, 1], 'Zy': [0]}
    >>> dict(pair_counts)   # ("a", "b") keeps its count, as in HF: it is never pushed again
    {'xa': 0, 'ab': 4, 'by': 0, 'xZ': 4, 'Zy': 1}
    """
    a, b = pair
    created: dict[str, list[int]] = {}
    for symbol, holders in left.items():  # (symbol, a) -> (symbol, new)
        n = sum(map(counts.__getitem__, holders))  # weighted by each word's count
        pair_counts[symbol + a] -= n
        pair_counts[symbol + new] += n
        created[symbol + new] = holders
    for symbol, holders in right.items():  # (b, symbol) -> (new, symbol)
        n = sum(map(counts.__getitem__, holders))
        pair_counts[b + symbol] -= n
        pair_counts[new + symbol] += n
        # subtle: (new, new) can come from both sides when ``new`` is a reused id
        created.setdefault(new + symbol, []).extend(holders)
    return created


def learn_merges_fast(word_counts: dict[str, int], id_to_token: list[str], vocab_size: int,
                      min_frequency: int = 0,
                      show_progress: bool = True) -> list[tuple[int, int, int]]:
    """``learn_merges``, faster, with the same merges tie for tie (``tests/test_tokenizer.py``).

    The algorithm and its heap are ``learn_merges``'; three things change:

    * a word is a ``str`` with one character per symbol, ``chr(id)``, and a pair the
      string ``chr(left) + chr(right)``: finding a pair in a word is ``str.find`` and
      merging it ``str.replace``, both scanning in C;
    * the count changes are grouped by neighbour symbol and applied once per merge
      (``_move_pair_counts``), not once per occurrence;
    * the words holding a pair are a list, not a set: a word listed twice is visited
      twice, and the second visit finds nothing left to merge.

    subtle: strings compare by code point, so ordering the heap by ``(count, pair
    string)`` is ordering it by ``(count, (left, right))``: HF's tie-break.  (Ids must
    stay under ``0x110000``, the largest ``chr``.)

    >>> learn_merges_fast({"abc": 2, "ab": 1}, ["a", "b", "c"], 5, show_progress=False)
    [(0, 1, 3), (3, 2, 4)]
    """
    token_to_id = {t: i for i, t in enumerate(id_to_token)}
    words = _words_as_strings(word_counts, token_to_id)
    counts = list(word_counts.values())
    pair_counts, where = _pair_index(words, counts)
    # heap entries: (-count, pair string, tiebreak, words holding the pair)
    tiebreak = itertools.count()
    heap = [(-pair_counts[p], p, next(tiebreak), pos) for p, pos in where.items()]
    heapq.heapify(heap)
    merges: list[tuple[int, int, int]] = []
    bar = tqdm(total=max(vocab_size - len(id_to_token), 0), desc="BPE merges",
               disable=not show_progress)
    while len(token_to_id) < vocab_size and heap:
        neg, pair, _, pos = heapq.heappop(heap)
        count = pair_counts[pair]
        if -neg != count:  # stale entry: earlier merges lowered this pair's count
            heapq.heappush(heap, (-count, pair, next(tiebreak), pos))
            continue
        if count < 1 or count < min_frequency:
            break
        a, b = ord(pair[0]), ord(pair[1])
        size = len(id_to_token)
        new = _add_token(id_to_token, token_to_id, a, b)
        bar.update(len(id_to_token) - size)  # 0 when the string already had an id
        merges.append((a, b, new))
        left, right = _merge_words(words, pos, pair, chr(new))
        created = _move_pair_counts(pair_counts, counts, left, right, pair, chr(new))
        for p, holders in created.items():
            if pair_counts[p] > 0:
                heapq.heappush(heap, (-pair_counts[p], p, next(tiebreak), holders))
    bar.close()
    return merges


def _initial_symbols(vocab_size: int, special_tokens: Sequence[str]) -> list[str]:
    """Specials in order, then the 256 byte symbols sorted by code point (HF's order)."""
    symbols = list(dict.fromkeys(special_tokens))
    symbols += [c for c in sorted(_BYTE_TABLE.values()) if c not in symbols]
    if vocab_size < len(symbols):
        raise ValueError(
            f"vocab_size={vocab_size} is too small: a byte-level BPE needs the 256 byte "
            f"symbols plus {len(symbols) - 256} special token(s), "
            f"i.e. vocab_size >= {len(symbols)}")
    return symbols


def train_bpe(texts: Iterable[str], vocab_size: int, special_tokens: Sequence[str] = SPECIAL_TOKENS,
              min_frequency: int = 0, show_progress: bool = True) -> BPETokenizer:
    """Train a byte-level BPE in pure Python: same merges and ids as ``tokenizers.BpeTrainer``.

    ``count_words``, then ``learn_merges_fast`` (= ``learn_merges``, faster).  Ids:
    ``special_tokens`` in order, the 256 byte symbols by code point, then one per merge.
    Special-token strings inside ``texts`` are ordinary text here (HF too).

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
        raise ValueError("the training corpus is empty: train_bpe needs at least one "
                         "non-empty text")
    merges = learn_merges_fast(word_counts, id_to_token, vocab_size, min_frequency,
                               show_progress)
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
        raise ValueError("the training corpus is empty: train_bpe_fast needs at least one "
                         "non-empty text")
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(special_tokens), show_progress=show_progress,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(texts, trainer=trainer)
    return BPETokenizer.from_dict(json.loads(hf.to_str()), source="tokenizers.BpeTrainer")
