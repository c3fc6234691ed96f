#!/usr/bin/env python
"""Build the tool-use and thinking data (notebook 14): ``data/sft_tools.jsonl`` (training
conversations in MiniMind-3's format) and ``data/eval/tools_eval.jsonl`` (held out), and the
agentic-RL tasks (notebook 15): ``data/agent_rl.jsonl``, in MiniMind's ``agent_rl.jsonl`` format.

    python scripts/build_tool_data.py          # offline: reads only files already in data/

Self-contained and deterministic (a fixed seed, sorted inputs): the questions are generated
(arithmetic, unit conversions, dates), the poem titles come from the bundled poems (the
``poem_author`` tool's own table) and the questions that need no tool from the bundled SFT
sample and its held-out set, so the licences are theirs (``data/LICENSES/``). Every answer is
computed by the course's safe executor (``minimind_lib.tools.execute_tool``), never typed in.

A tool conversation, as MiniMind-3's ``sft_t2t`` data writes one::

    system (content "", tools: the offered schemas as a JSON string)
    user       "What is 256 * 37?"
    assistant  content "", tool_calls: [{"name": "calculate", "arguments": {...}}]
    tool       '{"result": "9472"}'
    assistant  "256 * 37 = 9472"

Each record offers the tool it needs, sometimes beside one it does not (the model must pick),
since all five schemas take ~1,070 tokens of the course tokenizer: more than the cpu
profile's SFT window. Kinds (``tool_task``): one per tool; ``no_tool`` (a bundled SFT question
with tools offered: the answer needs none); ``without_tools`` (a tool question asked with no
tools, answered directly: the baseline's format); ``multi_step`` (a three-number sum, half
with its steps in ``reasoning_content``, half answered directly: thinking on and off).
Eval records add ``answer`` (the exact final reply) and ``call`` (the expected call or null).

An agent-RL task, as MiniMind's ``agent_rl.jsonl`` writes one: ``conversations`` (system with
the offered tools, the user's question, and a last assistant turn that the trainer drops) and
``gt`` (what a right final answer contains: the tool's result as the answer writes it); the
course's records add ``tool_task`` and ``answer`` (the exact final reply). Its questions are
new ones, disjoint from both files above (drawn after them, with their own seed).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import data_readme  # noqa: E402  (scripts/, beside this file)

from minimind_lib.data.readers import read_jsonl  # noqa: E402
from minimind_lib.tools import execute_tool, tool_schemas  # noqa: E402
from minimind_lib.tools.lookup import poem_authors  # noqa: E402

SEED = 20260401
TRAIN_FILE, EVAL_FILE = "sft_tools.jsonl", "eval/tools_eval.jsonl"
AGENT_FILE, AGENT_PER_KIND = "agent_rl.jsonl", 120  # data/ keeps under its 12 MB budget
#: training records per kind, and held-out records per kind
TRAIN = {"calculate": 450, "convert_units": 250, "days_between": 180, "weekday": 180,
         "poem_author": 200, "no_tool": 350, "without_tools": 200, "multi_step": 800}
EVAL_PER_KIND = 100
TOOL_KINDS = ("calculate", "convert_units", "days_between", "weekday", "poem_author")
DISTRACTOR_SHARE = 0.4  # records that offer one tool more than they need
WEEKDAYS_ZH = {"Monday": "星期一", "Tuesday": "星期二", "Wednesday": "星期三",
               "Thursday": "星期四", "Friday": "星期五", "Saturday": "星期六", "Sunday": "星期日"}

# --- the questions: (user text, expected call arguments, final answer from the result) -------

Question = tuple[str, dict, Callable[[str], str]]


def _calculate(rng: random.Random) -> Question:
    a, b, c = rng.randint(10, 9999), rng.randint(10, 999), rng.randint(2, 99)
    expression = rng.choice([f"{a} + {b}", f"{a} - {b}", f"{b} * {c}", f"{a} + {b} * {c}",
                             f"({a} - {b}) * {c}", f"{a / 100:.2f} + {b / 10:.1f}"])
    text = rng.choice(["算一下：{e}", "{e} 等于多少？", "What is {e}?", "Compute {e}.",
                       "{e} = ?", "请计算 {e}"]).format(e=expression)
    return text, {"expression": expression}, lambda r: f"{expression} = {r}"


_PAIRS = [("km", "m"), ("m", "cm"), ("cm", "mm"), ("mi", "km"), ("ft", "m"), ("in", "cm"),
          ("yd", "m"), ("kg", "g"), ("lb", "kg"), ("oz", "g"), ("t", "kg"), ("h", "min"),
          ("day", "h"), ("week", "day"), ("min", "s"), ("l", "ml"), ("C", "F"), ("F", "C"),
          ("C", "K")]


def _convert(rng: random.Random) -> Question:
    src, dst = rng.choice(_PAIRS)
    value: int | float = rng.randint(1, 500) if rng.random() < 0.7 else rng.randint(1, 999) / 10
    text = rng.choice(["{v} {a} 是多少 {b}？", "把 {v} {a} 换算成 {b}", "Convert {v} {a} to {b}.",
                       "How many {b} is {v} {a}?"]).format(v=value, a=src, b=dst)
    arguments = {"value": value, "from_unit": src, "to_unit": dst}
    return text, arguments, lambda r: f"{value} {src} = {r} {dst}"


def _date(rng: random.Random) -> str:
    return (date(2000, 1, 1) + timedelta(days=rng.randint(0, 365 * 30))).isoformat()


def _days(rng: random.Random) -> Question:
    start, end = sorted([_date(rng), _date(rng)])
    if rng.random() < 0.5:
        return (f"从 {start} 到 {end} 有多少天？", {"start": start, "end": end},
                lambda r: f"{r} 天")
    return (f"How many days are there from {start} to {end}?", {"start": start, "end": end},
            lambda r: f"{r} days")


def _weekday(rng: random.Random) -> Question:
    day = _date(rng)
    if rng.random() < 0.5:
        return f"{day} 是星期几？", {"date": day}, lambda r: WEEKDAYS_ZH[r]
    return f"What day of the week is {day}?", {"date": day}, lambda r: r


def _poem(titles: list[str]) -> Callable[[random.Random], Question]:
    def make(rng: random.Random) -> Question:
        title = rng.choice(titles)
        text = rng.choice(["《{t}》是谁写的？", "诗歌《{t}》的作者是谁？",
                           "Who wrote the poem 《{t}》?", "查一下《{t}》的作者"]).format(t=title)
        return text, {"title": title}, lambda r: r
    return make


# --- records --------------------------------------------------------------------------------


def _offered(name: str | None, rng: random.Random) -> list[dict]:
    """The tools a record offers: the one it needs (a random one when it needs none), plus
    sometimes one more."""
    names = [name or rng.choice(TOOL_KINDS)]
    if rng.random() < DISTRACTOR_SHARE:
        names.append(rng.choice([t for t in TOOL_KINDS if t != names[0]]))
    rng.shuffle(names)
    return tool_schemas(names)


def _system(tools: list[dict]) -> dict:
    return {"role": "system", "content": "", "tools": json.dumps(tools, ensure_ascii=False)}


def tool_record(kind: str, question: Question, rng: random.Random) -> dict:
    """A conversation that calls ``kind`` once and answers from the result."""
    text, arguments, answer_of = question
    result = json.loads(execute_tool(kind, arguments))
    if "result" not in result:
        raise RuntimeError(f"the generator asked {kind}{arguments} and got {result}")
    answer = answer_of(str(result["result"]))
    call = {"name": kind, "arguments": arguments}
    return {"conversations": [
        _system(_offered(kind, rng)), {"role": "user", "content": text},
        {"role": "assistant", "content": "", "tool_calls": json.dumps([call], ensure_ascii=False)},
        {"role": "tool", "content": json.dumps(result, ensure_ascii=False)},
        {"role": "assistant", "content": answer}],
        "tool_task": kind, "family": "tool", "answer": answer, "call": call}


def without_tools_record(kind: str, question: Question) -> dict:
    """The same question with no tools offered, answered directly (right)."""
    text, arguments, answer_of = question
    answer = answer_of(str(json.loads(execute_tool(kind, arguments))["result"]))
    return {"conversations": [{"role": "user", "content": text},
                              {"role": "assistant", "content": answer}],
            "tool_task": "without_tools", "family": "tool", "answer": answer, "call": None,
            "asks": kind}


def no_tool_record(sft: dict, rng: random.Random) -> dict:
    """A bundled SFT question with tools offered that it does not need."""
    user, reply = sft["conversations"][0], sft["conversations"][-1]
    return {"conversations": [_system(_offered(None, rng)), dict(user), dict(reply)],
            "tool_task": "no_tool", "family": "tool", "answer": sft.get("answer", reply["content"]),
            "call": None, "asks": sft["task"]}


def multi_step_record(rng: random.Random, think: bool) -> dict:
    """``a + b + c`` (or with a minus) of small numbers; with ``think`` the reply's reasoning
    writes the two steps."""
    a, b, c = rng.randint(1, 20), rng.randint(1, 20), rng.randint(1, 9)
    op = rng.choice(["+", "-"])
    first, total = a + b, a + b + (c if op == "+" else -c)
    expression = f"{a} + {b} {op} {c}"
    text = rng.choice(["{e} = ?", "算一下：{e}", "What is {e}?"]).format(e=expression)
    answer = f"{expression} = {total}"
    reply = {"role": "assistant", "content": answer}
    if think:
        reply["reasoning_content"] = f"{a} + {b} = {first}\n{first} {op} {c} = {total}"
    return {"conversations": [{"role": "user", "content": text}, reply],
            "tool_task": "multi_step", "family": "tool", "answer": answer, "call": None,
            "thinking": think}


def _question_key(record: dict) -> str:
    return next(m["content"] for m in record["conversations"] if m["role"] == "user")


def _unique(make: Callable[[random.Random], Question], n: int, rng: random.Random,
            taken: set[str]) -> list[Question]:
    out = []
    for _ in range(n * 50):
        question = make(rng)
        if question[0] not in taken:
            taken.add(question[0])
            out.append(question)
            if len(out) == n:
                return out
    raise RuntimeError(f"could not draw {n} distinct questions")


def build(data_dir: Path, seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """(training records, eval records): disjoint questions, and disjoint poem titles."""
    rng = random.Random(seed)
    titles = sorted(poem_authors())
    rng.shuffle(titles)
    held_titles, train_titles = titles[:len(titles) // 5], titles[len(titles) // 5:]
    makers = {"calculate": _calculate, "convert_units": _convert, "days_between": _days,
              "weekday": _weekday}
    train: list[dict] = []
    held: list[dict] = []
    taken: set[str] = set()
    for kind in TOOL_KINDS:
        held_make = makers.get(kind) or _poem(held_titles)
        train_make = makers.get(kind) or _poem(train_titles)
        held += [tool_record(kind, q, rng) for q in _unique(held_make, EVAL_PER_KIND, rng, taken)]
        train += [tool_record(kind, q, rng) for q in _unique(train_make, TRAIN[kind], rng, taken)]
        per_kind = TRAIN["without_tools"] // len(TOOL_KINDS)
        train += [without_tools_record(kind, q) for q in _unique(train_make, per_kind, rng, taken)]
    sft = [r for r in read_jsonl(data_dir / "sft_sample.jsonl", "sft") if r.get("task")]
    sft_eval = [r for r in read_jsonl(data_dir / "eval/sft_eval.jsonl", "sft") if r.get("task")]
    train += [no_tool_record(r, rng) for r in rng.sample(sft, TRAIN["no_tool"])]
    held += [no_tool_record(r, rng) for r in rng.sample(sft_eval, EVAL_PER_KIND)]
    multi_held, multi_train = [], []
    while len(multi_held) < EVAL_PER_KIND or len(multi_train) < TRAIN["multi_step"]:
        record = multi_step_record(rng, think=rng.random() < 0.5)
        if _question_key(record) in taken:
            continue
        taken.add(_question_key(record))
        (multi_held if len(multi_held) < EVAL_PER_KIND else multi_train).append(record)
    held += multi_held
    train += multi_train[:TRAIN["multi_step"]]
    rng.shuffle(train)
    return train, held


def agent_rl_record(record: dict) -> dict:
    """A tool record as an agent-RL task (MiniMind's format): the prompt, the final answer as
    the last (dropped) turn, ``gt`` the tool's result where the answer writes it verbatim."""
    turns = record["conversations"]
    result = str(json.loads(turns[3]["content"])["result"])
    return {"conversations": [turns[0], turns[1], dict(turns[-1])],
            "gt": [result if result in record["answer"] else record["answer"]],
            "tool_task": record["tool_task"], "answer": record["answer"]}


def build_agent_rl(train: list[dict], held: list[dict], seed: int = SEED) -> list[dict]:
    """``AGENT_PER_KIND`` new questions of each tool kind (none in ``train`` or ``held``; poem
    titles from the training ones), as agent-RL tasks."""
    rng = random.Random(seed + 1)
    taken = {_question_key(r) for r in train + held}
    titles = sorted({json.loads(r["conversations"][2]["tool_calls"])[0]["arguments"]["title"]
                     for r in train if r["tool_task"] == "poem_author"})
    makers = {"calculate": _calculate, "convert_units": _convert, "days_between": _days,
              "weekday": _weekday, "poem_author": _poem(titles)}
    records = [agent_rl_record(tool_record(kind, q, rng)) for kind in TOOL_KINDS
               for q in _unique(makers[kind], AGENT_PER_KIND, rng, taken)]
    rng.shuffle(records)
    return records


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")


def readme_section(files: dict[str, list[dict]], data_dir: Path) -> str:
    """data/README.md's section on these files: counts measured from the records written."""
    kinds = sorted({r["tool_task"] for records in files.values() for r in records})
    lines = ["## Tool-use and thinking data (notebook 14)", "",
             "Built by `python scripts/build_tool_data.py` (offline, deterministic: seed "
             f"{SEED}) from files already here; every answer computed by the course's safe "
             "executor (`minimind_lib.tools.execute_tool`). "
             "`dataset_files(\"sft\")` reads `sft_tools.jsonl` after the SFT sample.", "",
             "| file | records | size | " + " | ".join(f"`{k}`" for k in kinds) + " |",
             "|---|---:|---:|" + "---:|" * len(kinds)]
    for name, records in files.items():
        counts = Counter(r["tool_task"] for r in records)
        size = (data_dir / name).stat().st_size
        lines.append(f"| `{name}` | {len(records):,} | {size / 1e6:.2f} MB | "
                     + " | ".join(f"{counts.get(k, 0):,}" for k in kinds) + " |")
    lines += ["", "Format: MiniMind-3's `sft_t2t` records. A system message with `content` \"\" "
              "and `tools` (the offered OpenAI function schemas as a JSON string: the tool the "
              f"question needs, and in {DISTRACTOR_SHARE:.0%} of records one more), the user's "
              "question, an assistant turn with `tool_calls` (a JSON string), the `tool` result "
              "(`{\"result\": ...}`) and the final answer. `no_tool`: a question of the SFT "
              "sample (`eval/`: of its held-out set) with tools offered that it does not need; "
              "`without_tools`: a tool question with none offered, answered directly; "
              "`multi_step`: a three-number sum, half with its two steps in "
              "`reasoning_content` (thinking), half without (an empty think block). Extra keys: "
              "`tool_task`, `family` (\"tool\"), `answer` (the exact final reply), `call` "
              "(the expected call or null); held-out questions and poem titles are disjoint "
              "from the training ones.", "",
              f"`{AGENT_FILE}` (notebook 15, the `agent` stage): agent-RL tasks in MiniMind's "
              "`agent_rl.jsonl` format: `conversations` (the system turn with the offered tools, "
              "the question, and a last assistant turn the trainer drops) and `gt` (what a right "
              "final answer contains: the tool's result as the answer writes it), plus "
              "`tool_task` and `answer`; new questions, none in the two files above.", "",
              "Licences: the arithmetic, unit and date questions are generated (the course's "
              "MIT licence); the poem titles and authors come from `pretrain_sample.jsonl` "
              "(chinese-poetry, MIT) and the `no_tool` questions from `sft_sample.jsonl` / "
              "`eval/sft_eval.jsonl`, under their sources' licences above."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "data",
                        help="the data folder to write into (default: data/)")
    args = parser.parse_args(argv)
    train, held = build(REPO / "data")
    write_jsonl(args.out / TRAIN_FILE, train)
    write_jsonl(args.out / EVAL_FILE, held)
    agent = build_agent_rl(train, held)
    write_jsonl(args.out / AGENT_FILE, agent)
    files = {TRAIN_FILE: train, EVAL_FILE: held, AGENT_FILE: agent}
    for name, records in files.items():
        counts = Counter(r["tool_task"] for r in records)
        print(f"{name}: {len(records):,} records "
              f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})")
    readme = args.out / "README.md"
    if readme.is_file():
        data_readme.replace_tools_section(readme, readme_section(files, args.out))
        print(f"{readme}: tool-use section updated")


if __name__ == "__main__":
    main()
