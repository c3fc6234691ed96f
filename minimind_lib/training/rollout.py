"""The model's own answers to checkable questions: sample them, grade them (notebooks 06, 10).

On-policy DPO (notebook 06) and GRPO (notebook 10) learn from what the model itself says, not
from answers someone else wrote. Both need the same two pieces:

1. **questions with a checkable answer**: the bundled SFT conversations carry a ``"task"``
   and a ``"family"``; their last assistant message is the reference (``Question``,
   ``verifiable_questions``; ``select_tasks`` picks task families by name);
2. **rollouts**: ``k`` answers per question sampled from the current model through the chat
   template (``sample_answers``), each kept as the exact token ids the model produced
   (training scores those tokens, not a re-tokenisation of the text), and graded with the
   checkers the evaluation uses (``is_correct``: ``evaluation.questions.exact_match`` and a
   well-formed end, ``Answer.follows_format``; ``verifiable_reward`` adds an optional format bonus).

The ``k`` copies of every prompt decode in batches of prompts of any lengths, a finished
answer's place going to the next prompt (``model.generation.generate_many``, as
``evaluation.questions.generate_answers`` runs).

>>> q = Question([{"role": "user", "content": "3 + 5 等于多少？"}], "3 + 5 = 8",
...              "arithmetic", "skill")
>>> verifiable_reward(Answer("3 + 5 = 8", ended=True), q.answer, format_weight=0.1)
1.1
>>> verifiable_reward(Answer("3 + 5 = 9", ended=True), q.answer, format_weight=0.1)
0.1
>>> is_correct(Answer("3 + 5 = 8", ended=False), q.answer)   # cut off: not a finished reply
False
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from minimind_lib.evaluation.questions import (
    Answer,
    char_f1,
    exact_match,
    prompt_messages,
    reference,
    reply,
)
from minimind_lib.model.decoder import IGNORE_INDEX
from minimind_lib.model.generation import generate_many
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.chat import encode_chat
from minimind_lib.tokenizer.special import END_OF_TEXT, IM_END

# --- 1. questions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    """A training prompt whose answer can be checked: the conversation up to the reply, the
    reference answer, and its task and family (``data/README.md`` lists them)."""

    messages: list[dict]
    answer: str
    task: str
    family: str


def verifiable_questions(records: Iterable[dict], tasks: str | None = None) -> list[Question]:
    """The SFT ``records`` (``data.read_jsonl(path, "sft")``) that carry a ``"task"``, as
    ``Question``s (reference: ``"answer"``, else the last assistant message), kept when their
    task is in ``select_tasks(tasks)`` (None: every task). Records without a task (e.g.
    MiniMind's own SFT data) cannot be checked and are left out.

    >>> chat = [{"role": "user", "content": "7 和 3 哪个大？"},
    ...         {"role": "assistant", "content": "7"}]
    >>> qs = verifiable_questions([{"conversations": chat, "task": "larger_number",
    ...                             "family": "skill"}, {"conversations": chat}])
    >>> [(q.task, q.answer, len(q.messages)) for q in qs]
    [('larger_number', '7', 1)]
    """
    out = []
    for r in records:
        if not r.get("task") or r["conversations"][-1]["role"] != "assistant":
            continue
        out.append(Question(prompt_messages(r), reference(r), r["task"],
                            r.get("family", "unknown")))
    if tasks is None:
        return out
    wanted = select_tasks(tasks, {q.task: q.family for q in out})
    return [q for q in out if q.task in wanted]


def select_tasks(spec: str, known: dict[str, str]) -> set[str]:
    """The tasks a comma-separated ``spec`` names: task names and family names (every task of
    that family); ``known`` maps each task to its family. An unknown name is an error.

    >>> known = {"arithmetic": "skill", "copy_en": "skill", "poem_author": "knowledge"}
    >>> sorted(select_tasks("skill", known)), sorted(select_tasks("poem_author, arithmetic", known))
    (['arithmetic', 'copy_en'], ['arithmetic', 'poem_author'])
    """
    chosen: set[str] = set()
    for name in (part.strip() for part in spec.split(",")):
        if name in known:
            chosen.add(name)
        elif name in set(known.values()):
            chosen |= {t for t, family in known.items() if family == name}
        else:
            raise ValueError(f"tasks: unknown task or family {name!r}; tasks: "
                             f"{', '.join(sorted(known))}; families: "
                             f"{', '.join(sorted(set(known.values())))}")
    return chosen


# --- 2. rollouts ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One sampled answer: the prompt's ids, the ``response`` ids exactly as generated (up to
    and including the first ``<|im_end|>`` or ``<|endoftext|>``, else all ``max_new_tokens``)
    and the decoded ``answer`` (``evaluation.questions.Answer``: the text before the stop token)."""

    prompt: list[int]
    response: list[int]
    answer: Answer

    def labels(self) -> list[int]:
        """SFT-style labels of ``prompt + response``: -100 on the prompt, the response ids on
        the response (what ``training.logprobs.sequence_logprobs`` scores).

        >>> Sample([5, 6], [7, 2], Answer("x", True)).labels()
        [-100, -100, 7, 2]
        """
        return [IGNORE_INDEX] * len(self.prompt) + list(self.response)


@torch.no_grad()
def sample_answers(model: nn.Module, tokenizer: BPETokenizer, questions: Sequence[Question],
                   k: int, *, max_new_tokens: int, temperature: float = 1.0,
                   top_k: int | None = None, generator: torch.Generator | None = None,
                   max_rows: int = 256, progress: bool = False) -> list[list[Sample]]:
    """``k`` answers to each question (``temperature`` 0: the greedy one, ``k`` times), as
    ``[[Sample] * k for each question]`` in question order.

    Up to ``max_rows`` rows decode at once (``model.generation.generate_many``); a row stops at
    ``<|im_end|>`` or ``<|endoftext|>``. The model runs in eval mode and is put back as it was.
    ``generator`` (on the model's device) makes the samples reproducible.
    """
    if k <= 0 or max_new_tokens <= 0:
        raise ValueError(f"k and max_new_tokens must be positive, got {k} and {max_new_tokens}")
    prompts = [encode_chat(tokenizer, q.messages, add_generation_prompt=True) for q in questions]
    stops = [tokenizer.token_to_id(IM_END), tokenizer.token_to_id(END_OF_TEXT)]
    rows = generate_many(model, [p for p in prompts for _ in range(k)], max_new_tokens,
                         eos_token_id=stops, batch_size=max_rows, temperature=temperature,
                         top_k=top_k, generator=generator, progress=progress, desc="sample")
    out: list[list[Sample]] = [[] for _ in questions]
    for n, response in enumerate(rows):
        kept, answer = reply(tokenizer, response)
        out[n // k].append(Sample(prompts[n // k], kept, answer))
    return out


# --- 3. grading -----------------------------------------------------------------------------


def is_correct(answer: Answer, reference_answer: str) -> bool:
    """Right: the reply equals the reference (``evaluation.questions.exact_match``) and is a
    finished, well-formed reply (``Answer.follows_format``: closed by ``<|im_end|>``, no stray
    marker)."""
    return answer.follows_format and exact_match(answer.text, reference_answer)


REWARDS = ("exact", "char_f1")


def verifiable_reward(answer: Answer, reference_answer: str, format_weight: float = 0.0,
                      kind: str = "exact") -> float:
    """The reward of one answer against the reference, plus ``format_weight`` when the reply
    follows the format (a small bonus for a finished reply, right or wrong).

    ``kind="exact"``: 1 when ``is_correct``, else 0 (the evaluation's exact-match).
    ``kind="char_f1"``: partial credit, ``evaluation.questions.char_f1`` of reply and reference (1
    for the exact answer): a denser signal for a model that is almost never exactly right.

    >>> round(verifiable_reward(Answer("3 + 5 = 9", ended=True), "3 + 5 = 8", kind="char_f1"), 6)
    0.8
    """
    if kind == "exact":
        score = float(is_correct(answer, reference_answer))
    elif kind == "char_f1":
        score = char_f1(answer.text, reference_answer)
    else:
        raise ValueError(f"reward kind is {kind!r}; choose one of {', '.join(REWARDS)}")
    return score + format_weight * answer.follows_format


def accuracy(groups: Sequence[Sequence[Sample]], questions: Sequence[Question]) -> float:
    """Share of all sampled answers that are right.

    >>> q = Question([], "7", "t", "skill")
    >>> accuracy([[Sample([], [], Answer("7", True)), Sample([], [], Answer("3", True))]], [q])
    0.5
    """
    graded = [is_correct(s.answer, q.answer) for g, q in zip(groups, questions, strict=True)
              for s in g]
    return sum(graded) / max(len(graded), 1)
