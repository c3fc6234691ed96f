"""MiniMind's released models as configs (notebook 03): ``preset(name)`` gives the exact sizes
of MiniMind2-Small (the course's "26M"), MiniMind2 and MiniMind2-MoE, and of MiniMind-3 (April
2026: QK-norm, the pi FFN width, RMSNorm eps 1e-6; exported as transformers' ``Qwen3``) and
MiniMind-3-MoE (4 experts, top-1, no shared expert: 198M, 64M active; ``Qwen3MoE``).

>>> from minimind_lib.model.decoder import model_size
>>> for name in PRESETS:
...     print(f"{name}: {model_size(preset(name))[0]:,} parameters")
minimind2-small: 25,829,888 parameters
minimind2: 104,030,976 parameters
minimind2-moe: 145,029,760 parameters
minimind-3: 63,912,192 parameters
minimind-3-moe: 198,416,640 parameters
>>> preset("minimind-3", num_hidden_layers=2).num_hidden_layers
2
"""

from __future__ import annotations

from minimind_lib.model.config import MiniMindConfig

#: MiniMind's sizes (its README's model table; MiniMind-3: ``model/model_minimind.py`` defaults)
PRESETS: dict[str, dict[str, object]] = {
    "minimind2-small": {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
                        "num_key_value_heads": 2},
    "minimind2": {"hidden_size": 768, "num_hidden_layers": 16, "num_attention_heads": 8,
                  "num_key_value_heads": 2},
    "minimind2-moe": {"hidden_size": 640, "num_hidden_layers": 8, "num_attention_heads": 8,
                      "num_key_value_heads": 2, "use_moe": True, "n_routed_experts": 4,
                      "n_shared_experts": 1, "num_experts_per_tok": 2},
    "minimind-3": {"hidden_size": 768, "num_hidden_layers": 8, "num_attention_heads": 8,
                   "num_key_value_heads": 4, "qk_norm": True, "intermediate_rule": "pi",
                   "rms_norm_eps": 1e-6},
    "minimind-3-moe": {"hidden_size": 768, "num_hidden_layers": 8, "num_attention_heads": 8,
                       "num_key_value_heads": 4, "qk_norm": True, "intermediate_rule": "pi",
                       "rms_norm_eps": 1e-6, "use_moe": True, "n_routed_experts": 4,
                       "num_experts_per_tok": 1, "n_shared_experts": 0,
                       "router_aux_loss_coef": 5e-4},
}


def preset(name: str, **overrides: object) -> MiniMindConfig:
    """The ``MiniMindConfig`` of MiniMind's model ``name`` (``PRESETS``), ``overrides`` applied
    (any field: ``preset("minimind-3", max_position_embeddings=2048)``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    return MiniMindConfig(**{**PRESETS[name], **overrides})
