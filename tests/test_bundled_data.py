"""The committed data/ files: they parse, eval is disjoint from training, every answer is right.

Only committed files are read (no network, nothing rebuilt).  Answers are recomputed from the
prompt (arithmetic, copies, extractions) or looked up in the committed pretraining text
(knowledge), independently of scripts/build_data.py; each checker is also shown to reject a
corrupted answer, so none of these tests can pass vacuously.
"""

from __future__ import annotations

import doctest
import importlib
import re
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from minimind_lib import DATA_DIR, REPO_ROOT
from minimind_lib.data import read_jsonl

# all committed data except data/tokenizer/: the task samples (~8.8 MB) and the tool-use
# conversations (~2.5 MB: each carries its tools' JSON schemas, as MiniMind's data does)
BUDGET_BYTES = 12_000_000
#: scripts/build_tool_data.py's files (tests/test_tool_data.py checks them)
TOOL_FILES = {"sft_tools.jsonl", "tools_eval.jsonl"}
TRAIN = {"sft": ["sft_sample.jsonl", "sft_sample_cc_by_sa.jsonl"],
         "dpo": ["dpo_sample.jsonl", "dpo_sample_cc_by_sa.jsonl"]}
EVAL = {"sft": ["eval/sft_eval.jsonl", "eval/sft_eval_cc_by_sa.jsonl"],
        "dpo": ["eval/dpo_eval.jsonl", "eval/dpo_eval_cc_by_sa.jsonl"]}
PRETRAIN = ["pretrain_sample.jsonl", "pretrain_sample_cc_by_sa.jsonl"]
FAMILIES = {"knowledge", "skill"}
ZH_CLAUSE = re.compile(r"[^，。？！；：]+[，。？！；：]")


def bundled_files() -> list[Path]:
    # the bundled training and evaluation text: not local builds (full/, minimind/) nor the
    # reference model's training log (reference/)
    skip = {"tokenizer", "full", "minimind", "reference"}
    return sorted(p for p in DATA_DIR.rglob("*.jsonl")
                  if not skip & set(p.relative_to(DATA_DIR).parts))


def schema_of(path: Path) -> str:
    if path.name in TOOL_FILES:
        return "sft"
    return next(s for s in ("pretrain", "sft", "dpo", "agent_rl") if path.name.startswith(s))


@cache
def records(name: str) -> tuple[dict, ...]:
    path = DATA_DIR / name
    return tuple(read_jsonl(path, schema_of(path)))


def qa_pairs(schema: str, names: list[str]) -> list[tuple[dict, str, str, str | None]]:
    """(record, prompt, answer, rejected-or-None) for every record of the given files."""
    out = []
    for name in names:
        for r in records(name):
            if schema == "sft":
                out.append((r, r["conversations"][0]["content"],
                            r["conversations"][-1]["content"], None))
            else:
                out.append((r, r["chosen"][0]["content"], r["chosen"][-1]["content"],
                            r["rejected"][-1]["content"]))
    return out


# --- an index of the facts stated in the committed pretraining text -------------------------


@cache
def facts() -> dict:
    # poem line (without its punctuation) -> the lines that follow it / the poets who wrote it
    following, line_authors, title_authors = {}, {}, {}
    idioms, words, cedict, zh2en, en2zh = {}, {}, {}, {}, {}
    n_poems = 0
    for r in records("pretrain_sample.jsonl"):
        t = r["text"]
        if m := re.fullmatch(r"《(.+?)》\n作者：(.+?)\n(.+)", t, re.S):
            n_poems += 1
            title_authors.setdefault(m[1], set()).add(m[2])
            lines = ZH_CLAUSE.findall(m[3].replace("\n", ""))
            for j, line in enumerate(lines):
                line_authors.setdefault(line[:-1], set()).add(m[2])
                if j + 1 < len(lines):
                    following.setdefault(line[:-1], set()).add(lines[j + 1])
        elif m := re.match(r"成语：(.+?)（.*?）\n释义：(.+)", t):
            idioms[m[1]] = m[2]
        for m in re.finditer(r"^([a-z]+) \((?:noun|verb|adjective|adverb)\): (.+)$", t, re.M):
            words.setdefault(m[1], set()).add(m[2].split('; "')[0])
    for r in records("pretrain_sample_cc_by_sa.jsonl"):
        t = r["text"]
        for m in re.finditer(r"^(\S+) \[[^\]]+\]: (.+)$", t, re.M):
            cedict[m[1]] = m[2]
        for m in re.finditer(r"^中文：(.+)\n英文：(.+)$", t, re.M):
            zh2en[m[1]] = m[2]
            en2zh[m[2]] = m[1]
    return {"n_poems": n_poems, "following": following, "line_authors": line_authors,
            "title_authors": title_authors, "idioms": idioms, "words": words, "cedict": cedict,
            "zh2en": zh2en, "en2zh": en2zh}


def quoted(prompt: str, left: str, right: str) -> str:
    i, j = prompt.index(left), prompt.rindex(right)
    assert i < j, prompt
    return prompt[i + 1:j]


def next_lines(q: str) -> set[str]:
    return facts()["following"].get(q, set())


def authors_of(prompt: str) -> set[str]:
    if m := re.search(r"《(.+?)》", prompt):
        return facts()["title_authors"].get(m[1], set())
    return facts()["line_authors"].get(quoted(prompt, "“", "”"), set())


def arithmetic_answer(prompt: str) -> str:
    a, op, b = re.search(r"(\d) ([+-]) (\d)", prompt).groups()
    return f"{a} {op} {b} = {int(a) + int(b) if op == '+' else int(a) - int(b)}"


def translation_ok(prompt: str, answer: str) -> bool:
    source = re.split(r"：|: ", prompt, maxsplit=1)[1]
    f = facts()
    return f["zh2en"].get(source) == answer or f["en2zh"].get(source) == answer


def is_correct(task: str, prompt: str, answer: str) -> bool:
    """Recompute / look up the right answer for ``prompt`` and compare."""
    f = facts()
    if task == "arithmetic":
        return answer == arithmetic_answer(prompt)
    if task == "copy_zh":
        return answer == quoted(prompt, "“", "”")
    if task == "copy_en":
        return answer == quoted(prompt, '"', '"')
    if task == "extract_title":
        titles = re.findall(r"《([^《》]+)》", prompt)
        return len(titles) == 1 and answer == titles[0]
    if task == "first_word":
        first = quoted(prompt, '"', '"').split()[0]
        return first.isalpha() and answer == first
    if task == "larger_number":
        nums = [int(x) for x in re.findall(r"\d+", prompt)]
        return len(nums) == 2 and nums[0] != nums[1] and answer == str(max(nums))
    if task == "poem_next_line":
        # the asked line must have exactly one next line in the pretraining poems
        return next_lines(quoted(prompt, "“", "”")) == {answer}
    if task == "poem_author":
        return authors_of(prompt) == {answer}
    if task == "idiom_meaning":
        return f["idioms"].get(quoted(prompt, "“", "”")) == answer
    if task == "word_definition":
        return answer in f["words"].get(quoted(prompt, '"', '"'), set())
    if task == "word_translation":
        word = quoted(prompt, "“", "”") if "“" in prompt else quoted(prompt, '"', '"')
        return f["cedict"].get(word) == answer
    if task == "sentence_translation":
        return translation_ok(prompt, answer)
    raise AssertionError(f"no checker for task {task!r}")


# --- tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", bundled_files(), ids=lambda p: str(p.relative_to(DATA_DIR)))
def test_every_bundled_file_parses(path: Path) -> None:
    rows = list(read_jsonl(path, schema_of(path)))
    assert rows
    if schema_of(path) == "pretrain":
        return
    if path.name in TOOL_FILES:
        assert all(r["family"] == "tool" and isinstance(r["tool_task"], str) for r in rows)
        return
    if schema_of(path) == "agent_rl":  # scripts/build_tool_data.py's agent tasks
        assert all(r["gt"] and isinstance(r["tool_task"], str) for r in rows)
        return
    for r in rows:
        assert r["family"] in FAMILIES and isinstance(r["task"], str), r
        if "sft_eval" in path.name:
            assert r["answer"] == r["conversations"][-1]["content"]
        if schema_of(path) == "dpo":
            assert r["chosen"][:-1] == r["rejected"][:-1], "DPO pair must share the prompt"
            assert r["chosen"][-1]["content"] != r["rejected"][-1]["content"]


def test_the_expected_files_are_there() -> None:
    names = {str(p.relative_to(DATA_DIR)) for p in bundled_files()}
    expected = set(PRETRAIN + TRAIN["sft"] + TRAIN["dpo"] + EVAL["sft"] + EVAL["dpo"]
                   + ["eval/pretrain_eval.jsonl"])
    assert expected <= names, expected - names


def test_eval_prompts_never_appear_in_training() -> None:
    train = {p for s in ("sft", "dpo") for _, p, _, _ in qa_pairs(s, TRAIN[s])}
    evals = {p for s in ("sft", "dpo") for _, p, _, _ in qa_pairs(s, EVAL[s])}
    assert len(evals) > 1000
    assert not evals & train, sorted(evals & train)[:5]


def test_pretrain_eval_is_held_out() -> None:
    train = {r["text"] for name in PRETRAIN for r in records(name)}
    held = [r["text"] for r in records("eval/pretrain_eval.jsonl")]
    assert 100_000 <= (DATA_DIR / "eval/pretrain_eval.jsonl").stat().st_size <= 200_000
    assert not set(held) & train
    # no held-out document is hidden inside a training one either (spot check on 40 of them)
    joined = "\n".join(sorted(train))
    assert not [t for t in held[:40] if t in joined]


def test_knowledge_facts_are_indexed() -> None:
    f = facts()  # the index itself must see the data, else every lookup would fail alike
    assert f["n_poems"] > 2000 and len(f["idioms"]) > 1000 and len(f["words"]) > 1000
    assert len(f["cedict"]) > 500 and len(f["zh2en"]) > 500
    assert next_lines("床前明月光") == {"疑是地上霜，"}


@pytest.mark.parametrize("schema", ["sft", "dpo"])
@pytest.mark.parametrize("split", ["train", "eval"])
def test_every_answer_is_right_and_every_rejected_is_wrong(schema: str, split: str) -> None:
    files = (TRAIN if split == "train" else EVAL)[schema]
    bad = []
    for r, prompt, answer, rejected in qa_pairs(schema, files):
        if not is_correct(r["task"], prompt, answer):
            bad.append(("answer", r["task"], prompt, answer))
        if rejected is not None and is_correct(r["task"], prompt, rejected):
            bad.append(("rejected", r["task"], prompt, rejected))
    assert not bad, f"{len(bad)} wrong, e.g. {bad[:3]}"


def test_checkers_reject_corrupted_answers() -> None:
    """Each task's checker fails a wrong answer (so the test above can fail)."""
    seen = {}
    for r, prompt, answer, _ in qa_pairs("sft", TRAIN["sft"]):
        seen.setdefault(r["task"], (prompt, answer))
    assert len(seen) == 12
    for task, (prompt, answer) in seen.items():
        assert is_correct(task, prompt, answer), task
        assert not is_correct(task, prompt, answer + "x"), task
        assert not is_correct(task, prompt, answer[:-1]), task


def test_sizes_and_counts_within_budget() -> None:
    committed = [p for p in DATA_DIR.rglob("*") if p.is_file()
                 and not {"tokenizer", "full", "minimind", "reference"}
                 & set(p.relative_to(DATA_DIR).parts)]
    total = sum(p.stat().st_size for p in committed)
    assert total < BUDGET_BYTES, f"data/ holds {total:,} bytes (budget {BUDGET_BYTES:,})"
    reference = sum(p.stat().st_size for p in (DATA_DIR / "reference").rglob("*") if p.is_file())
    assert reference <= 12 * 2**20, f"data/reference holds {reference:,} bytes (budget 12 MiB)"
    assert 2_500_000 <= (DATA_DIR / "pretrain_sample.jsonl").stat().st_size <= 4_000_000
    n_sft = sum(len(records(n)) for n in TRAIN["sft"])
    n_dpo = sum(len(records(n)) for n in TRAIN["dpo"])
    assert 15_000 <= n_sft <= 25_000 and 5_000 <= n_dpo <= 10_000
    for schema in ("sft", "dpo"):
        per_task = Counter(r["task"] for n in EVAL[schema] for r in records(n))
        assert len(per_task) == 12 and all(100 <= c <= 200 for c in per_task.values()), per_task
        train_tasks = Counter(r["task"] for n in TRAIN[schema] for r in records(n))
        assert set(train_tasks) == set(per_task)
    families = Counter(r["family"] for n in TRAIN["sft"] for r in records(n))
    assert families["skill"] >= 0.4 * n_sft, families  # skills are well represented


def test_readme_lists_exactly_the_tasks_in_the_files() -> None:
    readme = (DATA_DIR / "README.md").read_text("utf-8")
    listed = set(re.findall(r"^\| `([a-z_]+)` \| (?:knowledge|skill) \|", readme, re.M))
    in_files = {r["task"] for s in ("sft", "dpo") for n in TRAIN[s] + EVAL[s] for r in records(n)}
    assert listed == in_files
    assert "WordNet 3.0 Copyright 2006 by Princeton University" in readme
    assert "Princeton University" in (DATA_DIR / "LICENSES/wordnet-base.txt").read_text("utf-8")


def test_readme_counts_match_the_files() -> None:
    readme = (DATA_DIR / "README.md").read_text("utf-8")
    for path in bundled_files():
        name = str(path.relative_to(DATA_DIR))
        n = sum(1 for line in path.open(encoding="utf-8") if line.strip())
        assert f"| `{name}` | {n:,} |" in readme, name


@pytest.mark.parametrize("module",
                         ["rdata", "data_sources", "data_pretrain", "data_tasks", "build_data"])
def test_build_script_docstring_examples(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO_ROOT / "scripts"))
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0

