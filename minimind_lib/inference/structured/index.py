"""The token-level index of an automaton (notebook 18; Willard & Louf 2023, "Efficient Guided
Generation for Large Language Models"): for each state, the tokens whose bytes keep the
automaton alive, and the state each one leads to. Built once per grammar; decoding then costs
one table look-up and one masked fill per token.

Tokens are walked through a trie of their bytes, so a state where few bytes are allowed (inside
a literal like ``"name"``) prunes whole subtrees at once; a state inside a string visits most of
the vocabulary. Special tokens are single symbols (``automaton.SPECIAL_BASE + id``); the stop
tokens are allowed exactly where the output so far is a complete match.

>>> from minimind_lib.inference.structured.automaton import compile_regex
>>> vocab = TokenVocabulary([b"a", b"b", b"ab", b""], special={3: "<eos>"}, stop_ids={3})
>>> index = TokenIndex(compile_regex("a+b"), vocab)
>>> index.allowed(0), index.allowed(index.next_state(0, 0))   # after "a": more a, or b
([0, 2], [0, 1, 2])
>>> index.allowed(index.next_state(0, 2))   # after "ab": only the stop token
[3]
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from minimind_lib.inference.structured.automaton import DEAD, DFA, SPECIAL_BASE
from minimind_lib.tokenizer.special import END_OF_TEXT, IM_END


@dataclass
class TokenVocabulary:
    """A tokenizer's vocabulary as the index sees it: each id's bytes (``b""`` for special
    tokens), which ids are special (matched as one symbol each) and which stop decoding."""

    token_bytes: list[bytes]
    special: dict[int, str] = field(default_factory=dict)
    stop_ids: frozenset[int] = frozenset()
    trie: tuple = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.stop_ids = frozenset(self.stop_ids)
        root: tuple[dict, list] = ({}, [])
        for token_id, data in enumerate(self.token_bytes):
            if token_id in self.special or not data:
                continue
            node = root
            for byte in data:
                node = node[0].setdefault(byte, ({}, []))
            node[1].append(token_id)
        self.trie = root

    @property
    def size(self) -> int:
        return len(self.token_bytes)

    def by_bytes(self) -> dict[bytes, list[int]]:
        """The ordinary (not special) tokens' ids by their bytes: the form outlines-core's
        ``Vocabulary`` takes (tests and ``benchmarks/structured_bench.py`` compare with it)."""
        out: dict[bytes, list[int]] = {}
        for token_id, data in enumerate(self.token_bytes):
            if token_id not in self.special and data:
                out.setdefault(data, []).append(token_id)
        return out

    @classmethod
    def from_tokenizer(cls, tokenizer, stop_ids: Iterable[int] = ()) -> TokenVocabulary:
        """The course tokenizer's (``BPETokenizer``) vocabulary; ``stop_ids`` default to the
        ids of ``IM_END`` and ``END_OF_TEXT``."""
        special = {tokenizer.token_to_id(t): t for t in tokenizer.special_tokens}
        data = [b"" if i in special else tokenizer.token_bytes(i) for i in range(len(tokenizer))]
        stops = frozenset(stop_ids) or frozenset(i for i, t in special.items()
                                                 if t in (IM_END, END_OF_TEXT))
        return cls(data, special, stops)


class TokenIndex:
    """For every state of ``dfa``: the allowed token ids and the state each leads to.

    ``allowed(state)`` lists them, ``next_state(state, token)`` follows one, ``mask(state)`` is
    the (V,) bool tensor decoding uses (cached per state). ``build_seconds`` is the time the
    index took.
    """

    def __init__(self, dfa: DFA, vocab: TokenVocabulary) -> None:
        self.dfa, self.vocab = dfa, vocab
        start = time.perf_counter()
        self.moves: list[dict[int, int]] = [self._tokens_from(s) for s in range(dfa.num_states)]
        self.distance = self._distances()
        #: per state, the most tokens any allowed token leaves to a complete output
        self.worst = [max((self.distance[t] for t in set(m.values()) if t != DEAD), default=0)
                      for m in self.moves]
        self.build_seconds = time.perf_counter() - start
        self._masks: dict[int, Tensor] = {}
        self._after: dict[int, Tensor] = {}
        self._biases: dict[tuple, Tensor] = {}

    def _distances(self) -> list[int]:
        """The fewest tokens from each state to a complete match (0 in an accepting state):
        a breadth-first search backwards over the states the tokens connect."""
        back: list[set[int]] = [set() for _ in self.moves]
        for s, moves in enumerate(self.moves):
            for t in set(moves.values()):
                if t != DEAD:
                    back[t].add(s)
        far = len(self.moves) + 1
        distance = [0 if s in self.dfa.accepting else far for s in range(len(self.moves))]
        frontier = [s for s in range(len(self.moves)) if distance[s] == 0]
        while frontier:
            nxt = []
            for t in frontier:
                for s in back[t]:
                    if distance[s] == far:
                        distance[s] = distance[t] + 1
                        nxt.append(s)
            frontier = nxt
        return distance

    @property
    def min_tokens(self) -> int:
        """The fewest tokens any complete output takes (the stop token not counted)."""
        return self.distance[0]

    def _tokens_from(self, state: int) -> dict[int, int]:
        """Token id -> next state, for the tokens readable from ``state`` (stop ids: -1)."""
        nxt = self.dfa.next
        moves: dict[int, int] = {}
        stack = [(self.vocab.trie, state)]
        while stack:  # depth-first through the trie, pruning where the automaton dies
            (children, _), s = stack.pop()
            table = nxt[s]
            for byte, child in children.items():
                t = table.get(byte, DEAD)
                if t == DEAD:
                    continue
                for token_id in child[1]:
                    moves[token_id] = t
                if child[0]:
                    stack.append((child, t))
        for token_id in self.vocab.special:
            t = nxt[state].get(SPECIAL_BASE + token_id, DEAD)
            if t != DEAD:
                moves[token_id] = t
        if state in self.dfa.accepting:
            for token_id in self.vocab.stop_ids:
                moves.setdefault(token_id, DEAD)
        return moves

    @property
    def num_states(self) -> int:
        return self.dfa.num_states

    def allowed(self, state: int) -> list[int]:
        return sorted(self.moves[state])

    def next_state(self, state: int, token_id: int) -> int:
        """The state after ``token_id``; ``DEAD`` after a stop token; ``ValueError`` when the
        token is not allowed there."""
        try:
            return self.moves[state][token_id]
        except KeyError:
            raise ValueError(f"token {token_id} is not allowed in state {state}") from None

    def mask(self, state: int, device: torch.device | str | None = None,
             remaining: int | None = None) -> Tensor:
        """(V,) bool: True where the token is allowed. With ``remaining`` (tokens the row may
        still write, this one included), only tokens after which the output can still be
        completed in time: a budget can cut a reply short, never leave it unfinished."""
        if state not in self._masks:
            m = torch.zeros(self.vocab.size, dtype=torch.bool)
            m[list(self.moves[state])] = True
            self._masks[state] = m
        m = self._masks[state]
        if remaining is not None and remaining < self.worst[state] + 1:
            m = self._reachable(state) <= remaining - 1
        return m if device is None else m.to(device)

    def bias(self, state: int, device: torch.device | str | None = None,
             remaining: int | None = None) -> Tensor:
        """(V,) float32 to add to the logits: 0 where ``mask`` allows, -inf elsewhere (cached per
        state and device: decoding adds it in place, one operation a row)."""
        if remaining is not None and remaining < self.worst[state] + 1:  # near the budget's end
            allowed = self.mask(state, None, remaining)
            return torch.zeros(self.vocab.size).masked_fill_(~allowed, float("-inf")).to(device)
        key = (state, device)
        b = self._biases.get(key)
        if b is None:
            b = torch.zeros(self.vocab.size).masked_fill_(~self.mask(state), float("-inf"))
            b = self._biases[key] = b.to(device)
        return b

    def _reachable(self, state: int) -> Tensor:
        """(V,) int: after each allowed token, the fewest tokens left to a complete output
        (a stop token: 0); a large number for the tokens not allowed."""
        if state not in self._after:
            after = torch.full((self.vocab.size,), 1 << 30, dtype=torch.int32)
            ids = list(self.moves[state])
            after[ids] = torch.tensor([0 if self.moves[state][t] == DEAD
                                       else self.distance[self.moves[state][t]] for t in ids],
                                      dtype=torch.int32)
            self._after[state] = after
        return self._after[state]


class GrammarState:
    """One row's place in a grammar while it decodes: ``mask()`` before each token,
    ``advance(token)`` after it. ``done`` once a stop token was taken (or the grammar allows
    nothing more)."""

    def __init__(self, index: TokenIndex, state: int = 0) -> None:
        self.index, self.state = index, state
        self.tokens: list[int] = []

    @property
    def done(self) -> bool:
        return self.state == DEAD

    @property
    def stop_ids(self) -> frozenset[int]:
        """The tokens that may end the output where it is complete."""
        return self.index.vocab.stop_ids

    @property
    def min_tokens(self) -> int:
        """The fewest tokens that complete the output from here."""
        return 0 if self.done else self.index.distance[self.state]

    def mask(self, device: torch.device | str | None = None,
             remaining: int | None = None) -> Tensor:
        if self.done:  # complete: only stop tokens (a caller that does not stop at them)
            m = torch.zeros(self.index.vocab.size, dtype=torch.bool)
            m[list(self.index.vocab.stop_ids)] = True
            return m if device is None else m.to(device)
        return self.index.mask(self.state, device, remaining)

    def bias(self, device: torch.device | str | None = None,
             remaining: int | None = None) -> Tensor:
        """``mask`` as (V,) float32: 0 allowed, -inf not (what decoding adds to the logits)."""
        if self.done:
            allowed = self.mask()
            return torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf")).to(device)
        return self.index.bias(self.state, device, remaining)

    def advance(self, token_id: int) -> None:
        if self.done:
            if token_id not in self.index.vocab.stop_ids:
                raise ValueError("the grammar is complete; only a stop token may follow")
        else:
            self.state = self.index.next_state(self.state, token_id)
        self.tokens.append(token_id)
