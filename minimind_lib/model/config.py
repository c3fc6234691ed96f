"""``MiniMindConfig``: every size and option of the model, with MiniMind's own field names, and
the checks that name a bad field before anything is allocated (notebook 03).

``intermediate_size`` left ``None`` follows ``intermediate_rule``: MiniMind2's
``64 * ceil(int(hidden * 8 / 3) / 64)``, or MiniMind-3's ``64 * ceil(hidden * pi / 64)``:

>>> MiniMindConfig(hidden_size=512).intermediate_size
1408
>>> MiniMindConfig(hidden_size=768, intermediate_rule="pi").intermediate_size
2432
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

#: How ``intermediate_size=None`` is derived from ``hidden_size``: MiniMind2's SwiGLU 8/3 width
#: (``int(hidden * 8 / 3)``) or MiniMind-3's pi width, each rounded up to a multiple of 64
INTERMEDIATE_RULES = ("8/3", "pi")
#: The fields MiniMind-3 added, at the values that leave a MiniMind2 model as it was: a
#: MiniMind2 model's ``config.json`` (and so its stage fingerprint) stays without them
_MINIMIND3_DEFAULTS = {"qk_norm": False, "intermediate_rule": "8/3", "router_aux_loss_coef": None}

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
    MiniMind-3's MoE (Qwen3-MoE's) is the same layer with ``router_aux_loss_coef`` set: the
    router renormalises its top-k for every k (a top-1 weight is exactly 1), and the loss is
    the batch-level Switch loss of each layer times that coefficient (``aux_loss_alpha`` and
    ``seq_aux`` then unused); ``preset("minimind-3-moe")``: 4 experts, top-1, none shared.

    MiniMind-3 (notebook 03; Qwen3's layout): ``qk_norm`` puts an RMSNorm over each head's
    query and key before RoPE (``self_attn.q_norm`` / ``k_norm``), ``head_dim`` may differ
    from ``hidden_size / num_attention_heads`` (None: that quotient), ``intermediate_rule``
    "pi" derives the FFN width as MiniMind-3 does; ``preset("minimind-3")`` sets them.

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
    router_aux_loss_coef: float | None = None  # MiniMind-3's MoE when set (MiniMind: 5e-4)
    # positions
    rope_scaling: dict | None = None
    position_encoding: str = "rope"
    # MiniMind-3 (Qwen3's layout)
    qk_norm: bool = False
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    intermediate_rule: str = "8/3"

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
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        elif self.head_dim <= 0:
            raise ValueError(f"head_dim must be positive, got {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible by "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.intermediate_rule not in INTERMEDIATE_RULES:
            raise ValueError(f"intermediate_rule must be one of {', '.join(INTERMEDIATE_RULES)}, "
                             f"got {self.intermediate_rule!r}")
        if self.intermediate_size is None:
            width = (int(self.hidden_size * 8 / 3) if self.intermediate_rule == "8/3"
                     else self.hidden_size * math.pi)
            self.intermediate_size = 64 * math.ceil(width / 64)
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
        if self.router_aux_loss_coef is not None and self.router_aux_loss_coef < 0:
            raise ValueError(f"router_aux_loss_coef must be >= 0, got "
                             f"{self.router_aux_loss_coef}")

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

    def to_dict(self) -> dict:
        """The fields as one flat dict (what ``config.json`` holds). MiniMind-3's fields are
        left out while a model does not use them (``qk_norm`` off, the 8/3 rule, ``head_dim``
        the quotient), so a MiniMind2 model's ``config.json`` is what it always was.

        >>> sorted(set(MiniMindConfig(qk_norm=True).to_dict()) - set(MiniMindConfig().to_dict()))
        ['qk_norm']
        """
        d = asdict(self)
        for name, plain in _MINIMIND3_DEFAULTS.items():
            if d[name] == plain:
                del d[name]
        if d["head_dim"] * self.num_attention_heads == self.hidden_size:
            del d["head_dim"]
        return d

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
