"""From a regular expression to a byte-level automaton (notebook 18).

A tokenizer's pieces are **bytes**, not characters: the course's BPE has tokens that hold half
of a Chinese character. So the automaton that guides decoding reads bytes. A character class
such as ``[^"\\\\]`` (every code point but two) becomes the UTF-8 byte sequences of its ranges
(``utf8_sequences``), and the expression becomes a Thompson NFA over bytes, then a DFA by the
subset construction. Symbols 256 and up are the tokenizer's special tokens (``Special``): a
grammar can say "the ``<tool_call>`` token here", which no run of bytes spells.

The regular expressions are the subset a JSON Schema compiles to: literals and escapes
(``\\n \\t \\xHH \\uHHHH \\d \\. \\{``), classes ``[a-z]`` / ``[^...]``, ``.``, groups ``(...)``
and ``(?:...)``, ``|``, ``?``, ``*``, ``+``, ``{m}``, ``{m,}``, ``{m,n}``. Anything else is a
``ValueError`` naming the position.

>>> dfa = compile_regex(r"-?(0|[1-9][0-9]*)")
>>> [dfa.matches(s.encode()) for s in ("0", "-42", "007", "4.2")]
[True, True, False, False]
>>> compile_regex("é").matches("é".encode()), len("é".encode())   # two bytes, one character
(True, 2)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

MAX_CODE_POINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)
SPECIAL_BASE = 256  # special token k is symbol 256 + k in an automaton
MAX_REPEAT = 1000  # {m,n} bounds above this are refused (each copy is NFA states)
MAX_STATES = 20_000  # a grammar whose automaton grows past this is refused (a hostile schema)
DEAD = -1

# ---------------------------------------------------------------- the expression tree


@dataclass(frozen=True)
class Chars:
    """A set of code points, as sorted disjoint inclusive ranges."""

    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Special:
    """One special token (its id in the tokenizer), matched as one symbol."""

    token_id: int


@dataclass(frozen=True)
class Concat:
    parts: tuple


@dataclass(frozen=True)
class Alt:
    options: tuple


@dataclass(frozen=True)
class Repeat:
    """``item`` between ``low`` and ``high`` times (``high`` None: unbounded)."""

    item: object
    low: int
    high: int | None


def literal(text: str) -> Concat:
    """The expression that matches ``text`` exactly."""
    return Concat(tuple(Chars(((ord(c), ord(c)),)) for c in text))


def _normalise(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def _complement(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    out, start = [], 0
    for lo, hi in ranges:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return tuple(out)


# ---------------------------------------------------------------- parsing

_CLASS_ESCAPES = {"d": ((48, 57),), "s": ((9, 10), (13, 13), (32, 32)),
                  "w": ((48, 57), (65, 90), (95, 95), (97, 122))}
_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.s, self.i = pattern, 0

    def fail(self, what: str) -> ValueError:
        return ValueError(f"regular expression {self.s!r:.80}: {what} at position {self.i}")

    def peek(self) -> str | None:
        return self.s[self.i] if self.i < len(self.s) else None

    def parse(self):
        tree = self.alternation()
        if self.i != len(self.s):
            raise self.fail(f"unexpected {self.s[self.i]!r}")
        return tree

    def alternation(self):
        options = [self.concatenation()]
        while self.peek() == "|":
            self.i += 1
            options.append(self.concatenation())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def concatenation(self):
        parts = []
        while self.peek() not in (None, "|", ")"):
            parts.append(self.repetition())
        return parts[0] if len(parts) == 1 else Concat(tuple(parts))

    def repetition(self):
        item = self.atom()
        while self.peek() in ("?", "*", "+", "{"):
            c = self.s[self.i]
            if c == "{":
                bounds = self.bounds()
                if bounds is None:
                    break
                item = Repeat(item, *bounds)
                continue
            self.i += 1
            item = Repeat(item, *{"?": (0, 1), "*": (0, None), "+": (1, None)}[c])
        return item

    def bounds(self) -> tuple[int, int | None] | None:
        end = self.s.find("}", self.i)
        body = self.s[self.i + 1:end] if end > 0 else ""
        low, comma, high = body.partition(",")
        if not low.isdigit() or (high and not high.isdigit()):
            raise self.fail(f"bad repetition {{{body}}}")
        lo, hi = int(low), (int(high) if high else (None if comma else int(low)))
        if (hi is not None and hi < lo) or max(lo, hi or 0) > MAX_REPEAT:
            raise self.fail(f"repetition {{{body}}} must have low <= high <= {MAX_REPEAT}")
        self.i = end + 1
        return lo, hi

    def atom(self):
        c = self.peek()
        if c == "(":
            self.i += 1
            if self.s.startswith("?:", self.i):
                self.i += 2
            elif self.peek() == "?":
                raise self.fail("only (...) and (?:...) groups are supported")
            tree = self.alternation()
            if self.peek() != ")":
                raise self.fail("missing )")
            self.i += 1
            return tree
        if c == "[":
            return self.char_class()
        if c in ("*", "+", "?", "{", ")"):
            raise self.fail(f"nothing to repeat before {c!r}" if c != ")" else "unbalanced )")
        if c in ("^", "$"):
            raise self.fail("anchors are implicit (the whole output must match)")
        self.i += 1
        if c == ".":
            return Chars(_complement(((10, 10),)))
        if c == "\\":
            escaped = self.escape()
            return escaped if isinstance(escaped, Chars) else Chars(((escaped, escaped),))
        return Chars(((ord(c), ord(c)),))

    def escape(self) -> int | Chars:
        """After a backslash: a code point, or a class (``\\d``)."""
        c = self.peek()
        if c is None:
            raise self.fail("trailing backslash")
        self.i += 1
        if c in _CLASS_ESCAPES:
            return Chars(_CLASS_ESCAPES[c])
        if c in _CHAR_ESCAPES:
            return ord(_CHAR_ESCAPES[c])
        if c in "xu":
            width = 2 if c == "x" else 4
            digits = self.s[self.i:self.i + width]
            if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"\\{c} needs {width} hex digits")
            self.i += width
            return int(digits, 16)
        if c.isalnum():
            raise self.fail(f"unsupported escape \\{c}")
        return ord(c)

    def char_class(self) -> Chars:
        self.i += 1
        negate = self.peek() == "^"
        self.i += negate
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            c = self.peek()
            if c is None:
                raise self.fail("missing ]")
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            lo = self.class_char()
            if isinstance(lo, Chars):
                ranges += lo.ranges
                continue
            if self.peek() == "-" and self.s[self.i + 1:self.i + 2] not in ("]", ""):
                self.i += 1
                hi = self.class_char()
                if isinstance(hi, Chars) or hi < lo:
                    raise self.fail("bad range in a character class")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        merged = _normalise(ranges)
        return Chars(_complement(merged) if negate else merged)

    def class_char(self) -> int | Chars:
        c = self.s[self.i]
        self.i += 1
        return self.escape() if c == "\\" else ord(c)


def parse_regex(pattern: str):
    """The expression tree of ``pattern`` (``Chars``, ``Concat``, ``Alt``, ``Repeat``)."""
    return _Parser(pattern).parse()


# ---------------------------------------------------------------- code points -> UTF-8 bytes


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """The code points ``lo..hi`` as UTF-8 byte-range sequences: every code point's encoding
    matches exactly one sequence, byte by byte (surrogates have no encoding and are skipped).

    >>> utf8_sequences(0x41, 0x5A)
    [[(65, 90)]]
    >>> utf8_sequences(0x7F, 0x80)
    [[(127, 127)], [(194, 194), (128, 128)]]
    """
    out: list[list[tuple[int, int]]] = []
    todo = [(lo, hi)]
    while todo:
        lo, hi = todo.pop(0)
        if lo > hi:
            continue
        if lo <= _SURROGATES[1] and hi >= _SURROGATES[0]:
            todo[:0] = [(lo, _SURROGATES[0] - 1), (_SURROGATES[1] + 1, hi)]
            continue
        split = next((b for b in (0x7F, 0x7FF, 0xFFFF) if lo <= b < hi), None)
        if split is not None:  # different encoded lengths
            todo[:0] = [(lo, split), (split + 1, hi)]
            continue
        for i in (1, 2, 3):  # align on continuation-byte boundaries
            m = (1 << (6 * i)) - 1
            if lo & ~m != hi & ~m:
                if lo & m:
                    todo[:0] = [(lo, lo | m), ((lo | m) + 1, hi)]
                    break
                if hi & m != m:
                    todo[:0] = [(lo, (hi & ~m) - 1), (hi & ~m, hi)]
                    break
        else:
            out.append(list(zip(chr(lo).encode(), chr(hi).encode(), strict=True)))
    return out


# ---------------------------------------------------------------- NFA and DFA


@dataclass
class _NFA:
    """Thompson's construction: ``edges[s]`` = [(lo, hi, target)] over symbols, ``eps[s]``."""

    edges: list[list[tuple[int, int, int]]] = field(default_factory=list)
    eps: list[list[int]] = field(default_factory=list)

    def state(self) -> int:
        if len(self.edges) >= 10 * MAX_STATES:
            raise ValueError(f"the grammar needs more than {10 * MAX_STATES} NFA states; "
                             "simplify the schema (smaller maxLength / maxItems)")
        self.edges.append([])
        self.eps.append([])
        return len(self.edges) - 1

    def build(self, tree, start: int) -> int:
        """Add ``tree`` from ``start``; returns its end state."""
        if isinstance(tree, Special):
            end = self.state()
            symbol = SPECIAL_BASE + tree.token_id
            self.edges[start].append((symbol, symbol, end))
            return end
        if isinstance(tree, Chars):
            end = self.state()
            for lo, hi in tree.ranges:
                for seq in utf8_sequences(lo, hi):
                    s = start
                    for k, (a, b) in enumerate(seq):
                        t = end if k == len(seq) - 1 else self.state()
                        self.edges[s].append((a, b, t))
                        s = t
            return end
        if isinstance(tree, Concat):
            for part in tree.parts:
                start = self.build(part, start)
            return start
        if isinstance(tree, Alt):
            end = self.state()
            for option in tree.options:
                s = self.state()
                self.eps[start].append(s)
                self.eps[self.build(option, s)].append(end)
            return end
        if isinstance(tree, Repeat):
            for _ in range(tree.low):
                start = self.build(tree.item, start)
            if tree.high is None:  # a loop
                s = self.state()
                self.eps[start].append(s)
                self.eps[self.build(tree.item, s)].append(start)
                return start
            end = self.state()
            for _ in range(tree.high - tree.low):
                self.eps[start].append(end)
                start = self.build(tree.item, start)
            self.eps[start].append(end)
            return end
        raise TypeError(f"not an expression: {tree!r}")

    def closure(self, states: Iterable[int]) -> frozenset[int]:
        seen, todo = set(states), list(states)
        while todo:
            for t in self.eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)


@dataclass
class DFA:
    """A deterministic automaton over symbols (bytes 0-255, special token k as 256 + k).

    ``next[s]`` maps a symbol to the next state (missing: dead); state 0 is the start;
    ``accepting`` the states where the whole input so far is a match.
    """

    next: list[dict[int, int]]
    accepting: frozenset[int]

    @property
    def num_states(self) -> int:
        return len(self.next)

    def step(self, state: int, symbol: int) -> int:
        return self.next[state].get(symbol, DEAD) if state != DEAD else DEAD

    def walk(self, state: int, data: Sequence[int]) -> int:
        """The state after reading ``data`` (bytes or symbols) from ``state``; ``DEAD`` if
        it dies on the way."""
        for symbol in data:
            state = self.next[state].get(symbol, DEAD)
            if state == DEAD:
                return DEAD
        return state

    def matches(self, data: Sequence[int]) -> bool:
        return self.walk(0, data) in self.accepting


def compile_tree(tree) -> DFA:
    """The DFA of an expression tree (subset construction), keeping only live states: every
    state it has can still reach an accepting one."""
    nfa = _NFA()
    start = nfa.state()
    final = nfa.build(tree, start)
    first = nfa.closure([start])
    ids = {first: 0}
    sets, moves = [first], []
    while len(moves) < len(sets):
        current = sets[len(moves)]
        cuts: set[int] = set()
        for s in current:
            for lo, hi, _ in nfa.edges[s]:
                cuts.update((lo, hi + 1))
        bounds = sorted(cuts)
        move: dict[int, int] = {}
        for lo, hi in zip(bounds, bounds[1:], strict=False):  # elementary intervals [lo, hi)
            targets = [t for s in current for a, b, t in nfa.edges[s] if a <= lo and hi - 1 <= b]
            if not targets:
                continue
            target = nfa.closure(targets)
            if target not in ids:
                if len(sets) >= MAX_STATES:
                    raise ValueError(f"the grammar needs more than {MAX_STATES} automaton "
                                     "states; simplify the schema")
                ids[target] = len(sets)
                sets.append(target)
            for symbol in range(lo, hi):
                move[symbol] = ids[target]
        moves.append(move)
    accepting = {i for i, s in enumerate(sets) if final in s}
    return _prune(moves, accepting)


def _prune(moves: list[dict[int, int]], accepting: set[int]) -> DFA:
    """Drop the states that cannot reach an accepting one (so a token is allowed only when the
    output can still be finished), renumbering the rest with the start as 0."""
    back: list[set[int]] = [set() for _ in moves]
    for s, move in enumerate(moves):
        for t in move.values():
            back[t].add(s)
    alive, todo = set(accepting), list(accepting)
    while todo:
        for s in back[todo.pop()]:
            if s not in alive:
                alive.add(s)
                todo.append(s)
    if 0 not in alive:
        raise ValueError("the expression matches nothing")
    order = sorted(alive)
    new = {s: i for i, s in enumerate(order)}
    nxt = [{sym: new[t] for sym, t in moves[s].items() if t in alive} for s in order]
    return DFA(nxt, frozenset(new[s] for s in accepting))


def compile_regex(pattern: str) -> DFA:
    """The byte-level DFA of a regular expression (the whole input must match)."""
    return compile_tree(parse_regex(pattern))
