"""Interop with Hugging Face ``transformers``: MiniMind IS a Llama (notebook 03).

Our parameter names equal ``LlamaForCausalLM``'s, so conversion is a config translation
plus a strict ``load_state_dict``.  Three Llama defaults differ from MiniMind's and are
set explicitly: ``rms_norm_eps`` (1e-6 there, 1e-5 here), the RoPE theta (10,000 there,
1e6 here) and ``tie_word_embeddings`` (False there, True here).

RoPE scaling (notebook 12) exports as Llama's ``rope_type`` "linear" or "yarn", and
``to_hf`` checks that transformers builds the same frequencies.  MiniMind-3 (``qk_norm``)
exports as ``Qwen3ForCausalLM``, MiniMind-3-MoE as ``Qwen3MoeForCausalLM`` (its experts fused
into transformers' 3-D tensors, ``fused_experts``).  What cannot be expressed is refused with a
ValueError naming the setting: MiniMind2's MoE (shared experts; save those with
``checkpoint.save_model``), ALiBi or no position encoding, NTK-aware scaling (transformers only
has the *dynamic* variant, whose base changes with the input length).

``save_pretrained`` writes a folder that ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load offline: config.json, model.safetensors and the
course tokenizer (tokenizer.json + tokenizer_config.json with the ChatML chat template).

>>> from minimind_lib.model.config import MiniMindConfig
>>> from minimind_lib.model.decoder import MiniMindForCausalLM
>>> from minimind_lib.model.positions import rope_frequencies
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

import json
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from minimind_lib.core.atomic import DIR_MODE, FILE_MODE, disk_full_named
from minimind_lib.core.checked_files import read_json
from minimind_lib.core.filenames import CONFIG_FILE
from minimind_lib.model.config import MiniMindConfig
from minimind_lib.model.decoder import MiniMindForCausalLM
from minimind_lib.model.positions import rope_frequencies
from minimind_lib.tokenizer.bpe import COURSE_TOKENIZER_DIR, bytes_to_unicode, copy_tokenizer_files
from minimind_lib.tokenizer.special import END_OF_TEXT, IM_END, IM_START, SPECIAL_TOKENS

#: Token ids of the pad, bos and eos tokens (the specials' fixed ids, minimind_lib.tokenizer).
PAD_ID, BOS_ID, EOS_ID = (SPECIAL_TOKENS.index(t) for t in (END_OF_TEXT, IM_START, IM_END))
#: Copied from the tokenizer folder by ``save_pretrained`` (the first two are required).


def check_hf_exportable(config: MiniMindConfig) -> None:
    """Raise ValueError naming the first setting of ``config`` a Llama cannot express.

    >>> check_hf_exportable(MiniMindConfig(use_moe=True))
    Traceback (most recent call last):
    ...
    ValueError: cannot express use_moe=True as a transformers Llama (it has one dense FFN ...
    """
    if config.use_moe and not (config.qk_norm and config.router_aux_loss_coef is not None
                               and config.n_shared_experts == 0):
        raise ValueError("cannot express use_moe=True as a transformers Llama (it has one dense "
                         "FFN per layer) nor MiniMind2's MoE as a Qwen3-MoE (shared experts, "
                         "its top-k and loss rules); save the model with "
                         "minimind_lib.model.checkpoint.save_model instead")
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
    """The ``transformers`` config describing the same network as ``config``: a
    ``Qwen3Config`` for a MiniMind-3 model (QK-norm; how MiniMind exports it), else a
    ``LlamaConfig`` (how MiniMind exports MiniMind2)."""
    from transformers import LlamaConfig, Qwen3Config

    check_hf_exportable(config)
    shared = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        hidden_act="silu",
        max_position_embeddings=config.max_position_embeddings,
        # subtle: these three defaults differ between Llama / Qwen3 and MiniMind
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters=_rope_parameters(config),
        tie_word_embeddings=config.tie_word_embeddings,
        attention_dropout=config.dropout,
        attention_bias=False,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        attn_implementation=attn_implementation,
    )
    if config.use_moe:  # MiniMind-3-MoE: every layer sparse, experts as wide as the dense FFN
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(**shared, use_sliding_window=False, sliding_window=None,
                              num_experts=config.n_routed_experts,
                              num_experts_per_tok=config.num_experts_per_tok,
                              moe_intermediate_size=config.intermediate_size,
                              norm_topk_prob=config.norm_topk_prob,
                              router_aux_loss_coef=config.router_aux_loss_coef,
                              decoder_sparse_step=1, mlp_only_layers=[])
    if config.qk_norm:  # Qwen3 has the q/k norms, and a sliding window MiniMind-3 does not use
        return Qwen3Config(**shared, use_sliding_window=False, sliding_window=None)
    return LlamaConfig(**shared, mlp_bias=False)


_EXPERT = "mlp.experts."


def fused_experts(state: dict[str, torch.Tensor], n_experts: int) -> dict[str, torch.Tensor]:
    """Our per-expert tensors (MiniMind-3's names: ``mlp.experts.{e}.gate_proj.weight`` ...)
    as transformers' Qwen3-MoE holds them: ``mlp.experts.gate_up_proj`` (E, 2I, C), the gate
    rows above the up rows, and ``mlp.experts.down_proj`` (E, C, I)."""
    out = {k: v for k, v in state.items() if _EXPERT not in k}
    layers = sorted({k.split(_EXPERT)[0] for k in state if _EXPERT in k})
    for layer in layers:  # e.g. "model.layers.3."
        def weight(e: int, proj: str, layer: str = layer) -> torch.Tensor:
            return state[f"{layer}{_EXPERT}{e}.{proj}.weight"]

        out[f"{layer}{_EXPERT}gate_up_proj"] = torch.stack(
            [torch.cat([weight(e, "gate_proj"), weight(e, "up_proj")]) for e in range(n_experts)])
        out[f"{layer}{_EXPERT}down_proj"] = torch.stack(
            [weight(e, "down_proj") for e in range(n_experts)])
    return out


def unfused_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of ``fused_experts`` (per-expert tensors pass through unchanged)."""
    out = {}
    for key, value in state.items():
        layer, _, name = key.partition(_EXPERT)
        if name == "gate_up_proj":  # (E, 2I, C)
            gates, ups = value.chunk(2, dim=1)  # (E, I, C) each
            for e in range(value.shape[0]):
                out[f"{layer}{_EXPERT}{e}.gate_proj.weight"] = gates[e]
                out[f"{layer}{_EXPERT}{e}.up_proj.weight"] = ups[e]
        elif name == "down_proj":  # (E, C, I)
            for e, down in enumerate(value.unbind(0)):
                out[f"{layer}{_EXPERT}{e}.down_proj.weight"] = down
        else:
            out[key] = value
    return out


def to_hf(model: MiniMindForCausalLM, attn_implementation: str = "sdpa"):
    """A ``transformers.LlamaForCausalLM`` (MiniMind2), ``Qwen3ForCausalLM`` (MiniMind-3:
    ``qk_norm``) or ``Qwen3MoeForCausalLM`` (MiniMind-3-MoE) with ``model``'s weights
    (identical logits; the parameter names are the same, a Qwen3-MoE's experts fused).

    ``attn_implementation`` is "sdpa" or "eager" (HF's manual path).  Dropout inside the
    residual stream has no Llama equivalent, so ``model.config.dropout`` must be 0 for
    training-mode equality (eval mode is always equal).  Configs a Llama cannot express
    raise ValueError (``check_hf_exportable``).
    """
    from transformers import LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM

    config = model.config
    architecture = (Qwen3MoeForCausalLM if config.use_moe else
                    Qwen3ForCausalLM if config.qk_norm else LlamaForCausalLM)
    hf_model = architecture(hf_config(config, attn_implementation))
    _check_same_rope(config, hf_model)
    state = model.state_dict()
    hf_model.load_state_dict(fused_experts(state, config.n_routed_experts) if config.use_moe
                             else state, strict=True)
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
    """A ``MiniMindForCausalLM`` with the weights of a ``transformers.LlamaForCausalLM``, or of
    a ``Qwen3ForCausalLM`` (MiniMind-3: QK-norm, any ``head_dim``).

    Variants MiniMind cannot express (biases, another activation, a Llama head_dim that is not
    hidden/heads, Qwen3's sliding window, RoPE scaling other than "linear" or "yarn") raise
    ValueError naming the setting.
    """
    c = hf_model.config
    qwen3 = c.model_type in ("qwen3", "qwen3_moe")
    if c.model_type not in ("llama", "qwen3", "qwen3_moe"):
        raise ValueError(f"cannot convert model_type {c.model_type!r} (llama, qwen3 or "
                         "qwen3_moe)")
    rope = dict(c.rope_parameters or {})
    unsupported = {
        "attention_bias": (getattr(c, "attention_bias", False), False),
        "mlp_bias": (getattr(c, "mlp_bias", False), False),
        "hidden_act": (c.hidden_act, "silu"),
        "use_sliding_window": (getattr(c, "use_sliding_window", False), False),
    }
    if not qwen3:
        unsupported["head_dim"] = (c.head_dim, c.hidden_size // c.num_attention_heads)
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
        qk_norm=qwen3,
        head_dim=c.head_dim,
        intermediate_rule="pi" if qwen3 else "8/3",  # MiniMind-3's (the width is given anyway)
        **(_qwen3_moe_fields(c.to_dict()) if c.model_type == "qwen3_moe" else {}),
    )
    hf_weight = hf_model.lm_head.weight
    model = MiniMindForCausalLM(config).to(dtype=hf_weight.dtype, device=hf_weight.device)
    model.load_state_dict(unfused_experts(hf_model.state_dict()), strict=True)
    return model.train(hf_model.training)


def _qwen3_moe_fields(c: dict) -> dict[str, object]:
    """Our MoE fields for a Qwen3-MoE config (as a dict: a config object's ``to_dict()`` or its
    config.json); what MiniMind-3-MoE does not have is refused, naming the setting."""
    sparse = (c.get("decoder_sparse_step", 1) == 1 and not c.get("mlp_only_layers")
              and c.get("moe_intermediate_size") == c.get("intermediate_size"))
    if not sparse:
        raise ValueError("cannot convert Qwen3-MoE config: MiniMind-3-MoE makes every layer "
                         "sparse (decoder_sparse_step 1, no mlp_only_layers) with experts as "
                         f"wide as intermediate_size; got decoder_sparse_step="
                         f"{c.get('decoder_sparse_step')}, mlp_only_layers="
                         f"{c.get('mlp_only_layers')}, moe_intermediate_size="
                         f"{c.get('moe_intermediate_size')}")
    experts = c.get("num_experts", c.get("num_local_experts"))  # transformers 5 renamed it
    return {"use_moe": True, "n_routed_experts": experts,
            "num_experts_per_tok": c["num_experts_per_tok"], "n_shared_experts": 0,
            "norm_topk_prob": bool(c.get("norm_topk_prob", True)),
            "router_aux_loss_coef": float(c.get("router_aux_loss_coef", 5e-4))}


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
    directory = Path(directory).resolve()  # "." has no name to build the staging folder from
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        with disk_full_named(directory):
            if tokenizer_dir is not None:  # first: a missing tokenizer fails before any work
                copy_tokenizer_files(tokenizer_dir, staging)
            to_hf(model).save_pretrained(staging)
        for path in staging.iterdir():  # the permissions a plain folder and files would get
            os.chmod(path, FILE_MODE)
        os.chmod(staging, DIR_MODE)
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


class ByteLevelTokenizer:
    """A Hugging Face byte-level BPE tokenizer (GPT-2's kind: MiniMind, Qwen, Llama 3, ...)
    seen through the two methods ``evaluation.perplexity.bits_per_byte`` needs, so a Hugging Face
    model and its own tokenizer can be compared with ours on the same text.

    >>> from transformers import AutoTokenizer
    >>> from minimind_lib.tokenizer.bpe import COURSE_TOKENIZER_DIR, load_tokenizer
    >>> theirs = ByteLevelTokenizer(AutoTokenizer.from_pretrained(COURSE_TOKENIZER_DIR))
    >>> text = "hi <|im_end|> 你好"
    >>> theirs.encode_batch([text], allowed_special=set())[0] == load_tokenizer().encode(
    ...     text, allowed_special=set())
    True
    >>> b"".join(theirs.token_bytes(i) for i in theirs.encode_batch([text], set())[0]).decode()
    'hi <|im_end|> 你好'
    """

    def __init__(self, hf_tokenizer) -> None:
        name = getattr(hf_tokenizer, "name_or_path", "") or "the tokenizer"
        backend = getattr(hf_tokenizer, "backend_tokenizer", None)
        decoder = json.loads(backend.to_str()).get("decoder") if backend is not None else None
        if "ByteLevel" not in json.dumps(decoder):
            raise ValueError(f"{name}: not a byte-level BPE tokenizer (decoder {decoder!r}); "
                             "bits per byte needs each token's exact bytes, supported: byte-level "
                             "BPE (GPT-2, MiniMind, Qwen, Llama 3)")
        self.hf = hf_tokenizer
        self._byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
        self._added = {i: t.content for i, t in hf_tokenizer.added_tokens_decoder.items()}

    def encode_batch(self, texts: Sequence[str], allowed_special: set[str]) -> list[list[int]]:
        """Ids of ``texts``; special-token strings stay plain text (``allowed_special=set()``)."""
        if allowed_special != set():
            raise ValueError("ByteLevelTokenizer encodes special-token strings as plain text "
                             "only (allowed_special=set())")
        return self.hf(list(texts), add_special_tokens=False,
                       split_special_tokens=True)["input_ids"]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` stands for."""
        if token_id in self._added:
            return self._added[token_id].encode("utf-8")
        token = self.hf.convert_ids_to_tokens(token_id)
        return bytes(self._byte_of[c] for c in token)


def _replace_dir(new: Path, target: Path) -> None:
    """Move folder ``new`` to ``target``, replacing an existing ``target`` only at the end (the
    old one is put back if the move fails)."""
    if not target.exists():
        os.replace(new, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
    try:
        os.replace(target, old / target.name)
        try:
            os.replace(new, target)
        except OSError:
            os.replace(old / target.name, target)
            raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


# --- MiniMind's own weights in our model -------------------------------------------------------

#: MiniMind's defaults for what a bare ``.pth`` state dict cannot tell (MiniMindConfig in its
#: model/model_minimind.py): 8 query heads, RoPE theta 1e6, RMSNorm eps 1e-5, 32k positions
MINIMIND_DEFAULTS = {"num_attention_heads": 8, "rope_theta": 1e6, "rms_norm_eps": 1e-5,
                     "max_position_embeddings": 32768}
#: keys some exports carry that are not weights (RoPE tables): rebuilt from the config here
_NOT_WEIGHTS = ("rotary_emb.inv_freq", "freqs_cos", "freqs_sin")
_HF_CONFIG_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "intermediate_size", "max_position_embeddings",
                   "rms_norm_eps", "tie_word_embeddings")
#: the tensor a MiniMind-3 (QK-norm) state dict has and a MiniMind2 one has not
_QK_NORM = "model.layers.0.self_attn.q_norm.weight"
#: MiniMind's MoE fields (its ``model_type: minimind`` config.json uses the same names as ours)
_MOE_KEYS = ("use_moe", "n_routed_experts", "num_experts_per_tok", "n_shared_experts",
             "scoring_func", "aux_loss_alpha", "seq_aux", "norm_topk_prob")


def is_transformers_folder(path: str | os.PathLike) -> bool:
    """A folder whose ``config.json`` names a ``model_type`` (a ``transformers`` export: ours,
    MiniMind's Llama / Qwen3 / ``minimind`` ones), not one of the course's stage folders."""
    config = Path(path) / CONFIG_FILE
    return config.is_file() and "model_type" in read_json(config)


def load_pretrained(source: str | os.PathLike, **config: object) -> MiniMindForCausalLM:
    """A ``MiniMindForCausalLM`` from any of the places MiniMind weights live:

    * one of our stage folders (``checkpoint.load_model``);
    * a ``transformers`` folder: a Llama export (MiniMind exports MiniMind2-Small with
      ``LlamaForCausalLM.save_pretrained``) or MiniMind's own ``model_type: minimind`` format,
      both with Llama's parameter names: ``config.json`` + ``model.safetensors`` (or
      ``pytorch_model.bin``);
    * a MiniMind ``.pth`` state dict (fp16, Llama names; dense or MoE), its config inferred
      from the tensor shapes, with MiniMind's defaults for what shapes cannot say
      (``MINIMIND_DEFAULTS``; pass e.g. ``num_attention_heads=16`` or ``num_experts_per_tok=1``
      to differ);
    * a Hub repo id such as ``jingyaogong/MiniMind2-Small`` (fetched by ``download``, offline
      from the hub cache with ``HF_HUB_OFFLINE=1``).

    Weights are loaded strictly (a missing or unexpected tensor is an error) in fp32.
    """
    path = Path(source)
    if path.is_dir():
        if (path / CONFIG_FILE).is_file() and not is_transformers_folder(path):
            from minimind_lib.model.checkpoint import load_model

            return load_model(path)
        return _from_transformers_folder(path)
    if path.is_file():
        return _from_state_dict(_load_tensors(path), str(path), **config)
    if str(source).count("/") == 1 and not str(source).startswith((".", "/")):
        from minimind_lib.core.download import ARTIFACTS, download

        name = str(source).split("/")[1]
        folder = download("model", ARTIFACTS["model"].default_dir.parent / name,
                          repo_id=str(source))
        return _from_transformers_folder(folder)
    raise FileNotFoundError(f"{source}: not a folder, a weights file or a Hub repo id "
                            "(owner/name)")



def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of a ``.safetensors``, ``.pth`` / ``.pt`` / ``.bin`` file (pickle-free loading)."""
    if path.suffix == ".safetensors":
        import safetensors.torch

        return safetensors.torch.load_file(str(path))
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a torch pickle we refuse to run, or not a torch file at all
        raise ValueError(f"{path}: not a tensor file torch can load safely ({e})") from None
    if isinstance(data, dict) and isinstance(data.get("model"), dict):
        data = data["model"]  # a training checkpoint: {"model": state_dict, ...}
    if not isinstance(data, dict) or not all(torch.is_tensor(v) for v in data.values()):
        raise ValueError(f"{path}: expected a state dict (name -> tensor)")
    return data


def _from_transformers_folder(folder: Path) -> MiniMindForCausalLM:
    hf = read_json(folder / CONFIG_FILE)
    if hf.get("model_type") not in ("llama", "minimind", "qwen3", "qwen3_moe"):
        raise ValueError(f"{folder / CONFIG_FILE}: model_type {hf.get('model_type')!r} is not "
                         "a model MiniMind can load (llama, qwen3, qwen3_moe, minimind)")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise ValueError(f"{folder / CONFIG_FILE}: scaled RoPE {rope} is not supported")
    fields_ = {k: hf[k] for k in _HF_CONFIG_KEYS + _MOE_KEYS if hf.get(k) is not None}
    fields_["rope_theta"] = float(rope.get("rope_theta", hf.get("rope_theta", 1e4)))
    weights = [folder / n for n in ("model.safetensors", "pytorch_model.bin")
               if (folder / n).is_file()]
    if not weights:
        raise FileNotFoundError(f"{folder}: no model.safetensors or pytorch_model.bin")
    tensors = unfused_experts(_load_tensors(weights[0]))
    # MiniMind-3: Qwen3's layout, or MiniMind's own folder holding its q_norm / k_norm
    fields_["qk_norm"] = hf["model_type"] in ("qwen3", "qwen3_moe") or _QK_NORM in tensors
    if hf["model_type"] == "qwen3_moe":
        fields_.update(_qwen3_moe_fields(hf))
    if fields_["qk_norm"]:
        fields_["intermediate_rule"] = "pi"
        if hf.get("head_dim") is not None:
            fields_["head_dim"] = hf["head_dim"]
    return _build(MiniMindConfig(**fields_), tensors, str(weights[0]))


def _from_state_dict(tensors: dict[str, torch.Tensor], source: str,
                     **overrides: object) -> MiniMindForCausalLM:
    """Infer a ``MiniMindConfig`` from the tensor shapes, then load them."""
    try:
        vocab, hidden = tensors["model.embed_tokens.weight"].shape
        layers = 1 + max(int(k.split(".")[2]) for k in tensors if k.startswith("model.layers."))
        q_out = tensors["model.layers.0.self_attn.q_proj.weight"].shape[0]
        k_out = tensors["model.layers.0.self_attn.k_proj.weight"].shape[0]
        moe = _moe_fields(tensors)
        inter = tensors["model.layers.0.mlp." + ("experts.0." if moe else "")
                        + "gate_proj.weight"].shape[0]
    except (KeyError, ValueError) as e:
        raise ValueError(f"{source}: not a MiniMind / Llama state dict (missing {e})") from None
    minimind3 = {}
    if _QK_NORM in tensors:  # MiniMind-3: QK-norm, eps 1e-6; the norm's width is the head's
        head = tensors[_QK_NORM].shape[0]  # so the heads are counted, not assumed
        minimind3 = {"qk_norm": True, "head_dim": head, "num_attention_heads": q_out // head,
                     "rms_norm_eps": 1e-6, "intermediate_rule": "pi"}
        if moe:  # MiniMind-3-MoE's rules: top-1, Qwen3-MoE's router and loss
            minimind3 |= {"num_experts_per_tok": 1, "router_aux_loss_coef": 5e-4}
    values = {**MINIMIND_DEFAULTS, **minimind3, **moe, **overrides}
    head_dim = values.get("head_dim") or q_out // values["num_attention_heads"]
    tied = "lm_head.weight" not in tensors or torch.equal(tensors["lm_head.weight"],
                                                         tensors["model.embed_tokens.weight"])
    config = MiniMindConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                            num_key_value_heads=k_out // head_dim, intermediate_size=inter,
                            tie_word_embeddings=tied, **values)
    return _build(config, tensors, source)


def _moe_fields(tensors: dict[str, torch.Tensor]) -> dict[str, object]:
    """A MiniMind MoE state dict (``mlp.gate`` + ``mlp.experts.N``) -> its config fields; the
    top-k is not in the tensors (MiniMind's default 2 unless given)."""
    prefix = "model.layers.0.mlp."
    if prefix + "gate.weight" not in tensors:
        return {}

    def count(group: str) -> int:
        return len({k.split(".")[5] for k in tensors if k.startswith(prefix + group + ".")})

    return {"use_moe": True, "n_routed_experts": tensors[prefix + "gate.weight"].shape[0],
            "n_shared_experts": count("shared_experts")}


def _build(config: MiniMindConfig, tensors: dict[str, torch.Tensor],
           source: str) -> MiniMindForCausalLM:
    state = {k: v.float() for k, v in tensors.items() if not k.endswith(_NOT_WEIGHTS)}
    if config.tie_word_embeddings:
        state.setdefault("lm_head.weight", state.get("model.embed_tokens.weight"))
    model = MiniMindForCausalLM(config)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        detail = " ".join(str(e).split())
        raise ValueError(f"{source} does not fit {config}: {detail}") from None
    return model.eval()
