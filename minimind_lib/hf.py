"""Interop with Hugging Face ``transformers``: MiniMind IS a Llama (notebook 03).

Our parameter names equal ``LlamaForCausalLM``'s, so conversion is a config translation
plus a strict ``load_state_dict``.  Three Llama defaults differ from MiniMind's and are
set explicitly: ``rms_norm_eps`` (1e-6 there, 1e-5 here), the RoPE theta (10,000 there,
1e6 here) and ``tie_word_embeddings`` (False there, True here).

RoPE scaling (notebook 12) exports as Llama's ``rope_type`` "linear" or "yarn", and
``to_hf`` checks that transformers builds the same frequencies.  What a Llama cannot
express is refused with a ValueError naming the setting: MoE layers (``use_moe``; save
those with ``checkpoint.save_model``), ALiBi or no position encoding, NTK-aware scaling
(transformers only has the *dynamic* variant, whose base changes with the input length).

``save_pretrained`` writes a folder that ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load offline: config.json, model.safetensors and the
course tokenizer (tokenizer.json + tokenizer_config.json with the ChatML chat template).

>>> from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM, rope_frequencies
>>> config = MiniMindConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
...                         num_attention_heads=4, num_key_value_heads=2,
...                         max_position_embeddings=32)
>>> ours = MiniMindForCausalLM(config).eval()
>>> theirs = to_hf(ours)
>>> ids = torch.tensor([[1, 2, 3]])
>>> torch.allclose(ours(ids).logits, theirs(ids).logits, atol=1e-5)
True
>>> from_hf(theirs).config == config
True
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import torch

from minimind_lib.files import CONFIG_FILE
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM, rope_frequencies
from minimind_lib.tokenizer import (
    COURSE_TOKENIZER_DIR,
    END_OF_TEXT,
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
)

#: Token ids of the pad, bos and eos tokens (the specials' fixed ids, minimind_lib.tokenizer).
PAD_ID, BOS_ID, EOS_ID = (SPECIAL_TOKENS.index(t) for t in (END_OF_TEXT, IM_START, IM_END))
#: Copied from the tokenizer folder by ``save_pretrained`` (the first two are required).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def check_exportable(config: MiniMindConfig) -> None:
    """Raise ValueError naming the first setting of ``config`` a Llama cannot express.

    >>> check_exportable(MiniMindConfig(use_moe=True))
    Traceback (most recent call last):
    ...
    ValueError: cannot express use_moe=True as a transformers Llama (it has one dense FFN ...
    """
    if config.use_moe:
        raise ValueError("cannot express use_moe=True as a transformers Llama (it has one dense "
                         "FFN per layer); save the model with minimind_lib.checkpoint.save_model "
                         "instead")
    if config.position_encoding != "rope":
        raise ValueError(f"cannot express position_encoding={config.position_encoding!r} as a "
                         "transformers Llama (it always rotates q and k with RoPE)")
    if config.rope_scaling is not None and config.rope_scaling["type"] == "ntk":
        raise ValueError("cannot express rope_scaling type 'ntk' as a transformers Llama "
                         "(transformers has only 'dynamic' NTK, whose base follows the input "
                         "length); use 'yarn' or 'linear'")


def _rope_parameters(config: MiniMindConfig) -> dict:
    """Llama's ``rope_parameters`` for ``config``: scaling only where ours applies (the table
    is longer than the original length), since transformers applies it unconditionally."""
    params = {"rope_type": "default", "rope_theta": config.rope_theta}
    scaling = config.rope_scaling
    if scaling is None or config.max_position_embeddings <= scaling[
            "original_max_position_embeddings"]:
        return params
    if scaling["type"] == "linear":
        return {**params, "rope_type": "linear", "factor": float(scaling["factor"])}
    keys = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow")
    return {**params, "rope_type": "yarn", **{k: scaling[k] for k in keys},
            "attention_factor": float(scaling["attention_factor"])}


def hf_config(config: MiniMindConfig, attn_implementation: str = "sdpa"):
    """The ``transformers.LlamaConfig`` describing the same network as ``config``."""
    from transformers import LlamaConfig

    check_exportable(config)

    return LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        hidden_act="silu",
        max_position_embeddings=config.max_position_embeddings,
        # subtle: these three defaults differ between Llama and MiniMind
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters=_rope_parameters(config),
        tie_word_embeddings=config.tie_word_embeddings,
        attention_dropout=config.dropout,
        attention_bias=False,
        mlp_bias=False,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        attn_implementation=attn_implementation,
    )


def to_hf(model: MiniMindForCausalLM, attn_implementation: str = "sdpa"):
    """A ``transformers.LlamaForCausalLM`` with ``model``'s weights (identical logits).

    ``attn_implementation`` is "sdpa" or "eager" (HF's manual path).  Dropout inside the
    residual stream has no Llama equivalent, so ``model.config.dropout`` must be 0 for
    training-mode equality (eval mode is always equal).  Configs a Llama cannot express
    raise ValueError (``check_exportable``).
    """
    from transformers import LlamaForCausalLM

    hf_model = LlamaForCausalLM(hf_config(model.config, attn_implementation))
    _check_same_rope(model.config, hf_model)
    hf_model.load_state_dict(model.state_dict(), strict=True)
    dtype = next(model.parameters()).dtype
    return hf_model.to(dtype=dtype, device=model.lm_head.weight.device).train(model.training)


def _check_same_rope(config: MiniMindConfig, hf_model) -> None:
    """Refuse an export whose RoPE frequencies transformers computes differently (its YaRN
    clamps the ramp's upper end at D - 1, MiniMind's at D/2 - 1: they differ only when the
    interpolated band would reach past the last pair)."""
    rotary = hf_model.model.rotary_emb
    ours, factor = rope_frequencies(config.head_dim, config.rope_theta,
                                    config.max_position_embeddings, config.rope_scaling)
    # float32 pow/log of the same numbers on both sides: 1e-6 relative covers the rounding
    if not (torch.allclose(rotary.inv_freq.float(), ours, rtol=1e-6, atol=0)
            and abs(rotary.attention_scaling - factor) < 1e-9):
        raise ValueError(f"transformers' {rotary.rope_type!r} RoPE differs from ours for "
                         f"rope_scaling={config.rope_scaling} (head_dim {config.head_dim}); "
                         "cannot export it as a Llama")


def _rope_scaling_from_hf(c) -> dict | None:
    """Our ``rope_scaling`` for a Llama config's ``rope_parameters`` (None: plain RoPE)."""
    rope = dict(c.rope_parameters or {})
    kind = rope.get("rope_type", "default")
    if kind == "default":
        return None
    if kind == "linear":
        # transformers applies it at every length; ours once the table is longer than the
        # original length, which any original below max_position_embeddings satisfies
        original = max(1, int(c.max_position_embeddings / rope["factor"]))
        return {"type": "linear", "factor": rope["factor"],
                "original_max_position_embeddings": original}
    extras = {k: rope[k] for k in ("mscale", "mscale_all_dim") if rope.get(k)}
    if kind != "yarn" or extras or rope.get("truncate") is False:
        raise ValueError(f"cannot convert Llama config: rope_parameters={rope} (MiniMind "
                         "supports rope_type 'default', 'linear' and 'yarn' without mscale)")
    factor = rope["factor"]
    attention_factor = rope.get("attention_factor")
    if attention_factor is None:  # transformers' default: the paper's 0.1 ln(s) + 1
        attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return {"type": "yarn", "factor": factor,
            "original_max_position_embeddings": rope["original_max_position_embeddings"],
            "beta_fast": rope.get("beta_fast") or 32, "beta_slow": rope.get("beta_slow") or 1,
            "attention_factor": float(attention_factor)}


def from_hf(hf_model) -> MiniMindForCausalLM:
    """A ``MiniMindForCausalLM`` with the weights of a ``transformers.LlamaForCausalLM``.

    Llama variants MiniMind cannot express (biases, another activation, a head_dim that
    is not hidden/heads, RoPE scaling other than "linear" or "yarn") raise ValueError naming
    the setting.
    """
    c = hf_model.config
    rope = dict(c.rope_parameters or {})
    unsupported = {
        "attention_bias": (getattr(c, "attention_bias", False), False),
        "mlp_bias": (getattr(c, "mlp_bias", False), False),
        "hidden_act": (c.hidden_act, "silu"),
        "head_dim": (c.head_dim, c.hidden_size // c.num_attention_heads),
    }
    for name, (value, wanted) in unsupported.items():
        if value != wanted:
            raise ValueError(f"cannot convert Llama config: {name}={value!r} "
                             f"(MiniMind needs {wanted!r})")
    config = MiniMindConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        intermediate_size=c.intermediate_size,
        max_position_embeddings=c.max_position_embeddings,
        rope_theta=float(rope["rope_theta"]),
        rms_norm_eps=c.rms_norm_eps,
        dropout=float(c.attention_dropout),
        tie_word_embeddings=bool(c.tie_word_embeddings),
        rope_scaling=_rope_scaling_from_hf(c),
    )
    hf_weight = hf_model.lm_head.weight
    model = MiniMindForCausalLM(config).to(dtype=hf_weight.dtype, device=hf_weight.device)
    model.load_state_dict(hf_model.state_dict(), strict=True)
    return model.train(hf_model.training)


def save_pretrained(
    model: MiniMindForCausalLM,
    directory: str | os.PathLike,
    tokenizer_dir: str | os.PathLike | None = COURSE_TOKENIZER_DIR,
) -> Path:
    """Write a Hugging Face folder: config.json, model.safetensors, generation_config.json,
    and (unless ``tokenizer_dir`` is None) the tokenizer files of ``tokenizer_dir``.

    The folder is built next to ``directory`` and renamed into place, so a failure never
    leaves a half-written model behind.  Load it with ``from_pretrained`` or with
    ``transformers.AutoModelForCausalLM`` / ``AutoTokenizer`` (offline).
    """
    directory = Path(directory)
    tok_files = _tokenizer_files(Path(tokenizer_dir)) if tokenizer_dir is not None else []
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        to_hf(model).save_pretrained(staging)
        for src in tok_files:
            shutil.copy2(src, staging / src.name)
        _replace_dir(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def from_pretrained(directory: str | os.PathLike) -> MiniMindForCausalLM:
    """Load a ``save_pretrained`` folder (or any compatible Llama folder) offline."""
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    if not (directory / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{directory / CONFIG_FILE} not found: not a model folder")
    hf_model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True,
                                                    dtype=torch.float32)
    return from_hf(hf_model)


def _tokenizer_files(tokenizer_dir: Path) -> list[Path]:
    required = TOKENIZER_FILES[:2]
    missing = [name for name in required if not (tokenizer_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"tokenizer folder {tokenizer_dir} lacks {', '.join(missing)} "
            "(build it with notebook 01 / `python -m minimind_lib tokenizer`, "
            "or pass tokenizer_dir=None to save the model only)")
    return [tokenizer_dir / n for n in TOKENIZER_FILES if (tokenizer_dir / n).is_file()]


def _replace_dir(new: Path, target: Path) -> None:
    """Move folder ``new`` to ``target``, replacing an existing ``target`` only at the end."""
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
        os.replace(target, old / target.name)
        os.replace(new, target)
        shutil.rmtree(old)
    else:
        os.replace(new, target)
