"""A static KV cache for batched decoding (notebook 08): every layer's keys and values live in
one preallocated ``(B, Hkv, capacity, D)`` tensor each, written in place, one new position per
step, instead of a new, one-longer tensor per token (``torch.cat`` copies the whole cache every
step: quadratic work over a long answer).

Each row keeps its own length, so prompts of different lengths decode side by side: row ``b``
holds its tokens at positions ``0 .. lengths[b] - 1`` and writes its next one at
``lengths[b]``. A query at position ``p`` reads the keys ``0 .. p`` of its own row (``mask``);
whatever sits beyond a row's length (a shorter prompt's padding) is never read and is
overwritten as the row grows. Rows leave (``select``: a finished answer) and join (``join``: a
new request on the server) between steps.

>>> cache = StaticCache(num_layers=1, capacity=4)
>>> cache.positions(2).tolist()                       # a fresh batch of one row, 2 new tokens
[[0, 1]]
>>> k = torch.ones(1, 1, 2, 3)                        # (B, Hkv, T, D)
>>> k_all, _ = cache.layer(0, cache.positions(2)).write(k, k)
>>> cache.advance(torch.tensor([2])); cache.lengths.tolist(), k_all.shape
([2], torch.Size([1, 1, 2, 3]))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class CacheView:
    """One layer's part of a ``StaticCache`` during one forward pass: where the new keys go
    (``positions`` (B, T)) and which keys each query may read (``mask`` (B, 1, T, S) or None
    when every query may read every key of the span)."""

    cache: StaticCache
    index: int
    positions: Tensor  # (B, T)
    mask: Tensor | None  # (B, 1, T, S), True where a query may attend

    def write(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new keys and values ``k``, ``v`` (B, Hkv, T, D) at ``positions``; return
        the cache's keys and values up to the longest row, (B, Hkv, S, D) views (no copy)."""
        return self.cache._write(self.index, k, v, self.positions)


class StaticCache:
    """Keys and values of every layer, preallocated; rows of their own lengths (see the module).

    Memory is allocated at the first write (then the dtype and device are those of the keys):
    ``num_layers x 2 x B x Hkv x capacity x D`` elements.
    """

    def __init__(self, num_layers: int, capacity: int, batch: int = 1,
                 lengths: Tensor | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.num_layers, self.capacity = num_layers, capacity
        self.lengths = torch.zeros(batch, dtype=torch.long) if lengths is None else lengths
        self.keys: list[Tensor | None] = [None] * num_layers
        self.values: list[Tensor | None] = [None] * num_layers

    @property
    def batch(self) -> int:
        return len(self.lengths)

    def positions(self, n_new: int) -> Tensor:
        """(B, T) the positions the next ``n_new`` tokens of each row take."""
        start = self.lengths.to(self._device())
        return start[:, None] + torch.arange(n_new, device=start.device)  # (B, T)

    def mask(self, positions: Tensor) -> Tensor | None:
        """(B, 1, T, S): the query at position p reads keys 0..p of its row; S is the span the
        views cover. None when every row is equally long: then the plain causal mask (aligned
        bottom-right, ``attention.causal_mask``) is the same for all rows.

        >>> mask = StaticCache(1, 8, lengths=torch.tensor([1, 2])).mask(torch.tensor([[1], [2]]))
        >>> mask.shape, mask[:, 0, 0].int().tolist()
        (torch.Size([2, 1, 1, 3]), [[1, 1, 0], [1, 1, 1]])
        """
        span = int(positions.max()) + 1
        if bool((positions == positions[:1]).all()):
            return None
        keys = torch.arange(span, device=positions.device)  # (S,)
        return (keys[None, None, :] <= positions[:, :, None])[:, None]  # (B, 1, T, S)

    def layer(self, index: int, positions: Tensor, mask: Tensor | None = None) -> CacheView:
        return CacheView(self, index, positions, mask)

    def advance(self, n_new: Tensor | int) -> None:
        """Count ``n_new`` more tokens in every row (a tensor (B,): one count a row)."""
        self.lengths = self.lengths + torch.as_tensor(n_new, device=self.lengths.device)

    def _device(self) -> torch.device:
        first = self.keys[0]
        return self.lengths.device if first is None else first.device

    def _write(self, index: int, k: Tensor, v: Tensor, positions: Tensor
               ) -> tuple[Tensor, Tensor]:
        if self.keys[index] is None:
            B, Hkv, _, D = k.shape
            shape = (B, Hkv, self.capacity, D)
            self.keys[index] = k.new_zeros(shape)
            self.values[index] = v.new_zeros(shape)
            self.lengths = self.lengths.to(k.device)
        keys, values = self.keys[index], self.values[index]
        span = int(positions.max()) + 1
        if span > self.capacity:
            raise ValueError(f"the cache holds {self.capacity} positions; position {span - 1} "
                             "does not fit")
        T = k.shape[2]
        if bool((positions[:, 0] == positions[0, 0]).all()):  # every row at one length
            start = int(positions[0, 0])
            keys[:, :, start:start + T] = k  # in place, no copy of the past
            values[:, :, start:start + T] = v
        else:
            rows = torch.arange(self.batch, device=k.device)[:, None]  # (B, 1)
            # subtle: advanced indices around a slice put their dims first: (B, T, Hkv, D)
            keys[rows, :, positions] = k.transpose(1, 2)
            values[rows, :, positions] = v.transpose(1, 2)
        return keys[:, :, :span], values[:, :, :span]  # (B, Hkv, S, D) views

    def select(self, rows: Tensor) -> StaticCache:
        """A cache of only ``rows`` (indices into the batch), in that order (finished rows
        leave; this copies the kept rows once)."""
        kept = StaticCache(self.num_layers, self.capacity, lengths=self.lengths[rows])
        kept.keys = [None if t is None else t[rows] for t in self.keys]
        kept.values = [None if t is None else t[rows] for t in self.values]
        return kept

    def join(self, other: StaticCache) -> StaticCache:
        """This cache's rows followed by ``other``'s (new requests joining a running batch); the
        capacity is the larger of the two."""
        if other.num_layers != self.num_layers:
            raise ValueError(f"cannot join caches of {self.num_layers} and "
                             f"{other.num_layers} layers")
        capacity = max(self.capacity, other.capacity)
        joined = StaticCache(self.num_layers, capacity,
                             lengths=torch.cat((self.lengths, other.lengths.to(self.lengths))))
        for name in ("keys", "values"):
            tensors = []
            for a, b in zip(getattr(self, name), getattr(other, name), strict=True):
                if a is None or b is None:
                    raise ValueError("only caches that have been written can be joined")
                pad = [_widen(t, capacity) for t in (a, b.to(a.device))]
                tensors.append(torch.cat(pad, dim=0))
            setattr(joined, name, tensors)
        return joined


def _widen(t: Tensor, capacity: int) -> Tensor:
    """``t`` (B, Hkv, S, D) with zeros appended up to ``capacity`` positions."""
    extra = capacity - t.shape[2]
    return t if extra == 0 else torch.cat((t, t.new_zeros(*t.shape[:2], extra, t.shape[3])), 2)
