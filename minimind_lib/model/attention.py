"""Causal self-attention (notebook 02): grouped-query heads (``repeat_kv``), RoPE or ALiBi
positions, a KV cache for generation (``LayerCache``), through PyTorch's fused
``scaled_dot_product_attention`` or the manual path that can return the attention weights.

>>> causal_mask(2, 3).int().tolist()   # 2 new queries after 1 cached key: each sees the past
[[1, 1, 0], [1, 1, 1]]
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minimind_lib.model.config import MiniMindConfig
from minimind_lib.model.kv_cache import CacheView
from minimind_lib.model.layers import RMSNorm
from minimind_lib.model.positions import alibi_bias, alibi_slopes, apply_rope


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """Grouped-query attention: repeat each of the KV heads ``n_rep`` times (B, Hkv, T, D) →
    (B, Hkv*n_rep, T, D), so query head ``h`` reads KV head ``h // n_rep``.

    >>> repeat_kv(torch.arange(2.0).view(1, 2, 1, 1), 3).flatten().tolist()
    [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    """
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def causal_mask(n_queries: int, n_keys: int, device: torch.device | None = None) -> Tensor:
    """Boolean (Tq, Tk) mask, True where a query may attend.  The queries are the LAST
    ``n_queries`` positions of the ``n_keys`` (bottom-right aligned), as in KV-cache decoding.

    subtle: ``F.scaled_dot_product_attention(is_causal=True)`` aligns its mask top-left,
    which is only right when ``n_queries == n_keys``.

    >>> causal_mask(2, 3).int().tolist()
    [[1, 1, 0], [1, 1, 1]]
    """
    ones = torch.ones(n_queries, n_keys, dtype=torch.bool, device=device)
    return ones.tril(diagonal=n_keys - n_queries)


# One layer's cache: keys and values so far, each (B, Hkv, T_past, D).
LayerCache = tuple[Tensor, Tensor]


class Attention(nn.Module):
    """Causal multi-head self-attention with grouped-query heads, RoPE and a KV cache.

    ``softmax(q kᵀ / √d + mask) v`` per head (Vaswani et al. 2017, eq. 1); ``n_heads``
    query heads share ``n_kv_heads`` key/value heads (GQA, Ainslie et al. 2023).
    ``use_sdpa`` picks PyTorch's fused ``F.scaled_dot_product_attention`` (fast) or the
    readable manual path of notebook 02 (same numbers within float rounding).
    ``config.position_encoding`` "rope" rotates q and k; "alibi" adds ``alibi_bias`` to the
    scores instead of the causal mask (to SDPA as an additive float mask); "none" does neither.
    """

    def __init__(self, config: MiniMindConfig, use_sdpa: bool = True) -> None:
        super().__init__()
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.dropout = config.dropout
        self.use_sdpa = use_sdpa
        c, d = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(c, self.n_heads * d, bias=False)
        self.k_proj = nn.Linear(c, self.n_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(c, self.n_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.n_heads * d, c, bias=False)
        # MiniMind-3 / Qwen3: an RMSNorm over each head's query and key, before RoPE
        self.q_norm = RMSNorm(d, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(d, config.rms_norm_eps) if config.qk_norm else None
        self.resid_dropout = nn.Dropout(config.dropout)
        self.position_encoding = config.position_encoding
        if self.position_encoding == "alibi":
            # non-persistent: rebuilt from the config, never in a checkpoint
            self.register_buffer("slopes", alibi_slopes(self.n_heads), persistent=False)  # (H,)

    def forward(
        self, x: Tensor, cos: Tensor | None, sin: Tensor | None,
        past: LayerCache | CacheView | None = None,
    ) -> tuple[Tensor, LayerCache]:
        """``x`` (B, T, C); ``cos``/``sin`` (T, D) for the T new positions, or (B, T, D) when
        each row is at its own position (None without RoPE); ``past`` the keys and values of
        earlier positions: a ``(k, v)`` pair (extended by concatenation) or a ``CacheView`` of a
        ``StaticCache`` (written in place; rows of different lengths).  Returns the output
        (B, T, C) and the keys and values up to the new positions."""
        B, T, _ = x.shape
        q, k, v = self._project(x, cos, sin)
        mask = positions = None
        if isinstance(past, CacheView):
            k, v = past.write(k, v)  # (B, Hkv, S, D): views of the static cache
            mask, positions = past.mask, past.positions
        elif past is not None:
            k = torch.cat((past[0], k), dim=2)  # (B, Hkv, Tk, D)
            v = torch.cat((past[1], v), dim=2)  # (B, Hkv, Tk, D)
        dropout = self.dropout if self.training else 0.0
        if self.use_sdpa:
            y = self._sdpa(q, k, v, dropout, mask, positions)
        else:
            y = self._manual(q, k, v, dropout, mask, positions)  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # (B, T, C)
        return self.resid_dropout(self.o_proj(y)), (k, v)

    def weights(self, x: Tensor, cos: Tensor | None, sin: Tensor | None) -> Tensor:
        """The causal attention probabilities (B, H, T, T) for ``x`` (B, T, C), no cache
        (what the heatmaps of notebook 02 show)."""
        q, k, _ = self._project(x, cos, sin)
        return self._weights(q, repeat_kv(k, self.n_heads // self.n_kv_heads), 0.0)

    def _project(
        self, x: Tensor, cos: Tensor | None, sin: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        # k and v: (B, Hkv, T, D)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:  # over D, each head and position on its own
            q, k = self.q_norm(q), self.k_norm(k)
        if self.position_encoding != "rope":
            return q, k, v
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, dropout: float,
              mask: Tensor | None = None, positions: Tensor | None = None) -> Tensor:
        tq, tk = q.shape[2], k.shape[2]
        if self.position_encoding == "alibi":
            # (H, Tq, Tk), or (B, H, Tq, Tk) for rows at their own positions; causal -inf in it
            bias = self._alibi(tq, tk, mask, positions).to(q.dtype)
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, dropout_p=dropout,
                enable_gqa=self.n_kv_heads != self.n_heads,
            )  # (B, H, T, D)
        # subtle: one new query sees every cached key (no mask); a prefill with no cache uses
        # is_causal; any other chunk needs the explicit bottom-right mask (see causal_mask).
        # Rows of a static cache at different lengths bring their own mask (B, 1, Tq, Tk).
        if mask is None and tq > 1 and tq != tk:
            mask = causal_mask(tq, tk, q.device)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout,
            is_causal=mask is None and tq == tk and tq > 1,
            enable_gqa=self.n_kv_heads != self.n_heads,
        )  # (B, H, T, D)

    def _manual(self, q: Tensor, k: Tensor, v: Tensor, dropout: float,
                mask: Tensor | None = None, positions: Tensor | None = None) -> Tensor:
        n_rep = self.n_heads // self.n_kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, Tk, D)
        return self._weights(q, k, dropout, mask, positions) @ v  # (B, H, Tq, D)

    def _alibi(self, tq: int, tk: int, mask: Tensor | None, positions: Tensor | None) -> Tensor:
        if mask is None:
            return alibi_bias(self.slopes, tq, tk)  # (H, Tq, Tk)
        return alibi_bias(self.slopes, tq, tk, positions)  # (B, H, Tq, Tk)

    def _weights(self, q: Tensor, k: Tensor, dropout: float, mask: Tensor | None = None,
                 positions: Tensor | None = None) -> Tensor:
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, Tq, Tk)
        if self.position_encoding == "alibi":
            scores = scores.float() + self._alibi(q.shape[2], k.shape[2], mask, positions)
        else:
            if mask is None:
                mask = causal_mask(q.shape[2], k.shape[2], q.device)  # (Tq, Tk)
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = F.softmax(scores.float(), dim=-1).to(q.dtype)  # (B, H, Tq, Tk)
        return F.dropout(weights, p=dropout, training=dropout > 0)
