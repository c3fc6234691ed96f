"""Notebook 18's exercise checks (structured outputs): the token index of one automaton state,
an ``enum`` as a regular expression, and the look-ahead distances that let a token budget cut a
reply short without leaving it unfinished. Each compares the answer with the library's
``inference.structured`` on small inputs and names the likely mistake; ``course.exercises``
registers them (``NOTEBOOK_18``), so this module needs nothing from it.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from minimind_lib.inference.structured.automaton import DEAD, compile_regex
from minimind_lib.inference.structured.index import TokenIndex, TokenVocabulary

#: a small vocabulary: ASCII pieces, a whole Chinese character and its bytes cut in two
_TOKENS = [b'"', b"a", b"b", b"ab", b'a"', b"1", b"12", b".", b"5", b'"}', b"{", b"}", b" ",
           "公".encode(), "公".encode()[:2], "公".encode()[2:], "里".encode(), b'\\"', b"x"]


def _reference_allowed(dfa, state: int) -> list[int]:
    return [i for i, data in enumerate(_TOKENS) if data and dfa.walk(state, data) != DEAD]


def _allowed_tokens(answer: Callable) -> None:
    """``answer(dfa, token_bytes, state)``: the ids whose bytes keep the automaton alive."""
    cases = [(r'"(a|b)*"', 0), (r'"(a|b)*"', 1), (r"(-)?(0|[1-9][0-9]*)(\.[0-9]+)?", 0),
             (r'\{"公里":[ ]?"[^"]*"\}', 0), ('"公里"', 1)]
    for pattern, state in cases:
        dfa = compile_regex(pattern)
        if state >= dfa.num_states:
            continue
        want = _reference_allowed(dfa, state)
        got = answer(dfa, list(_TOKENS), state)
        assert isinstance(got, list | tuple | set) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in got), (
            f"return a list of token ids (ints), got {got!r:.80}")
        got = sorted(set(got))
        if got == want:
            continue
        extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
        if extra:
            t = extra[0]
            raise AssertionError(f"regex {pattern!r}, state {state}: token {t} "
                                 f"({_TOKENS[t]!r}) kills the automaton on one of its bytes, "
                                 "yet you allow it: walk every byte, not only the first")
        t = missing[0]
        raise AssertionError(f"regex {pattern!r}, state {state}: token {t} ({_TOKENS[t]!r}) "
                             "keeps the automaton alive but is missing (a token may end "
                             "inside a character, or run past the next state)")


def _enum_regex(answer: Callable) -> None:
    """``answer(values)``: a regex whose matches are exactly the values' JSON texts."""
    cases = [["km", "mile", "公里"], [1.5, None, True], ['say "hi"', "a|b", "x.y"], [0, -2]]
    near = {"km": ["km", "\"km", "\"kmm\""], "1.5": ["105", "1.50", "\"1.5\""],
            "\"a|b\"": ["\"a\"", "\"b\""], "\"x.y\"": ["\"xzy\""], "null": ["None", "\"null\""],
            "true": ["True"], "\"say \\\"hi\\\"\"": ["\"say \"hi\"\""], "-2": ["2", "-"]}
    for values in cases:
        pattern = answer(list(values))
        assert isinstance(pattern, str) and pattern, (
            f"return a regular expression (a str), got {pattern!r:.80}")
        try:
            dfa = compile_regex(pattern)
        except ValueError as e:
            raise AssertionError(f"{pattern!r:.80} does not compile: {e}") from None
        for v in values:
            text = json.dumps(v, ensure_ascii=False)
            assert dfa.matches(text.encode()), (
                f"{values}: the JSON text {text} of {v!r} does not match {pattern!r:.80} "
                "(a string keeps its quotes; None is null, True is true)")
            for wrong in near.get(text, []):
                assert not dfa.matches(wrong.encode()), (
                    f"{values}: {pattern!r:.80} also matches {wrong!r}, which is not one of "
                    "the values' JSON texts: escape the characters a regex reads as syntax "
                    "(. | ( ) and friends)")


def _steps_to_finish(answer: Callable) -> None:
    """``answer(moves, accepting)``: per state, the fewest tokens to an accepting state."""
    vocab = TokenVocabulary([b'"', b"a", b"ab", b'a"', b"1", b"12", b"}", b""],
                            special={7: "[stop]"}, stop_ids={7})
    for pattern in (r'"(a|b)*"', r'\{"n":(1|2)+\}', r"a{3,5}"):
        index = TokenIndex(compile_regex(pattern), vocab)
        moves = [dict(m) for m in index.moves]
        got = answer(moves, set(index.dfa.accepting))
        assert isinstance(got, list | tuple) and len(got) == len(moves), (
            f"return one distance per state ({len(moves)}), got {got!r:.80}")
        for state, (g, w) in enumerate(zip(got, index.distance, strict=True)):
            assert isinstance(g, int) and not isinstance(g, bool), (
                f"state {state}: a distance is a whole number of tokens, got {g!r}")
            if g != w and state in index.dfa.accepting:
                raise AssertionError(f"regex {pattern!r}: state {state} is accepting, 0 tokens "
                                     f"from a complete output; you said {g} (count the tokens "
                                     "still to write, not the stop token)")
            if g != w:
                raise AssertionError(f"regex {pattern!r}: state {state} is {w} tokens from a "
                                     f"complete output, you said {g} (search backwards from "
                                     "the accepting states, one token per step; a stop token "
                                     "leads nowhere)")


#: exercise id -> its check (``course.exercises`` registers them)
NOTEBOOK_18 = {"18.1": _allowed_tokens, "18.2": _enum_regex, "18.3": _steps_to_finish}
