"""Notebook 17's exercise checks (benchmarks): the context / continuation split of a
multiple-choice item, and the two picks (``acc``, ``acc_norm``). Each compares the answer with
the library (``evaluation.multiple_choice``) and names the likely mistake; ``course.exercises``
registers them (``NOTEBOOK_17``).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from minimind_lib.evaluation.multiple_choice import MCItem, encode_pair, mc_metrics
from minimind_lib.tokenizer.bpe import load_tokenizer
from minimind_lib.tokenizer.special import END_OF_TEXT

PAIRS = [("The capital of France is ", "Paris"), ("Question: 2 + 2 =?\nAnswer:", " 4"),
         ("床前明月光，", "疑是地上霜"), ("Answer:\n\n", "yes"), ("", "hello"),
         ("A list: one, two,", " three")]


def _split_pair(answer: Callable) -> None:
    """``answer(tokenizer, context, continuation)`` = ``encode_pair``'s (context ids,
    continuation ids)."""
    tok = load_tokenizer()
    for context, continuation in PAIRS:
        want = encode_pair(tok, context, continuation)
        got = answer(tok, context, continuation)
        assert isinstance(got, tuple | list) and len(got) == 2, (
            f"return (context ids, continuation ids), got {got!r:.80}")
        got = (list(got[0]), list(got[1]))
        if got == want:
            continue
        case = f"context {context!r}, continuation {continuation!r}"
        if not context:
            raise AssertionError(f"{case}: an empty context is the {END_OF_TEXT} id "
                                 f"({want[0]}), so the first token has something to follow")
        assert got[0] + got[1] == want[0] + want[1], (
            f"{case}: the two parts together are not the whole text's ids: encode context + "
            "continuation once and take the continuation as what follows the context's own "
            "ids (encoded apart, a word loses its leading-space token)")
        assert got[0] == want[0], (
            f"{case}: context ids {got[0][-5:]} (last 5), expected {want[0][-5:]}: move the "
            "context's trailing whitespace to the front of the continuation first")
        raise AssertionError(f"{case}: continuation ids {got[1]}, expected {want[1]}")


def _picks(answer: Callable) -> None:
    """``answer(lls, choices)`` = (index of the highest ll, index of the highest ll per
    character of the choice), ties to the first."""
    rng = random.Random(0)
    cases = [([-3.0, -2.0], ["a", "bbbbbbb"]), ([-9.0, -8.0, -20.0], ["李白", "x", "杜甫很有名"]),
             ([-4.0, -4.0], ["aa", "bb"]), ([-6.0, -9.0], ["疑是地上霜", "low"])]
    for _ in range(30):
        n = rng.randint(2, 5)
        cases.append(([rng.uniform(-30, -1) for _ in range(n)],
                      ["".join(rng.choice("ab李白 ") for _ in range(rng.randint(1, 9)))
                       for _ in range(n)]))
    for lls, choices in cases:
        raw = max(range(len(lls)), key=lambda k: (lls[k], -k))
        norm = max(range(len(lls)), key=lambda k: (lls[k] / len(choices[k]), -k))
        assert mc_metrics([lls], [MCItem("q", choices, raw)]).acc == 1  # the library agrees
        assert mc_metrics([lls], [MCItem("q", choices, norm)]).acc_norm == 1
        got = answer(list(lls), list(choices))
        assert isinstance(got, tuple | list) and len(got) == 2, (
            f"return (raw pick, normalised pick), got {got!r:.80}")
        got = (int(got[0]), int(got[1]))
        case = f"lls {[round(x, 2) for x in lls]}, choices {choices}"
        assert got[0] == raw, (f"{case}: raw pick {got[0]}, expected {raw}: the highest "
                               "log-likelihood (the least negative), first one on a tie")
        if got[1] == norm:
            continue
        by_bytes = max(range(len(lls)), key=lambda k: (lls[k] / len(choices[k].encode()), -k))
        assert got[1] != by_bytes, (f"{case}: normalised pick {got[1]}, expected {norm}: "
                                    "lm-eval divides by the length in characters "
                                    "(len(choice)), not UTF-8 bytes")
        raise AssertionError(f"{case}: normalised pick {got[1]}, expected {norm}: "
                             "ll / len(choice), the highest, first one on a tie")


#: exercise id -> its check (``course.exercises`` registers them)
NOTEBOOK_17 = {"17.1": _split_pair, "17.2": _picks}
