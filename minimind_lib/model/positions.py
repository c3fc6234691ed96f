"""Where a token is (notebooks 03 and 12): rotary position embeddings (RoPE, Su et al. 2021),
their scaling past the training length (position interpolation, NTK-aware, YaRN), and ALiBi's
linear distance penalty (Press et al. 2022).

>>> frequencies, scale = rope_frequencies(8, theta=10000.0)   # one per pair of dimensions
>>> frequencies.tolist(), scale
([1.0, 0.10000000149011612, 0.009999999776482582, 0.0010000000474974513], 1.0)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from minimind_lib.model.config import checked_rope_scaling


def rope_frequencies(
    head_dim: int, theta: float = 1e6, max_positions: int = 0, scaling: dict | None = None
) -> tuple[Tensor, float]:
    """The angle per position of each rotary pair, (D/2,) fp32, and the factor by which
    cos/sin are scaled: ``f_i = theta**(-2i/D)`` and 1.0, unless ``scaling`` applies.

    ``scaling`` (a ``rope_scaling`` dict; missing keys take ``ROPE_SCALING_DEFAULTS``)
    applies when ``max_positions`` exceeds its ``original_max_position_embeddings`` L
    (MiniMind's rule), with ``s = factor``:

    * "linear" (position interpolation, Chen et al. 2023): ``f_i / s``, i.e. position ``p``
      is read as ``p / s``, so the whole longer input falls inside the trained angles;
    * "ntk" (NTK-aware, bloc97 2023): a larger base ``theta · s**(D/(D-2))``: the fastest
      pair is untouched, the slowest is interpolated by exactly ``s``;
    * "yarn" (Peng et al. 2023; MiniMind's form): ``f_i · ((1 - γ_i) + γ_i / s)`` with
      ``γ`` = ``yarn_ramp`` (0: keep the pair, 1: interpolate it), and cos/sin scaled by
      ``attention_factor``.

    >>> f, a = rope_frequencies(8, theta=10000.0)
    >>> [round(x, 4) for x in f.tolist()], a
    ([1.0, 0.1, 0.01, 0.001], 1.0)
    >>> pi = {"type": "linear", "factor": 4, "original_max_position_embeddings": 16}
    >>> [round(x, 6) for x in rope_frequencies(8, 10000.0, 64, pi)[0].tolist()]
    [0.25, 0.025, 0.0025, 0.00025]
    >>> rope_frequencies(8, 10000.0, 16, pi)[0].tolist() == f.tolist()  # not longer: unscaled
    True
    """
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    if scaling is None:
        return inv_freq, 1.0
    scaling = checked_rope_scaling(scaling)
    if max_positions <= scaling["original_max_position_embeddings"]:
        return inv_freq, 1.0
    s = scaling["factor"]
    if scaling["type"] == "linear":
        return inv_freq / s, 1.0
    if scaling["type"] == "ntk":
        if head_dim <= 2:
            raise ValueError(f"NTK-aware scaling needs head_dim > 2, got {head_dim}")
        base = theta * s ** (head_dim / (head_dim - 2))
        return 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim), 1.0
    ramp = yarn_ramp(head_dim, theta, scaling["original_max_position_embeddings"],
                     scaling["beta_fast"], scaling["beta_slow"])  # (D/2,)
    return inv_freq * ((1 - ramp) + ramp / s), float(scaling["attention_factor"])


def yarn_ramp(head_dim: int, theta: float, original_max: int, beta_fast: float,
              beta_slow: float) -> Tensor:
    """YaRN's interpolation weight ``γ_i`` of each rotary pair, (D/2,) in [0, 1].

    Pair ``i`` turns ``r_i = L / (2π θ^(2i/D))`` times over the training length L.  Solving
    for ``i`` gives ``i(r) = D · ln(L / (2π r)) / (2 ln θ)``.  Pairs below
    ``low = floor(i(beta_fast))`` (more than ``beta_fast`` turns: every angle was seen in
    training) keep their frequency (γ = 0); pairs from ``high = ceil(i(beta_slow))`` on (about
    one turn or less) are interpolated fully (γ = 1); γ rises linearly in ``i`` between.
    ``low`` is clamped to >= 0 and ``high`` to <= D/2 - 1, as in MiniMind.

    subtle: the paper (Peng et al. 2023, section 3.2, "NTK-by-parts") ramps linearly in
    ``r`` and its γ is 1 - ours; MiniMind (and transformers) ramp linearly in the pair index.

    >>> yarn_ramp(64, 1e6, 2048, 32, 1).nonzero().flatten().tolist()[:3]   # low = floor(5.37)
    [6, 7, 8]
    >>> yarn_ramp(64, 1e6, 2048, 32, 1)[14:].unique().tolist()             # high = ceil(13.4)
    [1.0]
    """
    def pair_index(rotations: float) -> float:
        return head_dim * math.log(original_max / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(pair_index(beta_fast)), 0)
    high = min(math.ceil(pair_index(beta_slow)), head_dim // 2 - 1)
    i = torch.arange(head_dim // 2, dtype=torch.float32)  # (D/2,)
    return ((i - low) / max(high - low, 0.001)).clamp(0, 1)


def rope_tables(
    head_dim: int, max_positions: int, theta: float = 1e6, scaling: dict | None = None
) -> tuple[Tensor, Tensor]:
    """Cos/sin tables of rotary position embeddings (Su et al. 2021, RoFormer eq. 34).

    Pair ``i`` of a head rotates by angle ``pos * theta**(-2i/head_dim)`` (or the scaled
    frequencies of ``rope_frequencies`` when ``scaling`` applies).  Both halves of
    the head share the frequencies (the "rotate-half" layout of Llama/GPT-NeoX, not the
    interleaved one of the paper).  Returns two fp32 tensors of shape
    ``(max_positions, head_dim)``.

    >>> cos, sin = rope_tables(head_dim=4, max_positions=3, theta=10000.0)
    >>> cos.shape
    torch.Size([3, 4])
    >>> cos[0].tolist(), sin[0].tolist()   # position 0 is the identity rotation
    ([1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0])
    """
    inv_freq, attention_factor = rope_frequencies(head_dim, theta, max_positions, scaling)
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)  # (P, D/2)
    angles = torch.cat((angles, angles), dim=-1)  # (P, D)
    if attention_factor == 1.0:
        return angles.cos(), angles.sin()
    return angles.cos() * attention_factor, angles.sin() * attention_factor


def rotate_half(x: Tensor) -> Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last dimension (a 90° turn of each pair ``(x1_i, x2_i)``).

    >>> rotate_half(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    tensor([-3., -4.,  1.,  2.])
    """
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate queries or keys ``x`` (B, H, T, D) by position tables ``cos``/``sin`` (T, D), or
    (B, T, D) when each row has its own positions.

    Afterwards ``q_m · k_n`` depends on the positions only through ``m - n`` (notebook 03
    asserts it).

    >>> cos, sin = rope_tables(4, 8)
    >>> x = torch.randn(1, 2, 8, 4)
    >>> torch.allclose(apply_rope(x, cos, sin).norm(dim=-1), x.norm(dim=-1))  # a rotation
    True
    """
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if cos.dim() == 3:  # (B, T, D): each row at its own positions
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, D)
    return x * cos + rotate_half(x) * sin  # (B, H, T, D)


def alibi_slopes(num_heads: int) -> Tensor:
    """The per-head slopes ``m_h`` of ALiBi (Press et al. 2022, section 3), (H,) fp32.

    For H a power of two: the geometric sequence ``2**(-8h/H)``, h = 1..H.  Otherwise the
    sequence of the largest power of two ``P < H``, then every other slope of the ``2P``
    sequence (``2**(-8h/2P)`` for odd h) until there are H (the paper's recipe, as in Bloom).

    >>> alibi_slopes(4).tolist()
    [0.25, 0.0625, 0.015625, 0.00390625]
    >>> alibi_slopes(6).tolist()[4:]   # 4 from the H=4 sequence, then h = 1, 3 of H=8
    [0.5, 0.125]
    """
    if num_heads <= 0:
        raise ValueError(f"num_heads must be positive, got {num_heads}")
    p = 2 ** math.floor(math.log2(num_heads))
    slopes = [2 ** (-8 * h / p) for h in range(1, p + 1)]
    slopes += [2 ** (-8 * h / (2 * p)) for h in range(1, 2 * (num_heads - p), 2)]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: Tensor, n_queries: int, n_keys: int,
               query_positions: Tensor | None = None) -> Tensor:
    """ALiBi's additive attention bias, (H, Tq, Tk): ``-m_h · (i - j)`` for a query at
    position i and a key at j <= i, ``-inf`` for j > i (so it is also the causal mask).  The
    queries are the last ``n_queries`` of the ``n_keys`` positions, as in ``causal_mask``,
    unless ``query_positions`` (B, Tq) places each row's queries (rows of a static KV cache at
    their own lengths); then the bias is (B, H, Tq, Tk).

    >>> alibi_bias(torch.tensor([0.5]), 2, 3)[0].tolist()
    [[-0.5, 0.0, -inf], [-1.0, -0.5, 0.0]]
    >>> alibi_bias(torch.tensor([0.5]), 1, 3, torch.tensor([[1], [2]]))[:, 0, 0].tolist()
    [[-0.5, 0.0, -inf], [-1.0, -0.5, 0.0]]
    """
    if query_positions is None:
        q_pos = torch.arange(n_keys - n_queries, n_keys, device=slopes.device)  # (Tq,)
    else:
        q_pos = query_positions[:, None, :].to(slopes.device)  # (B, 1, Tq)
    k_pos = torch.arange(n_keys, device=slopes.device)  # (Tk,)
    offset = (k_pos - q_pos[..., None]).float()  # (Tq, Tk) or (B, 1, Tq, Tk): j - i
    bias = slopes[:, None, None] * offset  # (H, Tq, Tk) or (B, H, Tq, Tk)
    return bias.masked_fill(offset > 0, float("-inf"))
