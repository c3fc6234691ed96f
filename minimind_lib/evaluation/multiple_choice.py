"""Multiple-choice scoring as lm-evaluation-harness does it (C-Eval, ARC, PIQA, HellaSwag...).

A language model does not "pick" an answer: each choice is scored as a continuation of the
context, by the log-likelihood the model gives its tokens,
``ll_i = sum_t log p(choice_i[t] | context, choice_i[<t])``, and

* ``acc``: the choice with the highest ``ll_i`` is the answer;
* ``acc_norm``: the highest ``ll_i / len(choice_i)``, the length in **characters** of the
  choice's text (lm-eval's ``completion_len = [len(c) for c in choices]``), so that a long
  choice is not penalised for having more tokens to pay for;
* chance: ``1 / (number of choices)``, averaged over the items.

The context and the continuation are tokenised as lm-eval's ``_encode_pair`` does: trailing
whitespace of the context moves to the front of the continuation, the whole text is encoded, and
the continuation is what follows the context's own ids (so a word keeps its leading-space token).
``continuation_logprobs`` is the one scoring loop: the multiple-choice scorer here and the
lm-evaluation-harness model (``inference.harness.MiniMindLM.loglikelihood``) both call it.

>>> mc_metrics([[-3.0, -2.0], [-9.0, -8.0]], [MCItem("q", ["a", "bbbbbbb"], 1),
...                                          MCItem("q", ["ccc", "d"], 0)])
MCScores(n=2, acc=0.5, acc_norm=1.0, chance=0.5)
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from minimind_lib.evaluation.questions import prompt_messages, reference
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.chat import apply_chat_template, template_of
from minimind_lib.tokenizer.special import END_OF_TEXT


@dataclass(frozen=True)
class MCItem:
    """One question: the ``context`` (prompt), the ``choices`` (continuations), the index of
    the right one (``gold``)."""

    context: str
    choices: list[str]
    gold: int

    def __post_init__(self) -> None:
        if len(self.choices) < 2 or not 0 <= self.gold < len(self.choices):
            raise ValueError(f"a multiple-choice item needs at least 2 choices and gold in "
                             f"range, got {len(self.choices)} choices and gold {self.gold}")


@dataclass(frozen=True)
class MCScores:
    """Accuracy by raw and by length-normalised log-likelihood, and the chance level."""

    n: int
    acc: float
    acc_norm: float
    chance: float


def encode_pair(tokenizer: BPETokenizer, context: str,
                continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval splits them (``TemplateLM.loglikelihood``).

    Trailing whitespace of the context moves to the front of the continuation; the whole text is
    encoded and the continuation is what follows the context's own ids. An empty context is the
    ``<|endoftext|>`` id (the model needs something to predict the first token from), unless the
    continuation itself starts with it. Special-token strings (``<|im_start|>``...) are parsed as
    the markers, as a Hugging Face tokenizer does in lm-eval, so a chat-templated context reaches
    the model as the template it was trained on.

    >>> from minimind_lib.tokenizer.bpe import load_tokenizer
    >>> tok = load_tokenizer()
    >>> ctx, cont = encode_pair(tok, "The sky is ", "blue")
    >>> tok.decode(cont)                   # the context's trailing space moved to the choice
    ' blue'
    """
    if not context:
        eos, ids = tokenizer.token_to_id(END_OF_TEXT), tokenizer.encode(continuation)
        return ([eos], ids) if not ids or ids[0] != eos else (ids[:1], ids[1:])
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer.encode(context + continuation)
    ctx = tokenizer.encode(context)
    return ctx, whole[len(ctx):]


@torch.no_grad()
def continuation_logprobs(model: nn.Module, rows: Sequence[tuple[Sequence[int], Sequence[int]]],
                          batch_size: int = 32) -> list[tuple[float, bool]]:
    """For each (context ids, continuation ids) row: the summed log-probability of the
    continuation after the context (fp32), and whether greedy decoding would have written it
    (every one of its tokens is the argmax): lm-eval's ``loglikelihood`` answer. Rows are scored
    ``batch_size`` at a time, right-padded; a row longer than the model's context keeps its last
    ``max_position_embeddings + 1`` tokens (as lm-eval's Hugging Face model does)."""
    room = model.config.max_position_embeddings
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[tuple[float, bool]] = []
    try:
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            batch = [(list(ctx) + list(cont))[-(room + 1):] for ctx, cont in chunk]
            n_cont = [min(len(cont), len(ids) - 1)  # a row cut into its continuation: all of it
                      for (_, cont), ids in zip(chunk, batch, strict=True)]
            width = max(len(ids) for ids in batch) - 1
            inputs = torch.zeros(len(batch), width, dtype=torch.long)  # (B, T) right-padded
            for b, ids in enumerate(batch):
                inputs[b, :len(ids) - 1] = torch.tensor(ids[:-1])
            logits = model(inputs.to(device), return_logits=True).logits.float()  # (B, T, V)
            logp = F.log_softmax(logits, dim=-1)
            for b, ids in enumerate(batch):
                end, first = len(ids) - 1, len(ids) - 1 - n_cont[b]
                targets = torch.tensor(ids[first + 1:end + 1], device=device)  # (n_cont,)
                rows_logp = logp[b, first:end]  # (n_cont, V)
                greedy = bool((rows_logp.argmax(-1) == targets).all())
                out.append((rows_logp.gather(1, targets[:, None]).sum().item(), greedy))
    finally:
        model.train(was_training)
    return out


def choice_logprobs(model: nn.Module, tokenizer: BPETokenizer, items: Sequence[MCItem],
                    batch_size: int = 32) -> list[list[float]]:
    """``ll`` of every choice of every item: ``continuation_logprobs`` of each
    (context, choice) pair split by ``encode_pair``."""
    rows = [encode_pair(tokenizer, item.context, c) for item in items for c in item.choices]
    flat = [ll for ll, _ in continuation_logprobs(model, rows, batch_size)]
    per_item, k = [], 0
    for item in items:
        per_item.append(flat[k:k + len(item.choices)])
        k += len(item.choices)
    return per_item


def mc_metrics(lls: Sequence[Sequence[float]], items: Sequence[MCItem]) -> MCScores:
    """``acc``, ``acc_norm`` and chance from each item's choice log-likelihoods (ties: the
    first choice, as ``numpy.argmax``)."""
    acc = norm = chance = 0.0
    for ll, item in zip(lls, items, strict=True):
        scores = list(ll)
        normed = [s / max(len(c), 1) for s, c in zip(scores, item.choices, strict=True)]
        acc += scores.index(max(scores)) == item.gold
        norm += normed.index(max(normed)) == item.gold
        chance += 1 / len(item.choices)
    n = len(items)
    return MCScores(n, acc / n, norm / n, chance / n)


def score_multiple_choice(model: nn.Module, tokenizer: BPETokenizer, items: Sequence[MCItem],
                          batch_size: int = 32) -> MCScores:
    """``mc_metrics`` of ``choice_logprobs``: the scores lm-eval reports for a
    ``multiple_choice`` task."""
    if not items:
        raise ValueError("no multiple-choice items to score")
    return mc_metrics(choice_logprobs(model, tokenizer, items, batch_size), items)


# --- the course's held-out questions as multiple choice ------------------------------------

#: how a question becomes a context: "plain" as lm-eval's tasks write it without a template
#: (ARC's ``Question: ...\nAnswer:``), "chat" through the model's chat template (what
#: ``lm_eval --apply_chat_template`` does, and how MiniMind runs its benchmarks)
MC_FORMATS = ("plain", "chat")


def held_out_items(records: Sequence[Mapping], *, pool: Sequence[Mapping] | None = None,
                   n_choices: int = 4, seed: int = 0, fmt: str = "plain",
                   template: str = "minimind-3") -> list[MCItem]:
    """Multiple-choice versions of held-out questions (``questions.load_eval_records``): the
    reference answer and ``n_choices - 1`` distractors, other answers of the same task in
    ``pool`` (default: ``records``), the right one at a random place. Distractors come from the
    same task so that every choice has the form of an answer (a poet for a poet, a sum for a
    sum): only knowing the answer helps. The draw is seeded by ``seed`` and the question, so a
    question gets the same choices in any selection of the records.

    >>> rs = [{"task": "t", "answer": a, "conversations": [{"role": "user", "content": q}]}
    ...       for q, a in [("1+1?", "2"), ("2+2?", "4"), ("3+3?", "6")]]
    >>> item = held_out_items(rs, n_choices=3)[0]
    >>> item.context, sorted(item.choices), item.choices[item.gold]
    ('Question: 1+1?\\nAnswer: ', ['2', '4', '6'], '2')
    """
    if fmt not in MC_FORMATS:
        raise ValueError(f"fmt must be one of {MC_FORMATS}, got {fmt!r}")
    pools: dict[str, list[str]] = {}
    for r in pool if pool is not None else records:
        answers = pools.setdefault(r["task"], [])
        if reference(r) not in answers:
            answers.append(reference(r))
    items = []
    for r in records:
        gold, messages = reference(r), prompt_messages(r)
        rng = random.Random(f"{seed}|{r['task']}|{messages[-1]['content']}")
        others = [a for a in pools.get(r["task"], []) if a != gold]
        if len(others) < n_choices - 1:
            raise ValueError(f"task {r['task']!r} has {len(others) + 1} distinct answers, "
                             f"too few for {n_choices} choices")
        choices = rng.sample(others, n_choices - 1)
        place = rng.randrange(n_choices)
        choices.insert(place, gold)
        context = (apply_chat_template(messages, True, template=template) if fmt == "chat"
                   else f"Question: {messages[-1]['content']}\nAnswer: ")
        items.append(MCItem(context, choices, place))
    return items


def held_out_mc(model: nn.Module, tokenizer: BPETokenizer, records: Sequence[Mapping], *,
                pool: Sequence[Mapping] | None = None, fmt: str = "plain",
                batch_size: int = 32) -> dict[str, MCScores]:
    """``acc`` / ``acc_norm`` / chance of ``held_out_items(records, pool=pool)``, every choice
    scored once, grouped by ``mc_by_group``."""
    items = held_out_items(records, pool=pool, fmt=fmt, template=template_of(tokenizer))
    return mc_by_group(records, items, choice_logprobs(model, tokenizer, items, batch_size))


def mc_by_group(records: Sequence[Mapping], items: Sequence[MCItem],
                lls: Sequence[Sequence[float]]) -> dict[str, MCScores]:
    """``mc_metrics`` per task, per family (``"family:skill"``...) and over all (``"all"``) of
    the items made from ``records`` and their choices' log-likelihoods ``lls``."""
    groups: dict[str, list[int]] = {}
    for k, r in enumerate(records):
        for name in (r["task"], f"family:{r.get('family', 'unknown')}", "all"):
            groups.setdefault(name, []).append(k)
    return {name: mc_metrics([lls[k] for k in ks], [items[k] for k in ks])
            for name, ks in groups.items()}
