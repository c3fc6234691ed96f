"""A static KV cache for batched decoding (notebook 08): every layer's keys and values live in
one preallocated ``(max_batch, Hkv, capacity, D)`` tensor each, written in place, one new
position per step, instead of a new, one-longer tensor per token (``torch.cat`` copies the
whole cache every step: quadratic work over a long answer).

Each row keeps its own length, so prompts of different lengths decode side by side: row ``b``
holds its tokens at positions ``0 .. lengths[b] - 1`` and writes its next one at
``lengths[b]``. A query at position ``p`` reads the keys ``0 .. p`` of its own row (``mask``);
whatever sits beyond a row's length (a shorter prompt's padding) is never read and is
overwritten as the row grows.

The rows in use are the first ``batch`` of the ``max_batch`` slots, so a forward pass reads a
view, never a copy. Rows leave (``drop``: a finished answer; the last rows move into the holes,
one row copied per row that left) and join (``append``: a new request on the server, its prompt
prefilled in a cache of its own) between steps.

>>> cache = StaticCache(num_layers=1, capacity=4)
>>> cache.lengths = torch.zeros(1, dtype=torch.long)   # one empty row
>>> k = torch.ones(1, 1, 2, 3)                          # (B, Hkv, T, D): two new positions
>>> _ = cache.prepare(2)                                # once per forward pass
>>> k_all, _ = cache.layer(0).write(k, k)               # in every layer
>>> cache.advance(2); cache.lengths.tolist(), k_all.shape
([2], torch.Size([1, 1, 2, 3]))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Plan:
    """One forward pass over a ``StaticCache`` (``StaticCache.prepare``): the new tokens'
    positions (B, T) and the mask (B, 1, T, S), both None when every row is at one length;
    then ``start``, that length, is where every row's new tokens go. ``span``: the positions
    the cache's views cover after them (the longest row's)."""

    positions: Tensor | None
    mask: Tensor | None
    start: int | None
    span: int


@dataclass
class CacheView:
    """One layer's part of a ``StaticCache`` during one forward pass: where the new keys go
    (``positions`` (B, T)) and which keys each query may read (``mask`` (B, 1, T, S), or None
    when every row is equally long and the plain causal mask applies)."""

    cache: StaticCache
    index: int
    positions: Tensor | None  # (B, T); None when every row is at one length (``start``)
    mask: Tensor | None  # (B, 1, T, S), True where a query may attend
    span: int  # S: the positions the views cover (the longest row's, after the new tokens)
    start: int | None  # every row's first new position when they are all equal, else None

    def write(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new keys and values ``k``, ``v`` (B, Hkv, T, D) at ``positions``; return
        the cache's keys and values up to the longest row, (B, Hkv, S, D) views (no copy)."""
        return self.cache._write(self, k, v)


class StaticCache:
    """Keys and values of every layer, preallocated; rows of their own lengths (see the module).

    ``lengths`` (B,) holds the length of each row in use. Memory is allocated at the first
    write (then the dtype and device are those of the keys): ``num_layers x 2 x max_batch x
    Hkv x capacity x D`` elements. With ``max_capacity`` above ``capacity`` the cache grows
    (doubling, ``reserve``) when a forward pass or a joining row needs more positions: a
    server's cache starts small, its context is long and most replies are short.
    """

    def __init__(self, num_layers: int, capacity: int, max_batch: int = 1,
                 max_capacity: int | None = None) -> None:
        if capacity < 1 or max_batch < 1:
            raise ValueError(f"capacity and max_batch must be >= 1, got {capacity}, {max_batch}")
        self.num_layers, self.capacity, self.max_batch = num_layers, capacity, max_batch
        self.max_capacity = max(capacity, max_capacity or capacity)
        self.lengths = torch.zeros(0, dtype=torch.long)
        self.keys: list[Tensor | None] = [None] * num_layers
        self.values: list[Tensor | None] = [None] * num_layers
        self._plan: Plan | None = None  # the forward pass under way (``prepare``)

    @property
    def lengths(self) -> Tensor:
        """(B,) the length of each row in use."""
        return self._lengths

    @lengths.setter
    def lengths(self, value: Tensor) -> None:
        self._lengths = value
        self._uniform: int | None | bool = False  # not known yet (``uniform_length``)

    def uniform_length(self) -> int | None:
        """The rows' common length when they are all equally long, else None (computed once
        per change of ``lengths``: each comparison would wait for the tensor)."""
        if self._uniform is False:
            lengths = self._lengths
            same = len(lengths) > 0 and bool((lengths == lengths[0]).all())
            self._uniform = int(lengths[0]) if same else None
        return self._uniform

    @property
    def batch(self) -> int:
        """Rows in use."""
        return len(self.lengths)

    def positions(self, n_new: int) -> Tensor:
        """(B, T) the positions the next ``n_new`` tokens of each row take."""
        return self.lengths[:, None] + torch.arange(n_new, device=self.lengths.device)  # (B, T)

    def mask(self, positions: Tensor) -> Tensor | None:
        """(B, 1, T, S): the query at position p reads keys 0..p of its row; S is the span the
        views cover. None when every row is equally long: then the plain causal mask (aligned
        bottom-right, ``attention.causal_mask``) is the same for all rows.

        >>> mask = StaticCache(1, 8).mask(torch.tensor([[1], [2]]))
        >>> mask.shape, mask[:, 0, 0].int().tolist()
        (torch.Size([2, 1, 1, 3]), [[1, 1, 0], [1, 1, 1]])
        """
        span = int(positions.max()) + 1
        if bool((positions == positions[:1]).all()):
            return None
        keys = torch.arange(span, device=positions.device)  # (S,)
        return (keys[None, None, :] <= positions[:, :, None])[:, None]  # (B, 1, T, S)

    def prepare(self, n_new: int) -> Plan:
        """Plan a forward pass that adds ``n_new`` tokens to every row, once for all layers:
        where they go and which keys each query reads. When every row is at one length the plan
        is plain ints (no position tensor, no mask: the causal mask of the views is right for
        every row); otherwise each row's positions and the mask."""
        common = self.uniform_length()
        if common is not None:
            self._plan = Plan(None, None, common, common + n_new)
        else:
            positions = self.positions(n_new)  # (B, T)
            self._plan = Plan(positions, self.mask(positions), None,
                              int(positions.max()) + 1)
        self._fit(self._plan.span)
        return self._plan

    def layer(self, index: int) -> CacheView:
        """Layer ``index``'s view of the forward pass ``prepare`` planned."""
        if self._plan is None:
            raise RuntimeError("call prepare(n_new) before a forward pass")
        plan = self._plan
        return CacheView(self, index, plan.positions, plan.mask, plan.span, plan.start)

    def advance(self, n_new: int) -> None:
        """Count ``n_new`` more tokens in every row."""
        common = self._uniform
        self.lengths = self._lengths + n_new
        if common is not False:  # still known: all rows moved alike
            self._uniform = None if common is None else common + n_new
        self._plan = None

    def _fit(self, span: int) -> None:
        """Grow (doubling, up to ``max_capacity``) when ``span`` positions do not fit; what
        still does not fit is refused where it is written."""
        if span > self.capacity:
            self.reserve(min(self.max_capacity, max(span, 2 * self.capacity)))

    def reserve(self, capacity: int) -> None:
        """Grow to hold ``capacity`` positions a row (a no-op when it already does): the kept
        keys and values are copied once into the larger tensors.

        >>> cache = StaticCache(1, 2)
        >>> cache.reserve(8); cache.capacity
        8
        """
        if capacity <= self.capacity:
            return
        for tensors in (self.keys, self.values):
            for i, t in enumerate(tensors):
                if t is not None:
                    grown = t.new_zeros(t.shape[:2] + (capacity,) + t.shape[3:])
                    grown[:, :, :self.capacity] = t
                    tensors[i] = grown
        self.capacity = capacity

    def _allocate(self, index: int, like: Tensor) -> None:
        _, Hkv, _, D = like.shape
        shape = (self.max_batch, Hkv, self.capacity, D)
        self.keys[index] = like.new_zeros(shape)
        self.values[index] = like.new_zeros(shape)
        self.lengths = self.lengths.to(like.device)

    def _write(self, view: CacheView, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        index, positions, span = view.index, view.positions, view.span
        B, T = k.shape[0], k.shape[2]
        if B != self.batch:
            raise ValueError(f"the cache has {self.batch} rows in use, the input {B}")
        if span > self.capacity:
            raise ValueError(f"the cache holds {self.capacity} positions; position {span - 1} "
                             "does not fit")
        if self.keys[index] is None:
            self._allocate(index, k)
        keys, values = self.keys[index][:B], self.values[index][:B]  # views of the rows in use
        if view.start is not None:  # every row at one length
            start = view.start
            keys[:, :, start:start + T] = k  # in place, no copy of the past
            values[:, :, start:start + T] = v
        else:
            rows = torch.arange(B, device=k.device)[:, None]  # (B, 1)
            # subtle: advanced indices around a slice put their dims first: (B, T, Hkv, D)
            keys[rows, :, positions] = k.transpose(1, 2)
            values[rows, :, positions] = v.transpose(1, 2)
        return keys[:, :, :span], values[:, :, :span]  # (B, Hkv, S, D) views

    def drop(self, finished: Tensor) -> Tensor:
        """Remove the rows where ``finished`` (B,) is True; the last kept rows move into their
        slots. Returns the old index of each row now in use, in slot order (the caller reorders
        its own per-row state the same way).

        >>> cache = StaticCache(1, 4, max_batch=4)
        >>> cache.lengths = torch.tensor([1, 2, 3, 4])
        >>> cache.drop(torch.tensor([True, False, True, False])).tolist(), cache.lengths.tolist()
        ([3, 1], [4, 2])
        """
        finished = finished.to(self.lengths.device)
        kept = int((~finished).sum())
        holes = finished[:kept].nonzero().flatten()  # slots to fill, all before `kept`
        movers = kept + (~finished[kept:]).nonzero().flatten()  # rows beyond `kept` that stay
        order = torch.arange(kept, device=finished.device)
        order[holes] = movers
        for tensors in (self.keys, self.values):
            for t in tensors:
                if t is not None and len(holes):
                    t[holes] = t[movers]  # one row copied per row that left
        self.lengths = self.lengths[order]
        return order

    def append(self, other: StaticCache) -> None:
        """Add ``other``'s rows (new prompts, prefilled in a cache of their own) after the rows
        in use: their keys and values are copied into the next free slots."""
        if other.num_layers != self.num_layers:
            raise ValueError(f"cannot join caches of {self.num_layers} and "
                             f"{other.num_layers} layers")
        start, n = self.batch, other.batch
        if start + n > self.max_batch:
            raise ValueError(f"{start} rows in use + {n} new exceed max_batch {self.max_batch}")
        span = int(other.lengths.max()) if n else 0
        self._fit(span)
        if span > self.capacity:
            raise ValueError(f"a new row of {span} positions exceeds the capacity "
                             f"{self.capacity}")
        for index in range(self.num_layers):
            if other.keys[index] is None:
                raise ValueError("only a cache that has been written can be appended")
            if self.keys[index] is None:
                self._allocate(index, other.keys[index])
            self.keys[index][start:start + n, :, :span] = other.keys[index][:n, :, :span]
            self.values[index][start:start + n, :, :span] = other.values[index][:n, :, :span]
        self.lengths = torch.cat((self.lengths, other.lengths.to(self.lengths.device)))
