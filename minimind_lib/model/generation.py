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

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn

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
    """The state of a batch being decoded: a ``StaticCache`` and which rows are in it.

    ``capacity`` is the most positions any row will need (its prompt plus its new tokens).
    The model must be a ``MiniMindForCausalLM`` (its trunk ``model.model`` and ``lm_head``).
    """

    def __init__(self, model: nn.Module, capacity: int) -> None:
        limit = model.config.max_position_embeddings
        if capacity > limit:
            raise ValueError(f"{capacity} positions exceed max_position_embeddings ({limit})")
        self.model, self.capacity = model, capacity
        self.cache: StaticCache | None = None

    @property
    def size(self) -> int:
        """Rows in the batch."""
        return 0 if self.cache is None else self.cache.batch

    def prefill(self, prompts: Sequence[Tensor]) -> Tensor:
        """Read new prompts (1-D token tensors) and add their rows after the current ones;
        returns the logits of each prompt's next token (n, V), fp32."""
        ids, lengths = right_pad(prompts)  # (n, T)
        cache = StaticCache(len(self.model.model.layers), self.capacity, batch=len(prompts))
        hidden, _ = self.model.model(ids, cache)  # (n, T, C)
        cache.lengths = lengths  # the padding's keys stay beyond each row's length, unread
        last = hidden[torch.arange(len(prompts), device=ids.device), lengths - 1]  # (n, C)
        self.cache = cache if self.cache is None else self.cache.join(cache)
        return self.model.lm_head(last).float()  # (n, V)

    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token per row (B,); the logits of the next (B, V), fp32."""
        hidden, _ = self.model.model(tokens[:, None], self.cache)  # (B, 1, C)
        return self.model.lm_head(hidden[:, -1]).float()  # (B, V)

    def keep(self, rows: Tensor) -> None:
        """Keep only ``rows`` (a boolean mask (B,) or indices), in order: finished rows leave
        and are no longer computed."""
        if rows.dtype == torch.bool:
            rows = rows.nonzero().flatten()
        self.cache = self.cache.select(rows)


def _last_logits(model: nn.Module, rows: Sequence[Tensor]) -> Tensor:
    """Without a cache: the whole of every row again, the logits after its last token (B, V)."""
    ids, lengths = right_pad(rows)
    hidden, _ = model.model(ids)  # (B, T, C)
    last = hidden[torch.arange(len(rows), device=ids.device), lengths - 1]  # (B, C)
    return model.lm_head(last).float()


def stop_tensor(eos_token_id: int | Sequence[int] | None, device: torch.device) -> Tensor:
    """The stop ids as a 1-D tensor (empty: no stop)."""
    ids = [] if eos_token_id is None else (
        [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))
    return torch.tensor(ids, dtype=torch.long, device=device)


@torch.no_grad()
def decode_stream(model: nn.Module, input_ids: Tensor, max_new_tokens: int,
                  temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                  eos_token_id: int | Sequence[int] | None = None, use_cache: bool = True,
                  generator: torch.Generator | None = None,
                  attention_mask: Tensor | None = None) -> Iterator[Tensor]:
    """``MiniMindForCausalLM.stream``: yield the next token of every row, (B,) per step.

    A row stops at any of the ``eos_token_id`` ids; afterwards it yields the first of them and
    is no longer computed. Iteration ends after ``max_new_tokens`` steps or once every row has
    stopped.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    rows = unpad(input_ids, attention_mask)
    longest = max(len(r) for r in rows)
    if longest + max_new_tokens > model.config.max_position_embeddings:
        raise ValueError(f"prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds "
                         f"max_position_embeddings ({model.config.max_position_embeddings})")
    if max_new_tokens == 0:
        return
    device = input_ids.device
    stops = stop_tensor(eos_token_id, device)
    fill = int(stops[0]) if len(stops) else 0
    active = torch.arange(len(rows), device=device)  # the input row of each row still going
    if use_cache:
        decoding = Decoding(model, longest + max_new_tokens)
        logits = decoding.prefill(rows)  # (B, V)
    else:
        logits = _last_logits(model, rows)
    for step in range(max_new_tokens):
        chosen = sample_next_token(logits, temperature, top_k, top_p, generator)  # (A,)
        token = torch.full((len(rows),), fill, dtype=torch.long, device=device)
        token[active] = chosen
        yield token  # (B,)
        going = ~torch.isin(chosen, stops)  # (A,)
        if step == max_new_tokens - 1 or not bool(going.any()):
            return
        if not bool(going.all()):  # finished rows leave the batch
            active, chosen = active[going], chosen[going]
            if use_cache:
                decoding.keep(going)
            else:
                rows = [r for r, g in zip(rows, going.tolist(), strict=True) if g]
        if use_cache:
            logits = decoding.step(chosen)
        else:
            rows = [torch.cat((r, t[None])) for r, t in zip(rows, chosen, strict=True)]
            logits = _last_logits(model, rows)
