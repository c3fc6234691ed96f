"""MiniMind2-Small: a Llama-style decoder (notebooks 02 and 03).

This file currently holds only the configuration; the layers follow in notebook 02-03's
work (issue 4).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields


@dataclass
class MiniMindConfig:
    """Hyper-parameters of MiniMind2-Small (the defaults give 25,829,888 parameters).

    ``intermediate_size=None`` means ``64 * ceil(int(hidden_size * 8 / 3) / 64)``
    (1408 at hidden 512): SwiGLU's 8/3 width, rounded up to a multiple of 64.

    >>> MiniMindConfig().intermediate_size
    1408
    >>> MiniMindConfig(hidden_size=100, num_attention_heads=8)
    Traceback (most recent call last):
    ...
    ValueError: hidden_size (100) must be divisible by num_attention_heads (8)
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

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
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

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict:
        """The fields as one flat dict (what ``config.json`` holds)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> MiniMindConfig:
        """Inverse of ``to_dict``; unknown keys are an error naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown MiniMindConfig field(s): {', '.join(unknown)}")
        return cls(**d)
