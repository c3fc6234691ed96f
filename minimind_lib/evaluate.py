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

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from minimind_lib import DATA_DIR
from minimind_lib.data import DataFormatError, read_jsonl
from minimind_lib.files import EVAL_FILE
from minimind_lib.model import IGNORE_INDEX
from minimind_lib.tokenizer import END_OF_TEXT, IM_END, SPECIAL_TOKENS, BPETokenizer, encode_chat

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


# --- perplexity --------------------------------------------------------------------------


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.inference_mode()
def perplexity(model: nn.Module, tokenizer: BPETokenizer,
               texts_or_path: Sequence[str] | str | Path, seq_len: int, *, batch_size: int = 8,
               max_tokens: int | None = None, progress: bool = False) -> float:
    """Perplexity of ``model`` on held-out text: ``exp`` of the mean next-token NLL.

    ``texts_or_path``: a list of texts or a pretraining-format jsonl file. Texts are encoded,
    each followed by ``<|endoftext|>``, into one stream (cut to ``max_tokens``), read in
    windows of ``seq_len + 1`` tokens that overlap by one, so every token after the first is
    predicted exactly once, with up to ``seq_len`` tokens of context (the same windows the
    pretraining data uses).

    >>> from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
    >>> from minimind_lib.tokenizer import load_tokenizer
    >>> _ = torch.manual_seed(0)
    >>> tiny = MiniMindForCausalLM(MiniMindConfig(hidden_size=16, num_hidden_layers=1,
    ...                            num_attention_heads=2, num_key_value_heads=1))
    >>> ppl = perplexity(tiny, load_tokenizer(), ["a held-out sentence."] * 4, seq_len=8)
    >>> 5000 < ppl < 8000   # untrained: about the vocabulary size, 6400
    True
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    eos = tokenizer.token_to_id(END_OF_TEXT)
    encoded = tokenizer.encode_batch(_texts(texts_or_path), allowed_special=set())
    stream = [i for ids in encoded for i in ids + [eos]][:max_tokens]
    if len(stream) < 2:
        raise ValueError("perplexity needs at least 2 tokens of text")
    tokens = torch.tensor(stream)  # (N,)
    starts = list(range(0, len(stream) - 1, seq_len))
    device, was_training = _device(model), model.training
    model.eval()
    total_nll, count = 0.0, 0
    batches = [starts[i:i + batch_size] for i in range(0, len(starts), batch_size)]
    for batch in tqdm(batches, desc="perplexity", disable=not progress):
        # subtle: only the last window can be short; give it a batch of its own
        groups = [[s for s in batch if s + seq_len + 1 <= len(stream)],
                  [s for s in batch if s + seq_len + 1 > len(stream)]]
        for group in filter(None, groups):
            ids = torch.stack([tokens[s:s + seq_len + 1] for s in group]).to(device)  # (B, T+1)
            logits = model(ids[:, :-1]).logits.float()  # (B, T, V)
            total_nll += F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(),
                                         reduction="sum").item()
            count += ids[:, 1:].numel()
    model.train(was_training)
    return math.exp(total_nll / count)


def _texts(texts_or_path: Sequence[str] | str | Path) -> list[str]:
    """A list of texts as given, or the ``"text"`` fields of a pretraining-format jsonl file."""
    if isinstance(texts_or_path, str | Path):
        return [r["text"] for r in read_jsonl(texts_or_path, "pretrain")]
    return list(texts_or_path)


# --- bits per byte -----------------------------------------------------------------------


@torch.inference_mode()
def bits_per_byte(model: nn.Module, tokenizer: BPETokenizer,
                  texts_or_path: Sequence[str] | str | Path, *, context: int | None = None,
                  max_tokens: int | None = None, batch_size: int = 8,
                  progress: bool = False) -> float:
    """Bits per UTF-8 byte of held-out text: how many bits the model needs, on average, to
    encode each byte of it (lower is better; a tokenizer-independent form of perplexity).

    Each text is encoded without special tokens and cut to its first ``context`` tokens
    (default: the model's ``max_position_embeddings``); tokens 2..n of it are predicted
    from the tokens before them. With ``B`` the UTF-8 bytes those predicted tokens spell::

        bits/byte = sum_texts sum_{t=2..n} -ln p(x_t | x_<t)  /  (ln 2 * sum_texts B)

    (the measure of Gao et al. 2020, "The Pile"; over the same ``N`` predicted tokens,
    ``perplexity = 2 ** (bits/byte * B / N)``). ``max_tokens`` keeps only the first texts whose
    predicted tokens fit in that budget (at least one text).

    ``model``: ours or a ``transformers`` causal LM (anything whose output has ``.logits``);
    ``tokenizer``: anything with ``encode_batch(texts, allowed_special=set())`` and
    ``token_bytes(id)``: a ``BPETokenizer``, or ``hf.ByteLevelTokenizer`` around a Hugging Face
    tokenizer.

    >>> from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
    >>> from minimind_lib.tokenizer import load_tokenizer
    >>> _ = torch.manual_seed(0)
    >>> tiny = MiniMindForCausalLM(MiniMindConfig(hidden_size=16, num_hidden_layers=1,
    ...                            num_attention_heads=2, num_key_value_heads=1))
    >>> bpb = bits_per_byte(tiny, load_tokenizer(), ["a held-out sentence."] * 4)
    >>> 3 < bpb < 5   # untrained: log2(6400) = 12.6 bits per token, ~3 bytes a token
    True
    """
    context = context or model.config.max_position_embeddings
    if context < 2:
        raise ValueError(f"context must be at least 2 tokens, got {context}")
    encoded = [ids[:context] for ids in tokenizer.encode_batch(_texts(texts_or_path),
                                                               allowed_special=set())]
    encoded = _within_budget([ids for ids in encoded if len(ids) >= 2], max_tokens)
    if not encoded:
        raise ValueError("bits_per_byte needs a text of at least 2 tokens")
    n_bytes = sum(len(tokenizer.token_bytes(t)) for ids in encoded for t in ids[1:])
    # similar lengths share a batch (less padding); right padding never changes the logits of
    # the real tokens before it (causal attention), and its targets are ignored
    encoded.sort(key=len)
    device, was_training = _device(model), model.training
    model.eval()
    total_nll = 0.0
    batches = [encoded[i:i + batch_size] for i in range(0, len(encoded), batch_size)]
    for batch in tqdm(batches, desc="bits per byte", disable=not progress):
        width = max(len(ids) for ids in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)  # (B, T)
        targets = torch.full((len(batch), width - 1), IGNORE_INDEX)  # (B, T-1)
        for row, text_ids in enumerate(batch):
            ids[row, :len(text_ids)] = torch.tensor(text_ids)
            targets[row, :len(text_ids) - 1] = torch.tensor(text_ids[1:])
        logits = model(ids[:, :-1].to(device)).logits.float()  # (B, T-1, V)
        total_nll += F.cross_entropy(logits.flatten(0, 1), targets.flatten().to(device),
                                     ignore_index=IGNORE_INDEX, reduction="sum").item()
    model.train(was_training)
    return total_nll / (math.log(2) * n_bytes)


def _within_budget(encoded: list[list[int]], max_tokens: int | None) -> list[list[int]]:
    """The first texts whose predicted tokens (all but each text's first) fit ``max_tokens``.

    >>> _within_budget([[1, 2, 3], [4, 5], [6, 7]], max_tokens=3)
    [[1, 2, 3], [4, 5]]
    """
    if max_tokens is None:
        return encoded
    kept, used = [], 0
    for ids in encoded:
        if kept and used + len(ids) - 1 > max_tokens:
            break
        kept.append(ids)
        used += len(ids) - 1
    return kept


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


@torch.inference_mode()
def generate_answers(model: nn.Module, tokenizer: BPETokenizer,
                     questions: Sequence[str | Sequence[dict]], max_new_tokens: int = 64, *,
                     batch_size: int = 64, progress: bool = True) -> list[Answer]:
    """Greedy replies to ``questions`` (a user message, or a conversation ending with one),
    rendered with the chat template plus the generation prompt ``<|im_start|>assistant\\n``.

    ``model.generate`` has no padding mask, so prompts of equal token length are batched
    together (in chunks of ``batch_size``): each reply is what the model says to that prompt
    alone. A batch stops once every row has ended (``<|im_end|>`` or ``<|endoftext|>``).
    """
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    end_turn, end_text = tokenizer.token_to_id(IM_END), tokenizer.token_to_id(END_OF_TEXT)
    prompts = [encode_chat(tokenizer, _as_messages(q), add_generation_prompt=True) for q in questions]
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        by_length[len(p)].append(i)
    batches = [idx[k:k + batch_size] for _, idx in sorted(by_length.items())
               for k in range(0, len(idx), batch_size)]
    device, was_training = _device(model), model.training
    model.eval()
    answers: list[Answer | None] = [None] * len(prompts)
    bar = tqdm(total=len(prompts), desc="answer", disable=not progress)
    for idx in batches:
        ids = torch.tensor([prompts[i] for i in idx], device=device)  # (B, T)
        steps, done = [], torch.zeros(len(idx), dtype=torch.bool, device=device)
        for token in model.stream(ids, max_new_tokens, temperature=0, eos_token_id=end_turn):
            steps.append(token)  # (B,)
            done |= (token == end_turn) | (token == end_text)
            if bool(done.all()):
                break
        new = torch.stack(steps, dim=1).tolist()  # (B, new)
        for i, row in zip(idx, new, strict=True):
            stop = next((k for k, t in enumerate(row) if t in (end_turn, end_text)), len(row))
            ended = stop < len(row) and row[stop] == end_turn
            answers[i] = Answer(tokenizer.decode(row[:stop]), ended)
        bar.update(len(idx))
    bar.close()
    model.train(was_training)
    return answers


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

    >>> from minimind_lib.tokenizer import load_tokenizer
    >>> answer_budget(load_tokenizer(), [{"answer": "李白"}, {"answer": "2 + 7 = 9"}])
    17
    """
    return max(len(tokenizer.encode(reference(r), allowed_special=set())) for r in records) + 1 + slack


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


# --- one model's held-out record (what the stages write to eval.json) ----------------------


@dataclass
class ModelEval:
    """One model's held-out scores: per-task question scores, text perplexity and bits per
    byte (None in an ``eval.json`` written before it was measured)."""

    tasks: dict[str, TaskScores]
    perplexity: float
    bits_per_byte: float | None = None

    def to_dict(self) -> dict:
        return {"perplexity": self.perplexity, "bits_per_byte": self.bits_per_byte,
                "tasks": {k: asdict(v) for k, v in self.tasks.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> ModelEval:
        return cls({k: TaskScores(**v) for k, v in d["tasks"].items()}, d["perplexity"],
                   d.get("bits_per_byte"))


def evaluate_model(model: nn.Module, tokenizer: BPETokenizer, *, per_task: int | None,
                   seq_len: int, progress: bool = True) -> ModelEval:
    """``evaluate_sft`` on the first ``per_task`` held-out questions of every task, and the
    perplexity of the held-out pretraining text (``data/eval/pretrain_eval.jsonl``) in windows
    of ``seq_len`` tokens and its bits per byte (each text cut to ``seq_len`` tokens): the
    before/after record of the sft, dpo (and later) stages."""
    questions = select_per_task(load_eval_records(), per_task)
    tasks = evaluate_sft(model, tokenizer, questions,
                         max_new_tokens=answer_budget(tokenizer, questions), progress=progress)
    held_out = eval_files("pretrain")[0]
    ppl = perplexity(model, tokenizer, held_out, seq_len, progress=progress)
    bpb = bits_per_byte(model, tokenizer, held_out, context=seq_len, progress=progress)
    return ModelEval(tasks, ppl, bpb)


def read_eval(stage_dir: str | Path) -> dict[str, ModelEval]:
    """The models' held-out records in a stage folder's ``eval.json``, by name (the sft stage:
    {"pretrain": ..., "sft": ...}; dpo: {"sft": ..., "dpo": ...}; quantize: one per format)."""
    path = Path(stage_dir) / EVAL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (has the stage run?)")
    data = json.loads(path.read_text(encoding="utf-8"))
    return {name: ModelEval.from_dict(d) for name, d in data["models"].items()}


def eval_report(evals: Mapping[str, ModelEval]) -> str:
    """The question table (per task, per model), then perplexity and bits per byte, in markdown.

    >>> tasks = {"t": TaskScores("t", "skill", 1, 1.0, 1.0, 1.0)}
    >>> print(eval_report({"sft": ModelEval(tasks, 12.345, 1.2345)}).splitlines()[-1])
    held-out text perplexity: sft 12.3; bits per byte: sft 1.234
    """
    ppl = ", ".join(f"{name} {e.perplexity:.1f}" for name, e in evals.items())
    line = f"held-out text perplexity: {ppl}"
    if all(e.bits_per_byte is not None for e in evals.values()):
        line += "; bits per byte: " + ", ".join(f"{name} {e.bits_per_byte:.3f}"
                                                  for name, e in evals.items())
    return question_table({name: e.tasks for name, e in evals.items()}) + "\n\n" + line


# --- preference accuracy (notebook 06) ---------------------------------------------------


@dataclass(frozen=True)
class PreferenceScores:
    """Held-out preference accuracy of one task (or a family / "all") over ``n`` pairs.

    ``logprob_accuracy``: share of pairs where the model gives the chosen answer a higher
    summed log-probability than the rejected one (any model: SFT or DPO). ``reward_accuracy``:
    share where DPO's implicit reward ``beta log pi/pi_ref`` is higher for the chosen answer,
    i.e. the policy raised the chosen answer's log-prob more (or lowered it less) than the
    rejected one's, relative to the reference (None without reference log-probs; ``beta > 0``
    does not change the sign). Ties count as wrong.
    """

    task: str
    family: str
    n: int
    logprob_accuracy: float
    reward_accuracy: float | None


def score_preferences(tasks: Sequence[str | None], families: Sequence[str | None],
                      policy_logps: torch.Tensor,
                      reference_logps: torch.Tensor | None = None) -> dict[str, PreferenceScores]:
    """Per-task preference accuracy from (N, 2) log-probs ``[chosen, rejected]`` of every pair
    (``minimind_lib.dpo.pair_logprobs``); tasks in first-seen order, None counted as "all".

    >>> logps = torch.tensor([[-1.0, -2.0], [-3.0, -2.0], [-1.0, -5.0]])
    >>> ref = torch.tensor([[-1.0, -1.0], [-4.0, -1.0], [-1.0, -1.0]])
    >>> s = score_preferences(["a", "a", "b"], ["skill"] * 3, logps, ref)
    >>> s["a"].logprob_accuracy, s["a"].reward_accuracy, s["b"].n
    (0.5, 1.0, 1)
    """
    n = len(tasks)
    if policy_logps.shape != (n, 2) or len(families) != n:
        raise ValueError(f"{n} tasks, {len(families)} families and policy log-probs of shape "
                         f"{tuple(policy_logps.shape)}: expected (N, 2) for N pairs")
    if reference_logps is not None and reference_logps.shape != policy_logps.shape:
        raise ValueError(f"reference log-probs {tuple(reference_logps.shape)} do not match the "
                         f"policy's {tuple(policy_logps.shape)}")
    by_logprob = (policy_logps[:, 0] > policy_logps[:, 1]).tolist()
    by_reward = None
    if reference_logps is not None:
        ratio = policy_logps - reference_logps  # (N, 2): log pi/pi_ref of chosen, rejected
        by_reward = (ratio[:, 0] > ratio[:, 1]).tolist()
    rows: dict[str, list[int]] = defaultdict(list)
    family: dict[str, str] = {}
    for i, (task, fam) in enumerate(zip(tasks, families, strict=True)):
        rows[task or "all"].append(i)
        family[task or "all"] = fam or "unknown"
    return {task: PreferenceScores(
                task, family[task], len(idx), sum(by_logprob[i] for i in idx) / len(idx),
                None if by_reward is None else sum(by_reward[i] for i in idx) / len(idx))
            for task, idx in rows.items()}


def summarize_preferences(results: Mapping[str, PreferenceScores]) -> dict[str, PreferenceScores]:
    """Pair-weighted means per family and over all tasks: keys "skill", "knowledge" (those
    present) and "all".

    >>> s = summarize_preferences({"a": PreferenceScores("a", "skill", 1, 1.0, None),
    ...                            "b": PreferenceScores("b", "knowledge", 3, 0.0, None)})
    >>> s["all"].logprob_accuracy, s["all"].n, s["all"].reward_accuracy
    (0.25, 4, None)
    """
    def pool(name: str, rows: list[PreferenceScores]) -> PreferenceScores:
        n = sum(r.n for r in rows)
        logprob = sum(r.logprob_accuracy * r.n for r in rows) / n
        has_reward = all(r.reward_accuracy is not None for r in rows)
        reward = sum(r.reward_accuracy * r.n for r in rows) / n if has_reward else None
        return PreferenceScores(name, name, n, logprob, reward)

    out = {}
    for fam in dict.fromkeys(r.family for r in results.values()):
        out[fam] = pool(fam, [r for r in results.values() if r.family == fam])
    out["all"] = pool("all", list(results.values()))
    return out


def preference_table(results: Mapping[str, Mapping[str, PreferenceScores]]) -> str:
    """A markdown table comparing models' preference accuracy, per task, family and "all":
    one log-prob accuracy column per model, then an implicit-reward column per model that has
    a reference. ``results`` maps a model name to its ``score_preferences`` output.

    >>> r = {"t": PreferenceScores("t", "skill", 4, 0.5, None)}
    >>> d = {"t": PreferenceScores("t", "skill", 4, 0.75, 1.0)}
    >>> print(preference_table({"SFT": r, "DPO": d}))
    | task | family | n | log-prob acc. SFT | log-prob acc. DPO | reward acc. DPO |
    |---|---|---:|---:|---:|---:|
    | t | skill | 4 | 50.0% | 75.0% | 100.0% |
    | **skill** |  | 4 | 50.0% | 75.0% | 100.0% |
    | **all** |  | 4 | 50.0% | 75.0% | 100.0% |
    """
    tables = {name: {**res, **{f"**{k}**": v for k, v in summarize_preferences(res).items()}}
              for name, res in results.items()}
    with_reward = [name for name, res in results.items()
                   if all(r.reward_accuracy is not None for r in res.values())]
    head = (["task", "family", "n"] + [f"log-prob acc. {name}" for name in tables]
            + [f"reward acc. {name}" for name in with_reward])
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for key, row in next(iter(tables.values())).items():
        cells = [key, "" if key.startswith("**") else row.family, str(row.n)]
        cells += [f"{t[key].logprob_accuracy:.1%}" if key in t else "-" for t in tables.values()]
        cells += [f"{tables[name][key].reward_accuracy:.1%}" if key in tables[name] else "-"
                  for name in with_reward]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
