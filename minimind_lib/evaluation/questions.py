"""Evaluation: held-out perplexity, and held-out questions scored per task (notebook 05).

Two kinds of measurement, both on data the model never trained on (``data/eval/``):

* **perplexity** of held-out text: ``exp(-(1/N) sum_t log p(x_t | x_<t))`` over the ``N``
  predicted tokens of one token stream (documents joined by ``<|endoftext|>``, as in
  pretraining). It needs no generation and works on any model, pretrained or chat.
* **bits per byte** of the same text: the summed NLL divided by ``ln 2`` times the UTF-8 bytes
  the predicted tokens spell. Perplexity is per *token*, so it only compares models that share
  a tokenizer; bits per byte compares any two (ours, MiniMind2-Small, a Hugging Face model).
* **questions** with a checkable answer, answered greedily through the chat template
  (``generate_answers``), then scored per task (``evaluate_sft``):

  - *exact-match*: the reply, stripped of surrounding whitespace, equals the reference;
  - *format rate*: the reply follows the template: non-empty, no stray role markers, and
    closed by ``<|im_end|>`` within ``max_new_tokens``;
  - *char-F1*: F1 of the multisets of non-space characters of reply and reference (the
    SQuAD token-F1, Rajpurkar et al. 2016, over characters so Chinese and English count
    alike): partial credit where exact-match gives none.

>>> char_f1("李白", "李白"), char_f1("杜甫", "李白"), round(char_f1("the cat", "the hat"), 3)
(1.0, 0.0, 0.833)
>>> Answer("李白", ended=True).follows_format, Answer("李白", ended=False).follows_format
(True, False)
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from minimind_lib import DATA_DIR
from minimind_lib.data.readers import DataFormatError, read_jsonl
from minimind_lib.model.generation import generate_many
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.chat import encode_chat
from minimind_lib.tokenizer.special import END_OF_TEXT, IM_END, SPECIAL_TOKENS

EVAL_DIR = DATA_DIR / "eval"


# --- held-out files ----------------------------------------------------------------------


def eval_files(schema: str) -> list[Path]:
    """The held-out files of ``schema``: ``data/eval/<schema>_eval.jsonl`` and its
    ``_cc_by_sa`` companion when present.

    >>> [p.name for p in eval_files("sft")]
    ['sft_eval.jsonl', 'sft_eval_cc_by_sa.jsonl']
    """
    paths = [EVAL_DIR / f"{schema}_eval.jsonl", EVAL_DIR / f"{schema}_eval_cc_by_sa.jsonl"]
    found = [p for p in paths if p.is_file()]
    if not found:
        raise FileNotFoundError(f"{paths[0]}: no held-out {schema} data; rebuild data/ with "
                                "`make data` (scripts/build_data.py)")
    return found


def load_eval_records(paths: Iterable[str | Path] | None = None) -> list[dict]:
    """Held-out SFT questions (default: ``eval_files("sft")``), each checked to carry a
    ``"task"`` and an ``"answer"`` string (``"family"`` defaults to "unknown").

    >>> records = load_eval_records()
    >>> sorted({r["family"] for r in records}), records[0]["answer"] == reference(records[0])
    (['knowledge', 'skill'], True)
    """
    records = []
    for path in paths if paths is not None else eval_files("sft"):
        for i, record in enumerate(read_jsonl(path, "sft"), start=1):
            for key in ("task", "answer"):
                if not isinstance(record.get(key), str) or not record[key]:
                    raise DataFormatError(f"{path}: record {i}: field {key!r} must be a non-empty "
                                          "string (held-out questions need a task and a reference)")
            if record["conversations"][-1]["role"] != "assistant":
                raise DataFormatError(f"{path}: record {i}: the conversation must end with the "
                                      "assistant's reference reply")
            records.append({**record, "family": record.get("family", "unknown")})
    return records


def select_per_task(records: Sequence[dict], per_task: int | None) -> list[dict]:
    """The first ``per_task`` records of every task (file order; None = all), tasks in order
    of first appearance.

    >>> rs = [{"task": t, "i": i} for i, t in enumerate("ababa")]
    >>> [r["i"] for r in select_per_task(rs, 2)]
    [0, 2, 1, 3]
    """
    if per_task is not None and per_task <= 0:
        raise ValueError(f"per_task must be positive (or None for all), got {per_task}")
    by_task: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        if per_task is None or len(by_task[r["task"]]) < per_task:
            by_task[r["task"]].append(r)
    return [r for group in by_task.values() for r in group]


def prompt_messages(record: Mapping) -> list[dict]:
    """The conversation up to the reply to be generated (the last assistant turn is cut)."""
    messages = list(record["conversations"])
    return messages[:-1] if messages[-1]["role"] == "assistant" else messages


def reference(record: Mapping) -> str:
    """The reference answer: ``"answer"``, else the last assistant message."""
    return record.get("answer") or record["conversations"][-1]["content"]


# --- answering questions -----------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """A generated reply: ``text`` up to the first ``<|im_end|>`` (stray special tokens kept
    visible), and whether that ``<|im_end|>`` came within the token budget."""

    text: str
    ended: bool

    @property
    def follows_format(self) -> bool:
        """Non-empty, no role marker or end-of-text inside, closed by ``<|im_end|>``."""
        return (self.ended and bool(self.text.strip())
                and not any(s in self.text for s in SPECIAL_TOKENS))


def _as_messages(question: str | Sequence[dict]) -> list[dict]:
    return [{"role": "user", "content": question}] if isinstance(question, str) else list(question)


def reply(tokenizer: BPETokenizer, response: Sequence[int]) -> tuple[list[int], Answer]:
    """Cut generated ids at the first stop token (kept) and decode the reply before it; the
    reply has ended when that token is ``<|im_end|>``: what ``generate_answers`` and the RL
    samplers (``training.rollout``) keep of a generated row.

    >>> from minimind_lib.tokenizer.bpe import load_tokenizer
    >>> tok = load_tokenizer()
    >>> ids = tok.encode("7") + [tok.token_to_id("<|im_end|>"), 99, 98]
    >>> kept, answer = reply(tok, ids)
    >>> len(kept), answer
    (2, Answer(text='7', ended=True))
    """
    stops = (tokenizer.token_to_id(IM_END), tokenizer.token_to_id(END_OF_TEXT))
    stop = next((k for k, t in enumerate(response) if t in stops), None)
    if stop is None:
        return list(response), Answer(tokenizer.decode(list(response)), ended=False)
    return list(response[:stop + 1]), Answer(tokenizer.decode(list(response[:stop])),
                                             ended=response[stop] == stops[0])


@torch.inference_mode()
def generate_answers(model: nn.Module, tokenizer: BPETokenizer,
                     questions: Sequence[str | Sequence[dict]], max_new_tokens: int = 64, *,
                     batch_size: int = 64, progress: bool = True) -> list[Answer]:
    """Greedy replies to ``questions`` (a user message, or a conversation ending with one),
    rendered with the chat template plus the generation prompt ``<|im_start|>assistant\\n``.

    Up to ``batch_size`` prompts of any lengths decode together, and a finished reply's place
    goes to the next question (``model.generation.generate_many``): each reply is what the
    model says to that prompt alone. A reply stops at ``<|im_end|>`` or ``<|endoftext|>``.
    """
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    end_turn, end_text = tokenizer.token_to_id(IM_END), tokenizer.token_to_id(END_OF_TEXT)
    prompts = [encode_chat(tokenizer, _as_messages(q), add_generation_prompt=True)
               for q in questions]
    replies = generate_many(model, prompts, max_new_tokens, eos_token_id=[end_turn, end_text],
                            batch_size=batch_size, progress=progress, desc="answer")
    return [reply(tokenizer, row)[1] for row in replies]


# --- scores ------------------------------------------------------------------------------


def exact_match(prediction: str, answer: str) -> bool:
    """The reply equals the reference, ignoring surrounding whitespace.

    >>> exact_match(" 2 + 7 = 9", "2 + 7 = 9"), exact_match("9", "2 + 7 = 9")
    (True, False)
    """
    return prediction.strip() == answer.strip()


def char_f1(prediction: str, answer: str) -> float:
    """F1 of the character multisets (whitespace ignored); 1.0 when both are empty."""
    pred = Counter(c for c in prediction if not c.isspace())
    ref = Counter(c for c in answer if not c.isspace())
    if not pred or not ref:
        return float(pred == ref)
    common = sum((pred & ref).values())
    if common == 0:
        return 0.0
    precision, recall = common / sum(pred.values()), common / sum(ref.values())
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class TaskScores:
    """Scores of one task (or a family / everything): rates in [0, 1] over ``n`` questions."""

    task: str
    family: str
    n: int
    exact_match: float
    format_rate: float
    char_f1: float


def score_answers(records: Sequence[dict], answers: Sequence[Answer]) -> dict[str, TaskScores]:
    """Per-task scores of ``answers`` to ``records`` (same order), tasks in first-seen order.

    >>> recs = [{"task": "t", "family": "skill", "answer": "ab"}] * 2
    >>> score_answers(recs, [Answer("ab", True), Answer("a", False)])["t"]
    TaskScores(task='t', family='skill', n=2, exact_match=0.5, format_rate=0.5, char_f1=0.833...)
    """
    if len(records) != len(answers):
        raise ValueError(f"{len(records)} records but {len(answers)} answers")
    rows: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    family: dict[str, str] = {}
    for r, a in zip(records, answers, strict=True):
        ref = reference(r)
        rows[r["task"]].append((float(exact_match(a.text, ref)), float(a.follows_format),
                                char_f1(a.text, ref)))
        family[r["task"]] = r.get("family", "unknown")
    return {task: _mean_scores(task, family[task], values) for task, values in rows.items()}


def _mean_scores(task: str, family: str, values: list[tuple[float, float, float]]) -> TaskScores:
    n = len(values)
    em, fmt, f1 = (sum(v[k] for v in values) / n for k in range(3))
    return TaskScores(task, family, n, em, fmt, f1)


def summarize(results: Mapping[str, TaskScores]) -> dict[str, TaskScores]:
    """Question-weighted means per family and over all tasks: keys "skill", "knowledge"
    (those present) and "all".

    >>> s = summarize({"a": TaskScores("a", "skill", 1, 1.0, 1.0, 1.0),
    ...                "b": TaskScores("b", "knowledge", 3, 0.0, 1.0, 0.5)})
    >>> s["all"].exact_match, s["all"].char_f1
    (0.25, 0.625)
    """
    def pool(name: str, family: str, rows: list[TaskScores]) -> TaskScores:
        n = sum(r.n for r in rows)
        return TaskScores(name, family, n, *(sum(getattr(r, k) * r.n for r in rows) / n
                                             for k in ("exact_match", "format_rate", "char_f1")))

    out = {}
    for family in dict.fromkeys(r.family for r in results.values()):
        out[family] = pool(family, family, [r for r in results.values() if r.family == family])
    out["all"] = pool("all", "all", list(results.values()))
    return out


def answer_budget(tokenizer: BPETokenizer, records: Sequence[dict], slack: int = 8) -> int:
    """New-token budget for ``records``: the longest reference in tokens, plus one for
    ``<|im_end|>``, plus ``slack`` (a reply a little longer than the reference can still end).

    >>> from minimind_lib.tokenizer.bpe import load_tokenizer
    >>> answer_budget(load_tokenizer(), [{"answer": "李白"}, {"answer": "2 + 7 = 9"}])
    17
    """
    return max(len(tokenizer.encode(reference(r), allowed_special=set()))
               for r in records) + 1 + slack


def evaluate_sft(model: nn.Module, tokenizer: BPETokenizer, eval_records: Sequence[dict],
                 per_task: int | None = None, *, max_new_tokens: int | None = None,
                 batch_size: int = 64, progress: bool = True) -> dict[str, TaskScores]:
    """Exact-match, format rate and char-F1 per task on the first ``per_task`` held-out
    questions of each task (``load_eval_records()``), answered greedily through the chat
    template with ``max_new_tokens`` (default: ``answer_budget`` of those questions).
    ``summarize`` pools the tasks; ``question_table`` prints them."""
    chosen = select_per_task(eval_records, per_task)
    budget = max_new_tokens or answer_budget(tokenizer, chosen)
    answers = generate_answers(model, tokenizer, [prompt_messages(r) for r in chosen], budget,
                               batch_size=batch_size, progress=progress)
    return score_answers(chosen, answers)


METRICS = {"exact_match": "exact-match", "format_rate": "format", "char_f1": "char-F1"}


def question_table(results: Mapping[str, Mapping[str, TaskScores]],
                 metrics: Sequence[str] = tuple(METRICS)) -> str:
    """A markdown table comparing models: one row per task (then per family and "all"), one
    column per (metric, model). ``results`` maps a model name to its ``evaluate_sft`` output.

    >>> r = {"t": TaskScores("t", "skill", 4, 0.25, 1.0, 0.5)}
    >>> print(question_table({"before": r, "after": r}, metrics=["exact_match"]))
    | task | family | n | exact-match before | exact-match after |
    |---|---|---:|---:|---:|
    | t | skill | 4 | 25.0% | 25.0% |
    | **skill** | | 4 | 25.0% | 25.0% |
    | **all** | | 4 | 25.0% | 25.0% |
    """
    names = list(results)
    tables = {name: {**res, **{f"**{k}**": v for k, v in summarize(res).items()}}
              for name, res in results.items()}
    head = ["task", "family", "n"] + [f"{METRICS[m]} {name}" for m in metrics for name in names]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    first = tables[names[0]]
    for key, row in first.items():
        family = "" if key.startswith("**") else row.family
        cells = [key, family, str(row.n)]
        for m in metrics:
            cells += [f"{getattr(tables[name][key], m):.1%}" if key in tables[name] else "-"
                      for name in names]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
