"""On-policy preference pairs: the model's own answers to checkable questions, graded by the
evaluation's checker, right over wrong (notebook 06; the ``dpo`` stage's default pairs).

``on_policy_pairs`` samples and grades, ``pick_pair`` decides which answers make a question's
pair, ``PairCounts`` / ``pair_table`` say what became of the questions.

>>> pick_pair([False, True]), pick_pair([True, True])
((1, 0), None)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
from torch import nn

from minimind_lib.model.decoder import IGNORE_INDEX
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.special import END_OF_TEXT, IM_END
from minimind_lib.training.dpo import DPODataset, PairExample
from minimind_lib.training.rollout import Question, Sample, is_correct, sample_answers


def pick_pair(correct: Sequence[bool]) -> tuple[int | None, int] | None:
    """Which of a question's graded samples make its pair: ``(chosen, rejected)`` indices, or
    None when every sample is right.

    * rejected: the first wrong sample. ``on_policy_pairs`` puts the greedy answer first, so
      when the greedy answer (the one the evaluation sees) is wrong, it is the one pushed down;
    * chosen: the first right sample, or None when no sample is right (then the caller uses
      the reference answer: the right answer the model could not find itself);
    * every sample right: no pair. A pair of two right answers teaches nothing the grader
      cares about, and the question is already solved; the budget goes to the others.

    >>> pick_pair([False, True, False]), pick_pair([True, False, True]), pick_pair([False] * 3)
    ((1, 0), (0, 1), (None, 0))
    >>> pick_pair([True, True]) is None
    True
    """
    wrong = [i for i, ok in enumerate(correct) if not ok]
    if not wrong:
        return None
    right = [i for i, ok in enumerate(correct) if ok]
    return (right[0] if right else None), wrong[0]


@dataclass
class PairCounts:
    """What ``on_policy_pairs`` made of one task's questions (or all: task "all")."""

    questions: int = 0
    pairs: int = 0  # (several per question with pairs_per_question > 1)
    sampled_chosen: int = 0  # pairs whose chosen answer is one of the model's own
    reference_chosen: int = 0  # pairs whose chosen answer is the reference (no sample right)
    all_right: int = 0  # questions without a pair: every sample was right
    greedy_right: int = 0  # questions the greedy answer got right
    too_long: int = 0  # pairs dropped: prompt + answer longer than seq_len


def on_policy_pairs(model: nn.Module, tokenizer: BPETokenizer, questions: Sequence[Question], *,
                    samples: int, temperature: float, max_new_tokens: int, seq_len: int,
                    pairs_per_question: int = 1, generator: torch.Generator | None = None,
                    progress: bool = False) -> tuple[DPODataset, dict[str, PairCounts]]:
    """Preference pairs from the model's own answers (on-policy DPO, notebook 06).

    For every question: the greedy answer plus ``samples - 1`` answers sampled at
    ``temperature`` (``rollout.sample_answers``), graded with the evaluation's checker
    (``rollout.is_correct``), paired by ``pick_pair``; a chosen answer the model did not find
    is the reference (its ids as ``data.sft_example`` tokenises it). ``pairs_per_question`` > 1
    pairs the same chosen answer with further *different* wrong answers too (in sample order),
    more pairs for the same sampling cost. Every pair is scored on the exact ids the model
    generated. Returns the dataset and per-task ``PairCounts``.
    """
    if samples < 2:
        raise ValueError("samples must be at least 2 (the greedy answer and one sample), "
                         f"got {samples}")
    greedy = sample_answers(model, tokenizer, questions, 1, max_new_tokens=max_new_tokens,
                            temperature=0.0, progress=progress)
    sampled = sample_answers(model, tokenizer, questions, samples - 1,
                             max_new_tokens=max_new_tokens, temperature=temperature,
                             generator=generator, progress=progress)
    end_turn = tokenizer.token_to_id(IM_END)
    counts: dict[str, PairCounts] = defaultdict(PairCounts)
    examples: list[PairExample] = []
    for q, group in zip(questions, (g + s for g, s in zip(greedy, sampled, strict=True)),
                        strict=True):
        count = counts[q.task]
        count.questions += 1
        correct = [is_correct(s.answer, q.answer) for s in group]
        count.greedy_right += correct[0]
        picked = pick_pair(correct)
        if picked is None:
            count.all_right += 1
            continue
        chosen = (group[picked[0]].response if picked[0] is not None
                  else tokenizer.encode(q.answer, allowed_special=set()) + [end_turn])
        for rejected in _rejected(group, correct, pairs_per_question):
            if len(rejected.prompt) + max(len(chosen), len(rejected.response)) > seq_len:
                count.too_long += 1
                continue
            count.pairs += 1
            count.sampled_chosen += picked[0] is not None
            count.reference_chosen += picked[0] is None
            examples.append((rejected.prompt + chosen,
                             [IGNORE_INDEX] * len(rejected.prompt) + chosen,
                             rejected.prompt + rejected.response, rejected.labels(), q.task,
                             q.family))
    counts["all"] = PairCounts(*(sum(getattr(c, f.name) for c in counts.values())
                                 for f in fields(PairCounts)))
    return DPODataset.from_examples(examples, tokenizer.token_to_id(END_OF_TEXT),
                                    "on-policy pairs"), dict(counts)


def _rejected(group: Sequence[Sample], correct: Sequence[bool], limit: int) -> list[Sample]:
    """The first ``limit`` wrong answers of a group with different token ids, in order (the
    first is ``pick_pair``'s rejected one)."""
    out: list[Sample] = []
    for sample, ok in zip(group, correct, strict=True):
        if not ok and len(out) < limit and all(sample.response != o.response for o in out):
            out.append(sample)
    return out


def pair_table(counts: dict[str, PairCounts]) -> str:
    """``on_policy_pairs``' counts as a markdown table, one row per task, then "all".

    >>> print(pair_table({"t": PairCounts(4, 3, 2, 1, 1, 2, 0)}))  # doctest: +ELLIPSIS
    | task | questions | greedy right | every sample right (no pair) | pairs | ...
    |---|---:|---:|---:|---:|---:|---:|
    | t | 4 | 2 | 1 | 3 | 2 | 1 |
    """
    lines = ["| task | questions | greedy right | every sample right (no pair) | pairs | "
             "chosen: own answer | chosen: reference |", "|---|" + "---:|" * 6]
    for task, c in counts.items():
        lines.append(f"| {task} | {c.questions} | {c.greedy_right} | {c.all_right} | {c.pairs} | "
                     f"{c.sampled_chosen} | {c.reference_chosen} |")
    return "\n".join(lines)
