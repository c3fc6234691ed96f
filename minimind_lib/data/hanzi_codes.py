"""The new task family of the LoRA fine-tune: codes read out in Chinese numerals (notebook 09).

None of the bundled SFT tasks (``data/README.md``) asks for it, and the SFT model cannot do
it (exact-match 0% on ``data/reference/sft``), so what a fine-tune adds is plain to see. A
*code* is 3 to 6 digits; two tasks (family ``"domain"``):

* ``digits_to_hanzi``: read a code digit by digit in Chinese numerals, ``407`` -> ``四零七``;
* ``hanzi_to_digits``: the reverse, ``四零七`` -> ``407``.

Each answer is exact and computed from the prompt, so a small model can learn the rule from
examples, and the held-out split tests the rule, not memory: a fixed 10% of all codes (by a
stable hash of the code) only ever appear in held-out questions. Prompts come from a few
templates per task (Chinese and English); the records have the bundled SFT format with
``"task"``, ``"family"`` and ``"answer"``, so ``evaluation.questions.evaluate_sft`` scores them.
They are generated in memory from a seed (nothing is written under ``data/``).

>>> to_hanzi("407"), to_digits("四零七")
('四零七', '407')
>>> for r in task_records("eval", per_task=1):
...     print(r["task"], r["conversations"][0]["content"], "->", r["answer"])
digits_to_hanzi Read the code 3575 digit by digit in Chinese numerals. -> 三五七五
hanzi_to_digits 把“八六七九三”写成阿拉伯数字。 -> 86793
"""

from __future__ import annotations

import hashlib
import random

FAMILY = "domain"
TASKS = ("digits_to_hanzi", "hanzi_to_digits")
NUMERALS = "零一二三四五六七八九"  # NUMERALS[d] reads digit d
MIN_DIGITS, MAX_DIGITS = 3, 6
HELD_OUT_PERCENT = 10
#: The seed of the held-out questions: the same for every run, so scores compare.
EVAL_SEED = 0

TEMPLATES = {
    "digits_to_hanzi": ("用汉字逐位读出这个号码：{code}",
                        "把号码 {code} 一位一位地读成汉字。",
                        "Read the code {code} digit by digit in Chinese numerals."),
    "hanzi_to_digits": ("把“{hanzi}”写成阿拉伯数字。",
                        "号码“{hanzi}”用数字怎么写？",
                        "Write the code \"{hanzi}\" in digits."),
}


def to_hanzi(code: str) -> str:
    """``code`` read digit by digit: ``"2024"`` -> ``"二零二四"``."""
    if not code.isascii() or not code.isdigit():
        raise ValueError(f"a code is a string of digits 0-9, got {code!r}")
    return "".join(NUMERALS[int(d)] for d in code)


def to_digits(hanzi: str) -> str:
    """The inverse of ``to_hanzi``: ``"二零二四"`` -> ``"2024"``."""
    bad = [c for c in hanzi if c not in NUMERALS]
    if bad or not hanzi:
        raise ValueError(f"{hanzi!r} is not a code in Chinese numerals ({NUMERALS})")
    return "".join(str(NUMERALS.index(c)) for c in hanzi)


def is_held_out(code: str) -> bool:
    """Whether ``code`` belongs to the held-out split: a stable hash (SHA-256, the same on
    every machine and Python), not Python's salted ``hash``.

    >>> sum(is_held_out(f"{n:03d}") for n in range(1000))   # about 10% of the 3-digit codes
    89
    """
    digest = hashlib.sha256(code.encode("ascii")).digest()
    return int.from_bytes(digest[:8], "big") % 100 < HELD_OUT_PERCENT


def _code_of(record: dict) -> str:
    """The code a record is about (its digits): from the answer or the prompt."""
    if record["task"] == "hanzi_to_digits":
        return record["answer"]
    return "".join(c for c in record["conversations"][0]["content"] if c.isascii() and c.isdigit())


def _record(task: str, code: str, template: str) -> dict:
    hanzi = to_hanzi(code)
    answer = hanzi if task == "digits_to_hanzi" else code
    return {"conversations": [{"role": "user", "content": template.format(code=code, hanzi=hanzi)},
                              {"role": "assistant", "content": answer}],
            "task": task, "family": FAMILY, "answer": answer}


def task_records(split: str, per_task: int, seed: int = EVAL_SEED) -> list[dict]:
    """``per_task`` records of each task from ``split`` ("train": codes outside the held-out
    10%; "eval": codes inside it), tasks interleaved; distinct codes within a task. The code
    length is uniform in 3..6 digits, the template uniform among the task's. Deterministic in
    ``seed``.

    >>> held = task_records("eval", per_task=50)
    >>> all(is_held_out(_code_of(r)) for r in held), len(held)
    (True, 100)
    >>> any(is_held_out(_code_of(r)) for r in task_records("train", per_task=500, seed=1))
    False
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    available = sum(10 ** n for n in range(MIN_DIGITS, MAX_DIGITS + 1))
    share = HELD_OUT_PERCENT / 100 if split == "eval" else 1 - HELD_OUT_PERCENT / 100
    if not 0 < per_task <= available * share / 2:  # leave room to draw distinct codes
        raise ValueError(f"per_task must be in 1..{int(available * share / 2):,}, got {per_task}")
    rng = random.Random(f"{split}-{seed}")
    by_task: dict[str, list[dict]] = {}
    for task in TASKS:
        seen: set[str] = set()
        rows = by_task[task] = []
        while len(rows) < per_task:
            code = "".join(rng.choice("0123456789")
                           for _ in range(rng.randint(MIN_DIGITS, MAX_DIGITS)))
            if code not in seen and is_held_out(code) == (split == "eval"):
                seen.add(code)
                rows.append(_record(task, code, rng.choice(TEMPLATES[task])))
    return [r for pair in zip(*by_task.values(), strict=True) for r in pair]
