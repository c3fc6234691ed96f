"""MiniMind2-Small: a Llama-style decoder (notebooks 02 and 03), with MiniMind's options.

Read top to bottom: ``MiniMindConfig`` → ``RMSNorm`` → RoPE (``rope_tables``,
``apply_rope``; scaled for long inputs by PI, NTK or YaRN: notebook 12) → ALiBi
(``alibi_slopes``, ``alibi_bias``; notebook 12) → ``Attention`` (GQA, KV cache, SDPA or
manual path; notebook 02) → ``FeedForward`` (SwiGLU) → ``MoEFeedForward`` (mixture of
experts; notebook 11) → ``Block`` → ``MiniMindForCausalLM`` with ``generate`` (notebook 03).
Names follow ``transformers.LlamaForCausalLM`` (see ``minimind_lib.hf``) and, for the MoE
layers, MiniMind's own ``model/model_minimind.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

#: The label of a position that gets no loss (``F.cross_entropy``'s ``ignore_index``): prompts
#: and padding in SFT/DPO batches, the last position of every sequence in ``causal_lm_loss``.
IGNORE_INDEX = -100

#: The ways a model can know where a token is (``MiniMindConfig.position_encoding``): rotary
#: embeddings (Su et al. 2021), linear attention biases (Press et al. 2022), or nothing at
#: all (NoPE: causal attention alone leaks the position; Kazemnejad et al. 2023).
POSITION_ENCODINGS = ("rope", "alibi", "none")
#: ``rope_scaling["type"]`` → its keys and their defaults (MiniMind's YaRN settings: extend a
#: 2,048-token training length 16 times, to 32,768).  "linear" is position interpolation (PI,
#: Chen et al. 2023), "ntk" the NTK-aware change of base (bloc97 2023), "yarn" Peng et al. 2023.
ROPE_SCALING_DEFAULTS: dict[str, dict[str, float]] = {
    "linear": {"factor": 16, "original_max_position_embeddings": 2048},
    "ntk": {"factor": 16, "original_max_position_embeddings": 2048},
    "yarn": {"factor": 16, "original_max_position_embeddings": 2048, "beta_fast": 32,
             "beta_slow": 1, "attention_factor": 1.0},
}


@dataclass
class MiniMindConfig:
    """Hyper-parameters of MiniMind2-Small (the defaults give 25,829,888 parameters).

    ``intermediate_size=None`` means ``64 * ceil(int(hidden_size * 8 / 3) / 64)``
    (1408 at hidden 512): SwiGLU's 8/3 width, rounded up to a multiple of 64.

    Mixture of experts (notebook 11; MiniMind's names and defaults, unused unless
    ``use_moe``): every FFN becomes ``n_routed_experts`` SwiGLU experts of
    ``intermediate_size``, of which a softmax router picks ``num_experts_per_tok`` per
    token, plus ``n_shared_experts`` that every token passes through; ``aux_loss_alpha``
    weighs the load-balancing loss, per sequence when ``seq_aux`` (``MoEFeedForward``).

    Positions (notebook 12): ``position_encoding`` is "rope", "alibi" or "none";
    ``rope_scaling`` (RoPE only) is None or a dict with a "type" ("linear", "ntk" or "yarn")
    and the keys of ``ROPE_SCALING_DEFAULTS`` (missing keys take those defaults, MiniMind's).

    >>> MiniMindConfig().intermediate_size
    1408
    >>> MiniMindConfig(hidden_size=100, num_attention_heads=8)
    Traceback (most recent call last):
    ...
    ValueError: hidden_size (100) must be divisible by num_attention_heads (8)

    Every field is checked against its annotation (``int``, ``float``, ``bool``, or one of them
    ``| None``) and its range, so a hand-edited ``config.json`` fails here, by field name,
    rather than deep inside torch:

    >>> MiniMindConfig(hidden_size=64.0)
    Traceback (most recent call last):
    ...
    ValueError: hidden_size must be an integer, got 64.0 (float)
    >>> MiniMindConfig(rms_norm_eps=-1)
    Traceback (most recent call last):
    ...
    ValueError: rms_norm_eps must be > 0, got -1
    >>> MiniMindConfig(rope_scaling={"type": "yarn"}).rope_scaling["beta_fast"]
    32
    >>> MiniMindConfig(use_moe=True, num_experts_per_tok=5)
    Traceback (most recent call last):
    ...
    ValueError: num_experts_per_tok (5) must be between 1 and n_routed_experts (4)
    """

    vocab_size: int = 6400
    hidden_size: int = 512
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    intermediate_size: int | None = None
    max_position_embeddings: int = 32768
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-5
    dropout: float = 0.0
    tie_word_embeddings: bool = True
    # mixture of experts (MiniMind's names and defaults; ignored unless use_moe)
    use_moe: bool = False
    n_routed_experts: int = 4
    num_experts_per_tok: int = 2
    n_shared_experts: int = 1
    scoring_func: str = "softmax"
    aux_loss_alpha: float = 0.01
    seq_aux: bool = True
    norm_topk_prob: bool = True
    # positions
    rope_scaling: dict | None = None
    position_encoding: str = "rope"

    def __post_init__(self) -> None:
        for f in fields(self):
            problem = _type_problem(getattr(self, f.name), str(f.type))
            if problem:
                raise ValueError(f"{f.name} {problem}")
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("rope_theta", "rms_norm_eps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.intermediate_size is not None and self.intermediate_size <= 0:
            raise ValueError(f"intermediate_size must be positive, got {self.intermediate_size}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible by "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.intermediate_size is None:
            self.intermediate_size = 64 * math.ceil(int(self.hidden_size * 8 / 3) / 64)
        self._check_moe()
        self._check_positions()

    def _check_moe(self) -> None:
        for name in ("n_routed_experts", "intermediate_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 1 <= self.num_experts_per_tok <= self.n_routed_experts:
            raise ValueError(f"num_experts_per_tok ({self.num_experts_per_tok}) must be between "
                             f"1 and n_routed_experts ({self.n_routed_experts})")
        if self.n_shared_experts < 0:
            raise ValueError(f"n_shared_experts must be >= 0, got {self.n_shared_experts}")
        if self.scoring_func != "softmax":
            raise ValueError(f"scoring_func is {self.scoring_func!r}; only 'softmax' is "
                             "supported (as in MiniMind)")
        if self.aux_loss_alpha < 0:
            raise ValueError(f"aux_loss_alpha must be >= 0, got {self.aux_loss_alpha}")

    def _check_positions(self) -> None:
        if self.position_encoding not in POSITION_ENCODINGS:
            raise ValueError(f"position_encoding is {self.position_encoding!r}; choose one of "
                             f"{', '.join(POSITION_ENCODINGS)}")
        if self.rope_scaling is None:
            return
        if self.position_encoding != "rope":
            raise ValueError(f"rope_scaling needs position_encoding='rope', not "
                             f"{self.position_encoding!r}")
        self.rope_scaling = checked_rope_scaling(self.rope_scaling)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict:
        """The fields as one flat dict (what ``config.json`` holds)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> MiniMindConfig:
        """Inverse of ``to_dict``; unknown keys are an error naming them."""
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object of MiniMindConfig fields, got "
                             f"{type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown MiniMindConfig field(s): {', '.join(unknown)}")
        return cls(**d)


def _type_problem(value: object, annotation: str) -> str | None:
    """What is wrong with ``value`` for a field annotated ``annotation``, or None.

    Knows ``int``, ``float`` (an int is fine; NaN and infinities are not), ``bool`` and
    ``X | None``; any other annotation is not checked here.

    >>> _type_problem(True, "int"), _type_problem(None, "int | None"), _type_problem(1, "float")
    ('must be an integer, got True (bool)', None, None)
    >>> _type_problem(float("nan"), "float")
    'must be a finite number, got nan'
    """
    kinds = [k.strip() for k in annotation.split("|")]
    if value is None:
        return None if "None" in kinds else f"must not be null (expected {annotation})"
    kind = next((k for k in kinds if k != "None"), "")
    got = f"{value!r} ({type(value).__name__})"
    if kind == "bool" and not isinstance(value, bool):
        return f"must be true or false, got {got}"
    if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        return f"must be an integer, got {got}"
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, got {got}"
        if not math.isfinite(value):
            return f"must be a finite number, got {value!r}"
    return None


def checked_rope_scaling(scaling: dict) -> dict:
    """A copy of ``scaling`` with its type's defaults filled in; a bad key or value is a
    ValueError naming it.

    >>> checked_rope_scaling({"type": "linear", "factor": 4})
    {'type': 'linear', 'factor': 4, 'original_max_position_embeddings': 2048}
    >>> checked_rope_scaling({"type": "linear", "beta_fast": 4})
    Traceback (most recent call last):
    ...
    ValueError: rope_scaling has key(s) beta_fast, unknown to type 'linear' (known: factor, ...)
    """
    if not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling must be a dict or None, got {type(scaling).__name__}")
    kind = scaling.get("type")
    if kind not in ROPE_SCALING_DEFAULTS:
        raise ValueError(f"rope_scaling['type'] is {kind!r}; choose one of "
                         f"{', '.join(ROPE_SCALING_DEFAULTS)}")
    defaults = ROPE_SCALING_DEFAULTS[kind]
    unknown = sorted(set(scaling) - set(defaults) - {"type"})
    if unknown:
        raise ValueError(f"rope_scaling has key(s) {', '.join(unknown)}, unknown to type "
                         f"{kind!r} (known: {', '.join(defaults)})")
    checked = {"type": kind, **defaults, **{k: v for k, v in scaling.items() if k != "type"}}
    for key in defaults:
        value = checked[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ValueError(f"rope_scaling['{key}'] must be a positive number, got {value!r}")
    if checked["factor"] < 1:
        raise ValueError(f"rope_scaling['factor'] must be >= 1, got {checked['factor']}")
    return checked


# --------------------------------------------------------------------------- building blocks


class RMSNorm(nn.Module):
    """Root-mean-square LayerNorm (Zhang & Sennrich 2019, eq. 4): ``x / rms(x) * g``.

    No mean subtraction and no bias.  Computed in fp32 even under bf16/fp16 autocast
    (the mean of squares overflows / loses precision in half types), then cast back.
    Built in notebook 03.

    >>> norm = RMSNorm(4)
    >>> norm(torch.tensor([[2.0, -2.0, 2.0, -2.0]]))
    tensor([[ 1.0000, -1.0000,  1.0000, -1.0000]], grad_fn=<MulBackward0>)
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.float()  # (..., C) in fp32
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        # subtle: cast back BEFORE scaling by the weight, as Llama does, so logits match HF's.
        return self.weight * x.to(dtype)


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
    """Rotate queries or keys ``x`` (B, H, T, D) by position tables ``cos``/``sin`` (T, D).

    Afterwards ``q_m · k_n`` depends on the positions only through ``m - n`` (notebook 03
    asserts it).

    >>> cos, sin = rope_tables(4, 8)
    >>> x = torch.randn(1, 2, 8, 4)
    >>> torch.allclose(apply_rope(x, cos, sin).norm(dim=-1), x.norm(dim=-1))  # a rotation
    True
    """
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin  # (B, H, T, D)


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


def alibi_bias(slopes: Tensor, n_queries: int, n_keys: int) -> Tensor:
    """ALiBi's additive attention bias, (H, Tq, Tk): ``-m_h · (i - j)`` for a query at
    position i and a key at j <= i, ``-inf`` for j > i (so it is also the causal mask).  The
    queries are the last ``n_queries`` of the ``n_keys`` positions, as in ``causal_mask``.

    >>> alibi_bias(torch.tensor([0.5]), 2, 3)[0].tolist()
    [[-0.5, 0.0, -inf], [-1.0, -0.5, 0.0]]
    """
    q_pos = torch.arange(n_keys - n_queries, n_keys, device=slopes.device)  # (Tq,)
    k_pos = torch.arange(n_keys, device=slopes.device)  # (Tk,)
    offset = (k_pos[None, :] - q_pos[:, None]).float()  # (Tq, Tk): j - i, <= 0 for the past
    bias = slopes[:, None, None] * offset  # (H, Tq, Tk)
    return bias.masked_fill(offset > 0, float("-inf"))


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
        self.resid_dropout = nn.Dropout(config.dropout)
        self.position_encoding = config.position_encoding
        if self.position_encoding == "alibi":
            # non-persistent: rebuilt from the config, never in a checkpoint
            self.register_buffer("slopes", alibi_slopes(self.n_heads), persistent=False)  # (H,)

    def forward(
        self, x: Tensor, cos: Tensor | None, sin: Tensor | None, past: LayerCache | None = None
    ) -> tuple[Tensor, LayerCache]:
        """``x`` (B, T, C); ``cos``/``sin`` (T, D) for the T new positions (None without RoPE);
        ``past`` the cache of earlier positions.  Returns the output (B, T, C) and the cache
        extended by T."""
        B, T, _ = x.shape
        q, k, v = self._project(x, cos, sin)
        if past is not None:
            k = torch.cat((past[0], k), dim=2)  # (B, Hkv, Tk, D)
            v = torch.cat((past[1], v), dim=2)  # (B, Hkv, Tk, D)
        dropout = self.dropout if self.training else 0.0
        if self.use_sdpa:
            y = self._sdpa(q, k, v, dropout)
        else:
            y = self._manual(q, k, v, dropout)  # (B, H, T, D)
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
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        if self.position_encoding != "rope":
            return q, k, v
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, dropout: float) -> Tensor:
        tq, tk = q.shape[2], k.shape[2]
        if self.position_encoding == "alibi":
            bias = alibi_bias(self.slopes, tq, tk).to(q.dtype)  # (H, Tq, Tk), causal -inf in it
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, dropout_p=dropout,
                enable_gqa=self.n_kv_heads != self.n_heads,
            )  # (B, H, T, D)
        # subtle: one new query sees every cached key (no mask); a prefill with no cache uses
        # is_causal; any other chunk needs the explicit bottom-right mask (see causal_mask).
        mask = None if tq == 1 or tq == tk else causal_mask(tq, tk, q.device)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=tq == tk and tq > 1,
            enable_gqa=self.n_kv_heads != self.n_heads,
        )  # (B, H, T, D)

    def _manual(self, q: Tensor, k: Tensor, v: Tensor, dropout: float) -> Tensor:
        n_rep = self.n_heads // self.n_kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, Tk, D)
        return self._weights(q, k, dropout) @ v  # (B, H, Tq, D)

    def _weights(self, q: Tensor, k: Tensor, dropout: float) -> Tensor:
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, Tq, Tk)
        if self.position_encoding == "alibi":
            scores = scores.float() + alibi_bias(self.slopes, q.shape[2], k.shape[2])
        else:
            mask = causal_mask(q.shape[2], k.shape[2], q.device)  # (Tq, Tk)
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = F.softmax(scores.float(), dim=-1).to(q.dtype)  # (B, H, Tq, Tk)
        return F.dropout(weights, p=dropout, training=dropout > 0)


class FeedForward(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020, eq. 6): ``down(silu(gate(x)) * up(x))``.

    >>> ffn = FeedForward(MiniMindConfig())
    >>> ffn.gate_proj.weight.shape   # intermediate 1408 = 64 * ceil(int(512 * 8 / 3) / 64)
    torch.Size([1408, 512])
    """

    def __init__(self, config: MiniMindConfig) -> None:
        super().__init__()
        c, h = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(c, h, bias=False)
        self.up_proj = nn.Linear(c, h, bias=False)
        self.down_proj = nn.Linear(h, c, bias=False)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)))  # (B, T, C)


def load_balancing_loss(
    probs: Tensor, chosen: Tensor, alpha: float, seq_aux: bool = True
) -> Tensor:
    """MiniMind's auxiliary load-balancing loss of one MoE layer (a scalar).

    ``probs`` (B, T, E) the router probabilities, ``chosen`` (B, T, k) the experts picked.
    Per sequence b (``seq_aux``), expert e gets ``f_be = #slots of b routed to e · E / (k T)``
    (1 for every expert when the load is even) and ``P_be = mean_t probs[b, t, e]``; the loss
    is ``alpha · mean_b Σ_e f_be P_be``.  Without ``seq_aux`` the whole batch counts as one
    sequence.  This is the Switch Transformer's loss (Fedus et al. 2022, eq. 4, for k = 1)
    computed per sequence as in DeepSeekMoE (Dai et al. 2024, eq. 12-14).  Only ``P`` carries a
    gradient (counts are not differentiable): it pushes probability away from overloaded
    experts.  Uniform probabilities give ``alpha`` whatever the counts.

    >>> probs = torch.full((1, 4, 2), 0.5)                  # 4 tokens, 2 experts, uniform
    >>> load_balancing_loss(probs, torch.tensor([[[0], [1], [0], [1]]]), alpha=1.0).item()
    1.0
    >>> skewed = torch.tensor([[[0.9, 0.1]] * 4])           # every token prefers expert 0
    >>> round(load_balancing_loss(skewed, torch.zeros(1, 4, 1, dtype=torch.long), 1.0).item(), 4)
    1.8
    """
    B, T, k = chosen.shape
    n_experts = probs.shape[-1]
    if not seq_aux:
        probs, chosen, B, T = probs.reshape(1, B * T, -1), chosen.reshape(1, B * T, k), 1, B * T
    ones = torch.ones(B, T * k, device=probs.device)
    counts = torch.zeros(B, n_experts, device=probs.device).scatter_add_(
        1, chosen.reshape(B, T * k), ones)  # (B, E): slots per expert in each sequence
    f = counts * n_experts / (k * T)  # (B, E)
    return alpha * (f * probs.float().mean(dim=1)).sum(dim=1).mean()


class MoEFeedForward(nn.Module):
    """Mixture of experts in place of the FFN (notebook 11), MiniMind's ``MOEFeedForward``.

    A router ``gate`` (C → E, no bias) scores every token; ``softmax`` gives probabilities,
    the ``k`` best experts are kept and their probabilities renormalised to sum to 1 (when
    ``norm_topk_prob`` and k > 1, as MiniMind); the output is the weighted sum of those k
    SwiGLU experts plus every shared expert, unweighted (DeepSeekMoE's shared experts):

        ``y = Σ_{e in topk(x)} w_e · expert_e(x) + Σ_s shared_s(x)``

    ``aux_loss`` holds the layer's ``load_balancing_loss`` after each forward (train and eval
    mode alike; MiniMind leaves it 0 in eval mode); ``MiniMindForCausalLM`` sums it over layers.

    Dispatch: MiniMind trains by copying each token k times and running every copy through
    its expert, and at inference sorts the (token, choice) slots by expert and runs each
    expert once on its slots.  Both compute the same sum: an expert acts on each token
    independently, so grouping the tokens differently changes no token's result (only the
    order of float additions).  This class uses the sorted dispatch in both modes, with
    gradients, so train and eval give the same logits.  The router starts like every Linear
    here, N(0, 0.02) (MiniMind's ``MoEGate`` uses PyTorch's Kaiming-uniform default).

    >>> moe = MoEFeedForward(MiniMindConfig(hidden_size=16, num_attention_heads=2, use_moe=True))
    >>> moe(torch.randn(2, 3, 16)).shape, len(moe.experts), len(moe.shared_experts)
    (torch.Size([2, 3, 16]), 4, 1)
    """

    def __init__(self, config: MiniMindConfig) -> None:
        super().__init__()
        self.n_experts, self.top_k = config.n_routed_experts, config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.alpha, self.seq_aux = config.aux_loss_alpha, config.seq_aux
        self.gate = nn.Linear(config.hidden_size, self.n_experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(config) for _ in range(self.n_experts))
        self.shared_experts = nn.ModuleList(
            FeedForward(config) for _ in range(config.n_shared_experts))
        self.aux_loss: Tensor | None = None

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Router for tokens ``x`` (N, C): probabilities (N, E), the chosen experts (N, k)
        and their weights (N, k)."""
        probs = F.softmax(self.gate(x).float(), dim=-1)  # (N, E), fp32 under autocast too
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)  # (N, k) each
        if self.top_k > 1 and self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return probs, chosen, weights

    def dispatch(self, x: Tensor, chosen: Tensor, weights: Tensor) -> Tensor:
        """``Σ_j weights[:, j] · expert_{chosen[:, j]}(x)`` for ``x`` (N, C), each expert run
        once on the tokens routed to it; returns (N, C)."""
        slots = chosen.flatten()  # (N*k,): slot n*k + j is token n's j-th choice
        order = slots.argsort(stable=True)  # (N*k,) slots grouped by expert
        counts = slots.bincount(minlength=self.n_experts).tolist()
        y = torch.zeros_like(x)  # (N, C)
        for expert, group in zip(self.experts, order.split(counts), strict=True):
            tokens = group // self.top_k  # (n_e,) the token of each slot
            out = expert(x[tokens]) * weights.flatten()[group, None]  # (n_e, C)
            y.index_add_(0, tokens, out.to(y.dtype))
        return y

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        flat = x.reshape(B * T, C)  # (N, C)
        probs, chosen, weights = self.route(flat)
        self.aux_loss = load_balancing_loss(probs.view(B, T, -1), chosen.view(B, T, -1),
                                            self.alpha, self.seq_aux)
        y = self.dispatch(flat, chosen, weights)  # (N, C)
        for shared in self.shared_experts:
            y = y + shared(flat)
        return y.view(B, T, C)


def dense_twin(config: MiniMindConfig) -> MiniMindConfig:
    """The dense config whose FFN has as many parameters as one token uses in the MoE
    ``config``: width ``intermediate_size · (num_experts_per_tok + n_shared_experts)``, the
    fair "equal active parameters" baseline of notebook 11 (it lacks only the router).

    >>> moe = MiniMindConfig(hidden_size=256, num_attention_heads=8, intermediate_size=256,
    ...                      use_moe=True)
    >>> dense_twin(moe).intermediate_size, dense_twin(moe).use_moe
    (768, False)
    """
    width = config.intermediate_size * (config.num_experts_per_tok + config.n_shared_experts)
    return replace(config, use_moe=False, intermediate_size=width)


class Block(nn.Module):
    """Pre-norm decoder block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))`` (notebook 03);
    ``mlp`` is a ``MoEFeedForward`` when ``config.use_moe`` (notebook 11)."""

    def __init__(self, config: MiniMindConfig, use_sdpa: bool = True) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, use_sdpa)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MoEFeedForward(config) if config.use_moe else FeedForward(config)

    def forward(
        self, x: Tensor, cos: Tensor | None, sin: Tensor | None, past: LayerCache | None = None
    ) -> tuple[Tensor, LayerCache]:
        a, cache = self.self_attn(self.input_layernorm(x), cos, sin, past)
        x = x + a  # (B, T, C)
        x = x + self.mlp(self.post_attention_layernorm(x))  # (B, T, C)
        return x, cache


# --------------------------------------------------------------------------- the model


@dataclass
class CausalLMOutput:
    """What ``MiniMindForCausalLM.forward`` returns.

    ``logits`` (B, T, V); ``loss`` the mean shifted cross-entropy (None without labels; in
    training mode a MoE model adds ``aux_loss``); ``past_key_values`` one ``(k, v)`` per
    layer when ``use_cache=True``, else None; ``aux_loss`` the load-balancing loss summed over
    the MoE layers (None for a dense model).
    """

    logits: Tensor
    loss: Tensor | None = None
    past_key_values: list[LayerCache] | None = None
    aux_loss: Tensor | None = None


class MiniMindModel(nn.Module):
    """The decoder trunk: token embeddings, the blocks and the final norm (Llama's ``model``)."""

    def __init__(self, config: MiniMindConfig, use_sdpa: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(Block(config, use_sdpa) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.use_rope = config.position_encoding == "rope"
        if self.use_rope:
            cos, sin = rope_tables(config.head_dim, config.max_position_embeddings,
                                   config.rope_theta, config.rope_scaling)
            # non-persistent: rebuilt from the config, so they never enter a checkpoint
            self.register_buffer("rope_cos", cos, persistent=False)  # (P, D)
            self.register_buffer("rope_sin", sin, persistent=False)  # (P, D)
        self.gradient_checkpointing = False  # see MiniMindForCausalLM.gradient_checkpointing_enable

    def forward(
        self, input_ids: Tensor | None, past_key_values: list[LayerCache] | None = None,
        inputs_embeds: Tensor | None = None,
    ) -> tuple[Tensor, list[LayerCache]]:
        """``input_ids`` (B, T) → final hidden states (B, T, C) and the extended KV cache.

        ``inputs_embeds`` (B, T, C), given instead of ``input_ids`` (then None), replaces the
        token embeddings: a vision-language model's sequence with the image spliced in
        (``minimind_lib.vlm``, notebook 13; Hugging Face's name)."""
        given = input_ids if inputs_embeds is None else inputs_embeds
        if given.dim() != (2 if inputs_embeds is None else 3):
            name = "input_ids must be (batch, seq_len)" if inputs_embeds is None else \
                "inputs_embeds must be (batch, seq_len, hidden)"
            raise ValueError(f"{name}, got shape {tuple(given.shape)}")
        if past_key_values is not None and len(past_key_values) != len(self.layers):
            raise ValueError(f"past_key_values has {len(past_key_values)} layers, "
                             f"the model has {len(self.layers)}")
        start = past_key_values[0][0].shape[2] if past_key_values else 0
        end = start + given.shape[1]
        self._check_inputs(input_ids if inputs_embeds is None else None, end)
        cos, sin = (self.rope_cos[start:end], self.rope_sin[start:end]) if self.use_rope else (
            None, None)  # (T, D) each
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, C)
        x = self.dropout(x)
        caches = []
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for i, layer in enumerate(self.layers):
            past = past_key_values[i] if past_key_values else None
            if recompute:
                # keep only the block's input; rerun the block in backward (Chen et al. 2016)
                x, cache = checkpoint(layer, x, cos, sin, past, use_reentrant=False)
            else:
                x, cache = layer(x, cos, sin, past)
            caches.append(cache)
        return self.norm(x), caches

    def _check_inputs(self, input_ids: Tensor | None, end: int) -> None:
        vocab, max_pos = self.config.vocab_size, self.config.max_position_embeddings
        if input_ids is not None and input_ids.numel() and (input_ids.min() < 0
                                                         or input_ids.max() >= vocab):
            bad = input_ids[(input_ids < 0) | (input_ids >= vocab)][0].item()
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab}) "
                             f"(MiniMindConfig.vocab_size={vocab})")
        if end > max_pos:
            limit = "the RoPE table" if self.use_rope else "the model allows"
            raise ValueError(f"sequence of {end} positions is longer than {limit} "
                             f"(MiniMindConfig.max_position_embeddings={max_pos})")


class MiniMindForCausalLM(nn.Module):
    """MiniMind2-Small: the decoder trunk plus the (tied) output head (notebook 03).

    Parameter and submodule names follow ``transformers.LlamaForCausalLM``, so state dicts
    move between the two unchanged (``minimind_lib.hf``).

    >>> _ = torch.manual_seed(0)
    >>> model = MiniMindForCausalLM(MiniMindConfig(vocab_size=32, hidden_size=16,
    ...                             num_hidden_layers=1, num_attention_heads=2,
    ...                             num_key_value_heads=1, max_position_embeddings=16))
    >>> out = model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]]))
    >>> out.logits.shape
    torch.Size([1, 3, 32])
    >>> abs(out.loss.item() - math.log(32)) < 0.1   # untrained: about ln(vocab)
    True
    >>> model.generate(torch.tensor([[1, 2]]), max_new_tokens=3, temperature=0).shape
    torch.Size([1, 5])
    >>> MiniMindForCausalLM(MiniMindConfig()).num_parameters()
    25829888
    """

    def __init__(self, config: MiniMindConfig, use_sdpa: bool = True) -> None:
        super().__init__()
        self.config = config
        self.model = MiniMindModel(config, use_sdpa)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        if config.tie_word_embeddings:
            # Press & Wolf 2017: one matrix embeds tokens and scores them (saves V*C params)
            self.lm_head.weight = self.model.embed_tokens.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # Llama's initializer_range 0.02: small logits at start, so the loss begins near ln V
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def set_attention(self, use_sdpa: bool) -> MiniMindForCausalLM:
        """Switch every layer to the fused SDPA path (True) or the manual path (False)."""
        for layer in self.model.layers:
            layer.self_attn.use_sdpa = use_sdpa
        return self

    def gradient_checkpointing_enable(self) -> MiniMindForCausalLM:
        """Activation checkpointing (HF's name): in training, keep only each block's input and
        recompute the block during backward. The gradients are the same; the memory for saved
        activations drops to the block inputs plus the head and loss (``minimind_lib.memory``
        measures it), for one more forward pass per step (about a third more compute)."""
        self.model.gradient_checkpointing = True
        return self

    def gradient_checkpointing_disable(self) -> MiniMindForCausalLM:
        self.model.gradient_checkpointing = False
        return self

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Number of distinct parameters (a tied head is counted once)."""
        skip = {id(self.model.embed_tokens.weight), id(self.lm_head.weight)}
        return sum(p.numel() for p in self.parameters()
                   if not (exclude_embeddings and id(p) in skip))

    def num_active_parameters(self) -> int:
        """Parameters one token's forward pass uses: all of them, minus the routed experts a
        token skips (``n_routed_experts - num_experts_per_tok`` per MoE layer).

        >>> c = dict(vocab_size=8, hidden_size=16, num_attention_heads=2, num_hidden_layers=1)
        >>> moe = MiniMindForCausalLM(MiniMindConfig(use_moe=True, **c))
        >>> expert = 3 * 16 * moe.config.intermediate_size
        >>> moe.num_parameters() - moe.num_active_parameters() == 2 * expert   # 4 experts, top-2
        True
        """
        skipped = 0
        for layer in self.model.layers:
            if isinstance(layer.mlp, MoEFeedForward):
                per_expert = sum(p.numel() for p in layer.mlp.experts[0].parameters())
                skipped += (layer.mlp.n_experts - layer.mlp.top_k) * per_expert
        return self.num_parameters() - skipped

    def forward(
        self,
        input_ids: Tensor,
        labels: Tensor | None = None,
        past_key_values: list[LayerCache] | None = None,
        use_cache: bool = False,
    ) -> CausalLMOutput:
        """Logits for ``input_ids`` (B, T); with ``labels`` (B, T) also the loss.

        ``labels`` are aligned with the inputs (usually a copy of them, -100 where no loss is
        wanted): the model shifts them, so position t is scored on predicting token t+1.
        Batches may be right-padded (pads labelled -100): causal attention means real tokens
        never see the pads to their right, so no attention mask is needed.

        MoE (notebook 11): ``aux_loss`` is the load-balancing loss summed over layers.  In
        training mode ``loss`` = cross-entropy + ``aux_loss`` (what the optimizer minimises,
        as in MiniMind's trainer); in eval mode ``loss`` is the plain cross-entropy, so the
        validation losses of dense and MoE models compare.
        """
        hidden, caches = self.model(input_ids, past_key_values)  # (B, T, C)
        logits = self.lm_head(hidden)  # (B, T, V)
        aux_loss = self._aux_loss()
        loss = None if labels is None else causal_lm_loss(logits, labels)
        if loss is not None and aux_loss is not None and self.training:
            loss = loss + aux_loss
        return CausalLMOutput(logits, loss, caches if use_cache else None, aux_loss)

    def _aux_loss(self) -> Tensor | None:
        losses = [layer.mlp.aux_loss for layer in self.model.layers
                  if isinstance(layer.mlp, MoEFeedForward)]
        return torch.stack(losses).sum() if losses else None

    @torch.no_grad()
    def stream(
        self,
        input_ids: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
    ) -> Iterator[Tensor]:
        """Yield the next token of every row, (B,) per step; arguments as in ``generate``.

        Stops after ``max_new_tokens`` or once every row has produced ``eos_token_id``
        (rows that finished earlier keep yielding ``eos_token_id``).
        """
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        total = input_ids.shape[1] + max_new_tokens
        if total > self.config.max_position_embeddings:
            raise ValueError(f"prompt ({input_ids.shape[1]}) + max_new_tokens ({max_new_tokens}) "
                             f"exceeds max_position_embeddings "
                             f"({self.config.max_position_embeddings})")
        seq, cache = input_ids, None
        finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for _ in range(max_new_tokens):
            # with a cache only the newest token is fed; without one, the whole sequence again
            fed = seq if cache is None else seq[:, -1:]
            hidden, caches = self.model(fed, cache)  # (B, t, C)
            cache = caches if use_cache else None
            logits = self.lm_head(hidden[:, -1]).float()  # (B, V): only the last position
            token = sample_next_token(logits, temperature, top_k, top_p, generator)  # (B,)
            if eos_token_id is not None:
                token = token.masked_fill(finished, eos_token_id)
                finished |= token == eos_token_id
            yield token
            if eos_token_id is not None and bool(finished.all()):
                return
            seq = torch.cat((seq, token[:, None]), dim=1)  # (B, T+1)

    def generate(
        self,
        input_ids: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Autoregressive decoding: returns (B, T + new) = prompt + generated tokens.

        ``temperature=0`` is greedy (``top_k``/``top_p`` are then irrelevant); otherwise
        logits are divided by ``temperature``, cut to the ``top_k`` best and to the smallest
        set with probability ≥ ``top_p``, then sampled (``generator`` for reproducibility).
        ``use_cache=False`` recomputes the whole sequence each step (same tokens, slower).

        Prompts in a batch must have equal length (no padding or attention mask support);
        generation stops early once every row has emitted ``eos_token_id``, and rows that
        finished first are filled with it.  Call ``model.eval()`` first if dropout > 0.
        """
        new = list(self.stream(input_ids, max_new_tokens, temperature, top_k, top_p,
                               eos_token_id, use_cache, generator))
        if not new:
            return input_ids
        return torch.cat((input_ids, torch.stack(new, dim=1)), dim=1)  # (B, T + new)


@torch.no_grad()
def attention_maps(model: MiniMindForCausalLM, input_ids: Tensor) -> Tensor:
    """Attention probabilities of every layer and head: (L, B, H, T, T) for ``input_ids``
    (B, T).  Row t of a map says how much position t reads from each earlier position.

    >>> model = MiniMindForCausalLM(MiniMindConfig(vocab_size=16, hidden_size=16,
    ...     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1))
    >>> maps = attention_maps(model, torch.tensor([[1, 2, 3]]))
    >>> maps.shape, maps[0, 0, 0, 0].tolist()   # causal: token 0 reads only itself
    (torch.Size([2, 1, 2, 3, 3]), [1.0, 0.0, 0.0])
    """
    maps = []

    def capture(module: Attention, args: tuple, _output: object) -> None:
        x, cos, sin = args[:3]  # the normed input of the attention layer, (B, T, C)
        maps.append(module.weights(x, cos, sin))

    hooks = [layer.self_attn.register_forward_hook(capture) for layer in model.model.layers]
    try:
        model(input_ids)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(maps)  # (L, B, H, T, T)


@torch.no_grad()
def expert_load(model: MiniMindForCausalLM, input_ids: Tensor) -> Tensor:
    """How many (token, choice) slots each MoE layer routes to each expert for ``input_ids``
    (B, T): a (L, E) count tensor; every row sums to B·T·k (notebook 11's histogram).

    >>> model = MiniMindForCausalLM(MiniMindConfig(vocab_size=16, hidden_size=16,
    ...     num_hidden_layers=2, num_attention_heads=2, use_moe=True))
    >>> load = expert_load(model, torch.tensor([[1, 2, 3]]))
    >>> load.shape, load.sum(dim=1).tolist()    # 3 tokens x top-2
    (torch.Size([2, 4]), [6, 6])
    """
    counts = []

    def capture(module: MoEFeedForward, args: tuple, _output: object) -> None:
        x = args[0]  # the normed input of the MoE layer, (B, T, C)
        _, chosen, _ = module.route(x.reshape(-1, x.shape[-1]))
        counts.append(chosen.flatten().bincount(minlength=module.n_experts))

    hooks = [layer.mlp.register_forward_hook(capture) for layer in model.model.layers
             if isinstance(layer.mlp, MoEFeedForward)]
    if not hooks:
        raise ValueError("the model has no MoE layers (MiniMindConfig.use_moe is False)")
    try:
        model(input_ids)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(counts)  # (L, E)


def causal_lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy of predicting token t+1 from position t; ``IGNORE_INDEX`` (-100)
    labels are ignored.

    ``logits`` (B, T, V), ``labels`` (B, T) aligned with the inputs.  Computed in fp32.

    >>> logits = torch.zeros(1, 3, 4)                  # uniform over 4 tokens
    >>> round(causal_lm_loss(logits, torch.tensor([[0, 1, -100]])).item(), 4)  # ln 4
    1.3863
    """
    if labels.shape != logits.shape[:2]:
        raise ValueError(f"labels shape {tuple(labels.shape)} must equal input_ids shape "
                         f"{tuple(logits.shape[:2])}")
    # subtle: shift the labels, not the logits: slicing logits[:, :-1] would copy the
    # (B, T, V) tensor forward and backward (measured ~10% of a CPU training step)
    targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)  # (B, T): token t+1; last: none
    flat_logits = logits.reshape(-1, logits.shape[-1]).float()  # (B*T, V)
    return F.cross_entropy(flat_logits, targets.reshape(-1), ignore_index=IGNORE_INDEX)


#: Below this temperature sampling is greedy. Dividing float32 logits by a smaller one can
#: overflow (1e-40 is not even a normal float32) and gains nothing: at T = 1e-8 a runner-up
#: only 1e-6 below the best logit is already exp(-100) times less likely.
MIN_TEMPERATURE = 1e-8


def sampling_problem(temperature: float, top_k: int | None = None,
                     top_p: float | None = None) -> tuple[str, str] | None:
    """``(field, what is wrong)`` for sampling settings ``sample_next_token`` cannot use, or None.

    The one rule book: ``sample_next_token`` and ``inference.SamplingParams`` both apply it.

    >>> sampling_problem(float("nan"))
    ('temperature', 'temperature must be a finite number >= 0, got nan')
    >>> sampling_problem(0.7, top_p=0) is not None, sampling_problem(0.0, top_k=5, top_p=1e-46)
    (True, None)
    """
    def is_number(x: object) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)

    if not is_number(temperature) or temperature < 0:
        return "temperature", f"temperature must be a finite number >= 0, got {temperature!r}"
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        return "top_k", f"top_k must be an integer >= 1, got {top_k!r}"
    if top_p is not None and (not is_number(top_p) or not 0 < top_p <= 1):
        return "top_p", f"top_p must be a number in (0, 1], got {top_p!r}"
    return None


def sample_next_token(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One token per row from ``logits`` (B, V): greedy at temperature 0 (and below
    ``MIN_TEMPERATURE``), else temperature → top-k → top-p (Holtzman et al. 2019) →
    multinomial sample.

    >>> sample_next_token(torch.tensor([[0.0, 3.0, 1.0]]), temperature=0)
    tensor([1])
    >>> sample_next_token(torch.tensor([[0.0, 3.0, 1.0]]), top_k=1)
    tensor([1])
    >>> sample_next_token(torch.tensor([[0.0, 3.0, 1.0]]), temperature=1e-40, top_p=1e-46)
    tensor([1])
    """
    problem = sampling_problem(temperature, top_k, top_p)
    if problem:
        raise ValueError(problem[1])
    if temperature < MIN_TEMPERATURE:
        return logits.argmax(dim=-1)  # (B,)
    logits = logits / temperature  # (B, V)
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
        probs = sorted_logits.softmax(dim=-1)
        # drop a token when the ones ranked above it already reach top_p
        drop_sorted = probs.cumsum(dim=-1) - probs >= top_p  # (B, V)
        # subtle: the best token always stays. A top_p below float32's resolution (1e-46 is 0
        # in float32) would otherwise drop it too, leaving nothing to sample.
        drop_sorted[:, 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)
