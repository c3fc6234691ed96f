"""Scoring tool use and thinking (notebook 14) on the held-out questions of
``data/eval/tools_eval.jsonl`` (``scripts/build_tool_data.py``), each run through the tool loop
(``tools.run_with_tools``), greedy:

* a tool task (``calculate``, ``convert_units``, ``days_between``, ``weekday``,
  ``poem_author``): the share whose first call names the **right tool**, **call accuracy**
  (the right tool with equal arguments, after parsing), **exact match with the tools** (the
  final answer) and **without** (the same question, no tools offered: what the model knows by
  itself);
* ``no_tool`` (a question that needs none, tools offered): the **false-call** rate, and
  exact match;
* ``multi_step`` (a three-number sum): exact match with **thinking on** (the prompt opens the
  think block) and **off**, and the share of thinking-on replies that wrote reasoning.

Given ``constrain`` (``inference.structured.tool_grammar``), each tool and no-tool question is
asked again with every reply decoded under the tools' grammar: the **(grammar)** columns. Beside
**calls parse** (the first reply's calls all read), they show what a grammar fixes (the format)
and what it cannot (which tool, and the arguments copied from the question).

>>> same_arguments({"expression": "2+ 3"}, {"expression": "2 + 3"}), same_arguments(
...     {"value": 3, "to_unit": "m"}, {"value": 3.0, "to_unit": " m"})
(True, True)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from torch import nn
from tqdm.auto import tqdm

from minimind_lib.data.readers import DataFormatError, read_jsonl
from minimind_lib.evaluation.questions import eval_files, exact_match
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.chat3 import normalise_messages
from minimind_lib.tools.loop import run_with_tools

#: The columns of the table, per kind of question (None: not measured for it).
METRICS = {"right_tool": "right tool", "call_accuracy": "call accuracy",
           "with_tools": "EM with tools",
           "without_tools": "EM without tools", "false_calls": "false calls",
           "thinking_on": "EM thinking on", "thinking_off": "EM thinking off",
           "wrote_reasoning": "wrote reasoning", "calls_parse": "calls parse",
           "calls_parse_grammar": "calls parse (grammar)",
           "right_tool_grammar": "right tool (grammar)",
           "call_accuracy_grammar": "call accuracy (grammar)",
           "with_tools_grammar": "EM with tools (grammar)",
           "false_calls_grammar": "false calls (grammar)"}
MAX_NEW_TOKENS = 96  # a call or a final answer (the longest reference: ~60 tokens)


def load_tool_questions(per_task: int | None = None) -> list[dict]:
    """The held-out tool questions, the first ``per_task`` of each ``tool_task``; a record
    without ``tool_task``, ``answer`` or ``call`` is an error naming its line."""
    records, seen = [], {}
    for path in eval_files("tools"):
        for i, r in enumerate(read_jsonl(path, "sft"), start=1):
            if not isinstance(r.get("tool_task"), str) or not isinstance(r.get("answer"), str) \
                    or "call" not in r:
                raise DataFormatError(f"{path}: record {i}: held-out tool questions need "
                                      "'tool_task', 'answer' and 'call'")
            seen[r["tool_task"]] = seen.get(r["tool_task"], 0) + 1
            if per_task is None or seen[r["tool_task"]] <= per_task:
                records.append(r)
    return records


def same_arguments(got: Mapping, want: Mapping) -> bool:
    """Equal after parsing: the same keys, numbers equal as numbers, strings equal once
    trimmed (an expression's spaces ignored)."""
    if set(got) != set(want):
        return False
    for key, expected in want.items():
        value = got[key]
        if isinstance(expected, int | float) and not isinstance(expected, bool):
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or float(value) != float(expected):
                return False
        elif not isinstance(value, str) or "".join(value.split()) != "".join(expected.split()):
            return False
    return True


def _prompt(record: dict) -> tuple[list[dict], list[dict]]:
    """(messages before the first reply, the tools they offer)."""
    messages, tools = normalise_messages(record["conversations"])
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return [{k: v for k, v in m.items()} for m in messages[:first]], tools or []


def _rate(flags: Sequence[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


def _call_outcomes(run, record: dict) -> dict[str, bool]:
    """A tool run's outcomes against the record's expected call and answer."""
    called = bool(run.calls or run.errors)
    parsed = bool(run.round_errors) and run.round_errors[0] == 0 and "tool_calls" in next(
        m for m in run.messages if m["role"] == "assistant")
    if record["tool_task"] == "no_tool":
        return {"false_calls": called, "with_tools": exact_match(run.answer, record["answer"])}
    want, first = record["call"], (run.calls[0] if run.calls else None)
    return {"right_tool": first is not None and first["name"] == want["name"],
            "call_accuracy": (first is not None and first["name"] == want["name"]
                              and same_arguments(first["arguments"], want["arguments"])),
            "with_tools": run.answered and exact_match(run.answer, record["answer"]),
            "calls_parse": parsed}


def score_record(model: nn.Module, tokenizer: BPETokenizer, record: dict,
                 constrain: Callable | None = None) -> dict[str, bool]:
    """One held-out question's outcomes, by metric (the "_grammar" ones with ``constrain``)."""
    messages, tools = _prompt(record)
    kind, answer = record["tool_task"], record["answer"]

    def ask(offered: list[dict], rounds: int = 3, think: bool = False, grammar=None):
        return run_with_tools(model, tokenizer, messages if offered else
                              [m for m in messages if m["role"] != "system"], offered, rounds,
                              open_thinking=think, max_new_tokens=MAX_NEW_TOKENS,
                              constrain=grammar)

    if kind == "multi_step":
        on, off = ask([], 1, think=True), ask([], 1)
        return {"thinking_on": exact_match(on.answer, answer),
                "thinking_off": exact_match(off.answer, answer),
                "wrote_reasoning": bool(on.messages[-1].get("reasoning_content"))}
    out = _call_outcomes(ask(tools), record)
    if constrain is not None:
        out |= {f"{k}_grammar": v for k, v in
                _call_outcomes(ask(tools, grammar=constrain), record).items()}
    if kind != "no_tool":
        out["without_tools"] = exact_match(ask([], 1).answer, answer)
    return out


def evaluate_tools(model: nn.Module, tokenizer: BPETokenizer, per_task: int | None,
                   progress: bool = True,
                   constrain: Callable | None = None) -> dict[str, dict[str, float]]:
    """Every held-out kind's rates (``METRICS`` that apply) and its ``n``; with ``constrain``,
    the "(grammar)" columns too."""
    outcomes: dict[str, dict[str, list[bool]]] = {}
    for record in tqdm(load_tool_questions(per_task), desc="tool questions", unit="q",
                       disable=not progress):
        kind = outcomes.setdefault(record["tool_task"], {})
        for metric, ok in score_record(model, tokenizer, record, constrain).items():
            kind.setdefault(metric, []).append(bool(ok))
    return {task: {"n": len(next(iter(m.values())))} | {k: _rate(v) for k, v in m.items()}
            for task, m in outcomes.items()}


def tool_table(scores: Mapping[str, Mapping[str, float]]) -> str:
    """The scores as a markdown table (a dash where a metric does not apply).

    >>> print(tool_table({"weekday": {"n": 4, "call_accuracy": 1.0, "with_tools": 0.75}}))
    | questions | n | call accuracy | EM with tools |
    |---|---:|---:|---:|
    | weekday | 4 | 100.0% | 75.0% |
    """
    used = [m for m in METRICS if any(m in s for s in scores.values())]
    lines = ["| questions | n | " + " | ".join(METRICS[m] for m in used) + " |",
             "|---|---:|" + "---:|" * len(used)]
    for task, s in scores.items():
        cells = [f"{s[m]:.1%}" if m in s else "-" for m in used]
        lines.append(f"| {task} | {int(s['n'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
