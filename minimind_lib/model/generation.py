"""Generating from many prompts at once (notebook 08): prompts of different lengths in one
batch, each row at its own position over a ``StaticCache``; rows that finish leave the batch.

The ecosystem's convention (transformers'): a batch of prompts arrives **left-padded**, with an
``attention_mask`` that is 0 on the padding. ``unpad`` takes each row's real tokens back out;
inside, nothing is padded for attention: row ``b`` sits at positions ``0 .. len_b - 1`` of the
cache, so its RoPE angles, ALiBi distances and the keys it reads are exactly those of the prompt
decoded alone. That is why a row's greedy answer does not depend on its neighbours
(``tests/test_generation.py`` checks it over random prompt lengths, for every position
encoding).

``Decoding`` is the loop's state: ``prefill`` reads new prompts (and can add them to a running
batch: the server's requests join between steps), ``step`` feeds one token a row, ``keep``
drops finished rows. ``decode_stream`` is ``MiniMindForCausalLM.stream`` on top of it.

>>> ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
>>> ids.tolist(), mask.tolist()
([[5, 6, 7], [0, 0, 8]], [[1, 1, 1], [0, 0, 1]])
>>> [row.tolist() for row in unpad(ids, mask)]
[[5, 6, 7], [8]]
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from minimind_lib.model.kv_cache import StaticCache
from minimind_lib.model.sampling import sample_next_token


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int = 0,
             device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """``(input_ids, attention_mask)``, both (B, T): the prompts right-aligned, ``pad_id`` and
    mask 0 before the shorter ones (transformers' left padding for generation)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.as_tensor(list(prompt))
        mask[row, width - len(prompt):] = 1
    return ids.to(device), mask.to(device)


def unpad(input_ids: Tensor, attention_mask: Tensor | None = None) -> list[Tensor]:
    """Each row's real tokens (1-D tensors): ``input_ids`` (B, T) without the positions where
    ``attention_mask`` is 0 (all of them kept when it is None)."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, seq_len), got shape {tuple(input_ids.shape)}")
    if attention_mask is None:
        return list(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} must equal "
                         f"input_ids shape {tuple(input_ids.shape)}")
    rows = [ids[m.bool()] for ids, m in zip(input_ids, attention_mask, strict=True)]
    if any(len(r) == 0 for r in rows):
        raise ValueError("a row of attention_mask is all 0: every prompt needs a token")
    return rows


def right_pad(rows: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """``(ids (B, T), lengths (B,))``: rows left-aligned, padded on the right with their own
    last token (never read: causal attention looks only left)."""
    lengths = torch.tensor([len(r) for r in rows], device=rows[0].device)
    width = int(lengths.max())
    ids = torch.stack([torch.cat((r, r[-1:].expand(width - len(r)))) for r in rows])  # (B, T)
    return ids, lengths


class Decoding:
    """The state of a batch being decoded: a ``StaticCache`` and the rows in it.

    ``capacity`` is the most positions any row will need (its prompt plus its new tokens),
    ``max_batch`` the most rows at once. The model must be a ``MiniMindForCausalLM`` (its trunk
    ``model.model`` and ``lm_head``).
    """

    def __init__(self, model: nn.Module, capacity: int, max_batch: int,
                 initial_capacity: int | None = None) -> None:
        limit = model.config.max_position_embeddings
        if capacity > limit:
            raise ValueError(f"{capacity} positions exceed max_position_embeddings ({limit})")
        self.model, self.capacity = model, capacity
        start = capacity if initial_capacity is None else min(initial_capacity, capacity)
        self.cache = StaticCache(len(model.model.layers), start, max_batch, max_capacity=capacity)

    @property
    def size(self) -> int:
        """Rows in the batch."""
        return self.cache.batch

    def prefill(self, prompts: Sequence[Tensor]) -> Tensor:
        """Read new prompts (1-D token tensors) and add their rows after the current ones;
        returns the logits of each prompt's next token (n, V), fp32."""
        ids, lengths = right_pad(prompts)  # (n, T)
        if ids.shape[1] >= self.capacity:  # the longest prompt
            raise ValueError(f"a prompt of {ids.shape[1]} tokens leaves no room in a "
                             f"cache of {self.capacity} positions")
        fresh = StaticCache(self.cache.num_layers, ids.shape[1], max_batch=len(prompts))
        fresh.lengths = torch.zeros(len(prompts), dtype=torch.long, device=ids.device)
        hidden, _ = self.model.model(ids, fresh)  # (n, T, C)
        fresh.lengths = lengths  # the padding's keys lie beyond each row's length, unread
        self.cache.append(fresh)
        last = hidden[torch.arange(len(prompts), device=ids.device), lengths - 1]  # (n, C)
        return self.model.lm_head(last).float()  # (n, V)

    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token per row (B,); the logits of the next (B, V), fp32."""
        hidden, _ = self.model.model(tokens[:, None], self.cache)  # (B, 1, C)
        return self.model.lm_head(hidden[:, -1]).float()  # (B, V)

    def drop(self, finished: Tensor) -> Tensor:
        """Remove the rows where ``finished`` (B,) is True: they are no longer computed. Returns
        the old index of each remaining row, in the new order (``StaticCache.drop``)."""
        return self.cache.drop(finished)


def _last_logits(model: nn.Module, rows: Sequence[Tensor]) -> Tensor:
    """Without a cache: the whole of every row again, the logits after its last token (B, V)."""
    ids, lengths = right_pad(rows)
    hidden, _ = model.model(ids)  # (B, T, C)
    last = hidden[torch.arange(len(rows), device=ids.device), lengths - 1]  # (B, C)
    return model.lm_head(last).float()


class TokenConstraint(Protocol):
    """What a row's constraint does while it decodes (``inference.structured.GrammarState``
    is one): ``bias`` is 0 on the next tokens allowed and -inf on the others (``remaining``:
    the tokens the row may still write), ``advance`` takes the one chosen."""

    def bias(self, device: torch.device | str | None = None,
             remaining: int | None = None) -> Tensor: ...  # (V,) 0 allowed, -inf not

    def advance(self, token_id: int) -> None: ...


def row_constraints(constraints: object, n: int) -> list[TokenConstraint | None]:
    """One constraint per row: ``constraints`` is None, one grammar for every row (anything
    with ``start()``, such as ``inference.structured.Constraint``), or a list of n (each None,
    a grammar, or a row's own state)."""
    if constraints is None:
        return [None] * n
    if hasattr(constraints, "start"):
        return [constraints.start() for _ in range(n)]
    constraints = list(constraints)
    if len(constraints) != n:
        raise ValueError(f"{len(constraints)} constraints for {n} prompts")
    return [c.start() if hasattr(c, "start") else c for c in constraints]


@dataclass(eq=False)
class Row:
    """One prompt being answered in a ``ContinuousBatch``: its budget, stop ids, sampling
    settings and optional ``constraint`` (a mask on each step's logits); ``tokens`` grows by
    one per step (a stop id included) until ``finish_reason`` is "stop", "length", or
    "cancelled" (set by whoever owns the row: a client that left)."""

    prompt: Tensor  # (T,) token ids
    max_new_tokens: int
    stop_ids: frozenset[int] = frozenset()
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    generator: torch.Generator | None = None
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    constraint: TokenConstraint | None = None  # a grammar the tokens must follow

    def sampling(self) -> tuple:
        return self.temperature, self.top_k, self.top_p, self.generator


class ContinuousBatch:
    """Rows that decode together; new rows join between steps as others finish (continuous
    batching, Yu et al. 2022, "Orca"). Rows wait in ``submit`` order; they join once
    ``min_join`` slots are free (or all the waiting ones fit), prefilled together.

    ``use_cache=False`` recomputes every row from its first token at each step (the same
    tokens, slowly: notebook 08's comparison). ``capacity`` bounds a row's prompt + new tokens;
    the cache holds ``initial_capacity`` positions a row at first (default: all of
    ``capacity``) and doubles as rows grow (a server's: its context is long, most replies short).
    """

    def __init__(self, model: nn.Module, capacity: int, max_batch: int, *,
                 use_cache: bool = True, min_join: int = 1,
                 initial_capacity: int | None = None) -> None:
        self.model, self.capacity, self.max_batch = model, capacity, max_batch
        self.min_join = max(1, min(min_join, max_batch))
        self.decoding = (Decoding(model, capacity, max_batch, initial_capacity) if use_cache
                         else None)
        self.device = next(itertools.chain(model.parameters(), model.buffers())).device
        self.rows: list[Row] = []  # decoding now, in the cache's slot order
        self.waiting: deque[Row] = deque()

    def submit(self, row: Row) -> Row:
        """Queue ``row``; it joins at a coming ``step``."""
        if row.max_new_tokens < 1 or len(row.prompt) == 0:
            raise ValueError("a row needs a prompt and max_new_tokens >= 1")
        need = getattr(row.constraint, "min_tokens", 0)
        if need > row.max_new_tokens:
            raise ValueError(f"the row's grammar needs at least {need} tokens; max_new_tokens "
                             f"is {row.max_new_tokens}")
        if len(row.prompt) + row.max_new_tokens > self.capacity:
            raise ValueError(f"prompt ({len(row.prompt)}) + max_new_tokens "
                             f"({row.max_new_tokens}) exceeds the batch's capacity "
                             f"({self.capacity} positions)")
        row.prompt = row.prompt.to(self.device)
        self.waiting.append(row)
        return row

    @property
    def busy(self) -> bool:
        """Rows decoding or waiting."""
        return bool(self.rows or self.waiting)

    def step(self) -> list[tuple[Row, int]]:
        """One token for every row: the next one of the running rows, the first one of the rows
        that join now. Returns ``(row, token)`` pairs; rows that finish (a stop id, their budget)
        leave the batch, and so do rows cancelled since the last step."""
        self._leave([r.finish_reason is not None for r in self.rows])
        logits = []
        if self.rows:
            if self.decoding is None:
                logits.append(_last_logits(self.model, [torch.cat((
                    r.prompt, torch.tensor(r.tokens, device=self.device))) for r in self.rows]))
            else:
                fed = torch.tensor([r.tokens[-1] for r in self.rows], device=self.device)  # (B,)
                logits.append(self.decoding.step(fed))
        joining = self._joining()
        if joining:
            prompts = [r.prompt for r in joining]
            logits.append(_last_logits(self.model, prompts) if self.decoding is None
                          else self.decoding.prefill(prompts))
            self.rows += joining
        if not self.rows:
            return []
        emitted = list(zip(self.rows, self._pick(torch.cat(logits)).tolist(), strict=True))
        for row, token in emitted:
            row.tokens.append(token)
            if row.constraint is not None:
                row.constraint.advance(token)
            if token in row.stop_ids:
                row.finish_reason = "stop"
            elif len(row.tokens) >= row.max_new_tokens:
                row.finish_reason = "length"
        self._leave([r.finish_reason is not None for r in self.rows])
        return emitted

    def _joining(self) -> list[Row]:
        while self.waiting and self.waiting[0].finish_reason is not None:  # cancelled waiting
            self.waiting.popleft()
        free = self.max_batch - len(self.rows)
        if not self.waiting or free < min(len(self.waiting), self.min_join):
            return []
        joining = []
        while self.waiting and len(joining) < free:
            row = self.waiting.popleft()
            if row.finish_reason is None:
                joining.append(row)
        return joining

    def _leave(self, finished: list[bool]) -> None:
        if not any(finished):
            return
        if self.decoding is None:
            order = [i for i, f in enumerate(finished) if not f]
        else:
            order = self.decoding.drop(torch.tensor(finished, device=self.device)).tolist()
        self.rows = [self.rows[i] for i in order]

    def _pick(self, logits: Tensor) -> Tensor:
        """The next token of each row (B,) from ``logits`` (B, V): one call for all rows when they
        share their sampling settings (and generator), else row by row. A row with a
        constraint samples among the tokens its grammar allows."""
        width = logits.shape[-1]
        for i, row in enumerate(self.rows):
            if row.constraint is not None:  # -inf on what the grammar forbids, in place
                bias = row.constraint.bias(logits.device, row.max_new_tokens - len(row.tokens))
                if len(bias) >= width:
                    logits[i] += bias[:width]
                else:  # a model's rows past the tokenizer's are never allowed
                    logits[i, :len(bias)] += bias
                    logits[i, len(bias):] = float("-inf")
                # the grammar may end at any of its stop tokens; the row ends at its own
                ends = getattr(row.constraint, "stop_ids", row.stop_ids)
                if ends != row.stop_ids and row.stop_ids & ends and ends - row.stop_ids:
                    logits[i, sorted(ends - row.stop_ids)] = float("-inf")
        first = self.rows[0].sampling()
        if all(r.sampling() == first for r in self.rows):
            return sample_next_token(logits, *first)
        return torch.cat([sample_next_token(logits[i:i + 1], *r.sampling())
                          for i, r in enumerate(self.rows)])


def stop_set(eos_token_id: int | Sequence[int] | None) -> frozenset[int]:
    """The stop ids as a set (empty: no stop).

    >>> sorted(stop_set(2)), sorted(stop_set([2, 0])), stop_set(None)
    ([2], [0, 2], frozenset())
    """
    if eos_token_id is None:
        return frozenset()
    return frozenset([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id)


@torch.no_grad()
def decode_stream(model: nn.Module, input_ids: Tensor, max_new_tokens: int,
                  temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                  eos_token_id: int | Sequence[int] | None = None, use_cache: bool = True,
                  generator: torch.Generator | None = None,
                  attention_mask: Tensor | None = None,
                  constraints: object = None) -> Iterator[Tensor]:
    """``MiniMindForCausalLM.stream``: yield the next token of every row, (B,) per step.

    A row stops at any of the ``eos_token_id`` ids; afterwards it yields the first of them and
    is no longer computed. Iteration ends after ``max_new_tokens`` steps or once every row has
    stopped.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    prompts = unpad(input_ids, attention_mask)
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens > model.config.max_position_embeddings:
        raise ValueError(f"prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds "
                         f"max_position_embeddings ({model.config.max_position_embeddings})")
    if max_new_tokens == 0:
        return
    stops = stop_set(eos_token_id)
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [0])
    fill = ids[0]  # what a finished row yields
    batch = ContinuousBatch(model, longest + max_new_tokens, len(prompts), use_cache=use_cache)
    rows = [batch.submit(Row(p, max_new_tokens, stops, temperature, top_k, top_p, generator,
                             constraint=c))
            for p, c in zip(prompts, row_constraints(constraints, len(prompts)), strict=True)]
    where = {id(row): i for i, row in enumerate(rows)}
    while batch.busy:
        token = torch.full((len(rows),), fill, dtype=torch.long, device=input_ids.device)
        for row, t in batch.step():
            token[where[id(row)]] = t
        yield token  # (B,)


@torch.no_grad()
def generate_many(model: nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                  eos_token_id: int | Sequence[int] | None = None, batch_size: int = 64,
                  temperature: float = 0.0, top_k: int | None = None,
                  top_p: float | None = None, generator: torch.Generator | None = None,
                  progress: bool = False, desc: str = "generate",
                  constraints: object = None) -> list[list[int]]:
    """The new tokens of every prompt (a stop id, when one ended it, included), in prompt order.

    ``constraints``: a grammar for every row (``inference.structured.constrain``) or one per
    prompt (``row_constraints``); each row then samples only what its grammar allows.

    Up to ``batch_size`` rows decode at once; as rows finish, the next prompts take their
    places (``ContinuousBatch``; longest prompts first, so a prefill pads little). The model runs
    in eval mode and is put back as it was.

    >>> _ = torch.manual_seed(0)
    >>> from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
    >>> model = MiniMindForCausalLM(MiniMindConfig(vocab_size=16, hidden_size=16,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    >>> out = generate_many(model, [[1, 2, 3], [4]], 3, batch_size=1)
    >>> out[1] == model.generate(torch.tensor([[4]]), 3, temperature=0)[0, 1:].tolist()
    True
    """
    if not prompts:
        return []
    if max_new_tokens < 1 or batch_size < 1:
        raise ValueError(f"max_new_tokens and batch_size must be >= 1, got {max_new_tokens} "
                         f"and {batch_size}")
    capacity = max(len(p) for p in prompts) + max_new_tokens
    if capacity > model.config.max_position_embeddings:
        raise ValueError(f"the longest prompt + max_new_tokens ({capacity}) exceeds "
                         f"max_position_embeddings ({model.config.max_position_embeddings})")
    was_training = model.training
    model.eval()
    batch = ContinuousBatch(model, capacity, min(batch_size, len(prompts)),
                            min_join=max(1, batch_size // 8))
    stops = stop_set(eos_token_id)
    rows = [Row(torch.as_tensor(list(p), dtype=torch.long), max_new_tokens, stops, temperature,
                top_k, top_p, generator, constraint=c)
            for p, c in zip(prompts, row_constraints(constraints, len(prompts)), strict=True)]
    for i in sorted(range(len(rows)), key=lambda i: -len(prompts[i])):
        batch.submit(rows[i])
    bar = tqdm(total=len(rows), desc=desc, disable=not progress)
    try:
        while batch.busy:
            bar.update(sum(row.finish_reason is not None for row, _ in batch.step()))
    finally:
        bar.close()
        model.train(was_training)
    return [row.tokens for row in rows]


def compile_decoder(model: nn.Module) -> nn.Module:
    """Compile the trunk of a ``MiniMindForCausalLM`` (or a vision-language model's language
    model) with ``torch.compile`` for generation, in place (``nn.Module.compile``: the weights
    and their names stay as they are). ``dynamic=True``: the batch and the cache's span change
    from step to step, and one graph serves them all. The first steps compile (a minute on a
    CPU); then each step runs the compiled graph. Returns ``model``.

    Measured (``benchmarks/peers.py compile``): on a CPU decode is slower compiled (the cache's
    bookkeeping breaks the graph into pieces); ``benchmarks/gpu_check.py`` measures a GPU.
    """
    lm = getattr(model, "lm", model)  # a VisionLanguageModel holds its decoder as ``lm``
    trunk = getattr(lm, "model", None)
    if trunk is None or not hasattr(trunk, "layers"):
        raise TypeError(f"compile_decoder needs a MiniMind decoder, got {type(model).__name__}")
    trunk.compile(dynamic=True)
    return model
