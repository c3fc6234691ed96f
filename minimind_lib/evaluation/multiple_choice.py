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
spaces of the context move to the front of the continuation, the whole text is encoded, and the
continuation is what follows the context's own ids (so a word keeps its leading-space token).

>>> mc_metrics([[-3.0, -2.0], [-9.0, -8.0]], [MCItem("q", ["a", "bbbbbbb"], 1),
...                                          MCItem("q", ["ccc", "d"], 0)])
MCScores(n=2, acc=0.5, acc_norm=1.0, chance=0.5)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from minimind_lib.tokenizer.bpe import BPETokenizer
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


def encode_pair(tokenizer: BPETokenizer, context: str, continuation: str) -> tuple[list[int],
                                                                                   list[int]]:
    """(context ids, continuation ids) as lm-eval splits them. An empty context is the
    ``<|endoftext|>`` id (the model needs something to predict the first token from).

    >>> from minimind_lib.tokenizer.bpe import load_tokenizer
    >>> tok = load_tokenizer()
    >>> ctx, cont = encode_pair(tok, "The sky is ", "blue")
    >>> tok.decode(cont)                   # the context's trailing space moved to the choice
    ' blue'
    """
    spaces = len(context) - len(context.rstrip(" "))
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    if not context:
        return [tokenizer.token_to_id(END_OF_TEXT)], tokenizer.encode(continuation, set())
    whole = tokenizer.encode(context + continuation, set())
    ctx = tokenizer.encode(context, set())
    return ctx, whole[len(ctx):]


@torch.no_grad()
def choice_logprobs(model: nn.Module, tokenizer: BPETokenizer, items: Sequence[MCItem],
                    batch_size: int = 32) -> list[list[float]]:
    """``ll`` of every choice of every item (fp32), scored in batches of ``batch_size``
    (context, choice) rows; a row longer than the model's context keeps its last tokens."""
    rows = [encode_pair(tokenizer, item.context, c) for item in items for c in item.choices]
    room = model.config.max_position_embeddings
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[float] = []
    try:
        for start in range(0, len(rows), batch_size):
            batch = [(ctx + cont)[-(room + 1):] for ctx, cont in rows[start:start + batch_size]]
            n_cont = [min(len(cont), len(ids) - 1) for (_, cont), ids  # a cut row: all of it
                      in zip(rows[start:start + batch_size], batch, strict=True)]
            width = max(len(ids) for ids in batch) - 1
            inputs = torch.zeros(len(batch), width, dtype=torch.long)  # (B, T) right-padded
            for b, ids in enumerate(batch):
                inputs[b, :len(ids) - 1] = torch.tensor(ids[:-1])
            logits = model(inputs.to(device), return_logits=True).logits.float()  # (B, T, V)
            logp = F.log_softmax(logits, dim=-1)
            for b, ids in enumerate(batch):
                end, first = len(ids) - 1, len(ids) - 1 - n_cont[b]
                targets = torch.tensor(ids[first + 1:end + 1], device=device)  # (n_cont,)
                out.append(logp[b, first:end].gather(1, targets[:, None]).sum().item())
    finally:
        model.train(was_training)
    per_item, k = [], 0
    for item in items:
        per_item.append(out[k:k + len(item.choices)])
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
