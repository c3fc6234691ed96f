"""Learning BPE merges (notebook 01): count the pre-tokenized words, then repeatedly merge the
most frequent adjacent pair (Sennrich et al. 2016, Alg. 1) with HF's tie-breaking, so
``train_bpe`` gives the same merges and ids as ``tokenizers.BpeTrainer``; ``train_bpe_fast``
asks ``tokenizers`` itself.

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
            f"symbols plus {len(symbols) - 256} special token(s), "
            f"i.e. vocab_size >= {len(symbols)}")
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
        raise ValueError("the training corpus is empty: train_bpe needs at least one "
                         "non-empty text")
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
