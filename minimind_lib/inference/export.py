"""Export a trained model for other tools: a Hugging Face folder, or one GGUF file that
llama.cpp and Ollama run (``python -m minimind_lib export``).

GGUF is llama.cpp's single-file format: typed metadata (architecture, sizes, tokenizer) and
named tensors, each stored as f32, f16 or a block-quantised type such as q8_0. MiniMind is a
Llama, so the file declares llama.cpp's ``llama`` architecture (a MiniMind-3 model, with its
QK-norm, llama.cpp's ``qwen3``: the same plus ``attn_q_norm`` / ``attn_k_norm``, and RoPE in our
rotate-half order, so its q/k rows stay as they are); three things differ from our state dict
and are translated here:

* **names**: ``model.layers.0.self_attn.q_proj.weight`` is ``blk.0.attn_q.weight``
  (``GGUF_NAMES``); a tied head is simply left out (llama.cpp reuses ``token_embd``);
* **q/k rows**: our RoPE rotates dimension ``i`` of a head with ``i + D/2`` ("rotate half",
  as Hugging Face's Llama and GPT-NeoX do); llama.cpp's ``llama`` rotates neighbours ``2i``
  and ``2i + 1`` (Meta's original layout). Reordering the rows of ``W_q`` and ``W_k`` within
  each head (``rope_interleave``) turns one into the other: each query/key pair meets the same
  rotation, so every attention score is unchanged (Su et al. 2021, RoFormer, eq. 34 is the
  interleaved form);
* **the tokenizer**: GGUF's ``gpt2`` model (byte-level BPE: tokens in their byte-to-unicode
  spelling, ranked merges) with the ``gpt-2`` pre-tokenizer (our split regex), the specials as
  control tokens, no BOS added, ``<|im_end|>`` as end of turn, and the ChatML template.

``load_gguf`` reads a file back into our model and tokenizer (the inverse of every step).

>>> w = torch.arange(8.0)[:, None]                    # one head, D = 8: rows 0..7
>>> rope_interleave(w, n_heads=1).flatten().tolist()  # pairs (0, 4), (1, 5), ... now adjacent
[0.0, 4.0, 1.0, 5.0, 2.0, 6.0, 3.0, 7.0]
>>> torch.equal(rope_deinterleave(rope_interleave(w, 1), 1), w)
True
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from minimind_lib.core.atomic import atomic_path
from minimind_lib.core.filenames import (
    CONFIG_FILE,
    QUANT_FILE,
    TOKENIZER_FILES,
    VISION_FILE,
    WEIGHTS_FILE,
)
from minimind_lib.inference.loading import find_tokenizer
from minimind_lib.model.checkpoint import load_model, read_config
from minimind_lib.model.config import MiniMindConfig
from minimind_lib.model.decoder import MiniMindForCausalLM
from minimind_lib.model.hf import save_pretrained
from minimind_lib.tokenizer.bpe import AddedToken, BPETokenizer
from minimind_lib.tokenizer.chat3 import jinja_template_of
from minimind_lib.tokenizer.special import END_OF_TEXT, IM_END, IM_START

FORMATS = ("gguf", "hf")
GGUF_DTYPES = ("f32", "f16", "q8_0")
GGUF_ARCH = "llama"
#: a MiniMind-3 model (QK-norm; rotate-half RoPE, which llama.cpp's qwen3 also uses)
GGUF_QWEN3_ARCH = "qwen3"
#: llama.cpp's name of the pre-tokenizer that splits text with GPT-2's regex (ours)
GGUF_PRE_TOKENIZER = "gpt-2"
#: our parameter name (with ``{i}`` for the layer) -> its GGUF name
GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.layers.{i}.input_layernorm.weight": "blk.{i}.attn_norm.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "blk.{i}.attn_q.weight",
    "model.layers.{i}.self_attn.k_proj.weight": "blk.{i}.attn_k.weight",
    "model.layers.{i}.self_attn.v_proj.weight": "blk.{i}.attn_v.weight",
    "model.layers.{i}.self_attn.o_proj.weight": "blk.{i}.attn_output.weight",
    "model.layers.{i}.self_attn.q_norm.weight": "blk.{i}.attn_q_norm.weight",
    "model.layers.{i}.self_attn.k_norm.weight": "blk.{i}.attn_k_norm.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "blk.{i}.ffn_norm.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "blk.{i}.ffn_gate.weight",
    "model.layers.{i}.mlp.up_proj.weight": "blk.{i}.ffn_up.weight",
    "model.layers.{i}.mlp.down_proj.weight": "blk.{i}.ffn_down.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def _gguf():
    """The ``gguf`` package (llama.cpp's reader/writer), an optional dependency."""
    try:
        import gguf
    except ImportError:
        raise ImportError("GGUF files need the gguf package: pip install -e '.[export]'") from None
    return gguf


# --- the q/k row order -------------------------------------------------------------------


def rope_interleave(weight: Tensor, n_heads: int) -> Tensor:
    """Rows of ``W_q`` or ``W_k`` (n_heads * D, C) from rotate-half order to interleaved order:
    within each head, new row ``2i + c`` is old row ``c * D/2 + i`` (c = 0, 1)."""
    rows, cols = weight.shape
    half = rows // n_heads // 2
    return weight.reshape(n_heads, 2, half, cols).transpose(1, 2).reshape(rows, cols)


def rope_deinterleave(weight: Tensor, n_heads: int) -> Tensor:
    """The inverse of ``rope_interleave``."""
    rows, cols = weight.shape
    half = rows // n_heads // 2
    return weight.reshape(n_heads, half, 2, cols).transpose(1, 2).reshape(rows, cols)


def gguf_name(name: str) -> str:
    """The GGUF tensor name of one of our parameters.

    >>> gguf_name("model.layers.3.mlp.down_proj.weight")
    'blk.3.ffn_down.weight'
    """
    parts = name.split(".")
    key = ".".join("{i}" if p.isdigit() else p for p in parts)
    if key not in GGUF_NAMES:
        raise ValueError(f"parameter {name!r} has no GGUF name (not a Llama parameter)")
    layer = next((p for p in parts if p.isdigit()), None)
    return GGUF_NAMES[key].format(i=layer)


# --- writing -----------------------------------------------------------------------------


def check_gguf_exportable(config: MiniMindConfig, source: str) -> None:
    """Refuse a model llama.cpp's ``llama`` / ``qwen3`` architectures cannot run the same way."""
    unsupported = {  # getattr: a config written before these options existed has none of them
        "use_moe": (getattr(config, "use_moe", False), False),
        "position_encoding": (getattr(config, "position_encoding", "rope"), "rope"),
        "rope_scaling": (getattr(config, "rope_scaling", None), None),
    }
    for field, (value, plain) in unsupported.items():
        if value != plain:
            raise ValueError(f"{source}: {field}={value!r}: GGUF export supports the plain "
                             f"Llama and Qwen3 architectures only ({field}={plain!r})")


def _gguf_tensors(model: MiniMindForCausalLM, dtype: str) -> list[tuple[str, np.ndarray, object]]:
    """(GGUF name, array, GGML type) of every tensor, q/k rows interleaved, in ``dtype``
    (1-D norm weights always f32, as llama.cpp's converter keeps them)."""
    gguf = _gguf()

    config, out = model.config, []
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # llama.cpp reuses token_embd.weight
        weight = tensor.detach().float().cpu()
        if not config.qk_norm:  # llama.cpp's llama rotates neighbours; its qwen3 halves, as we do
            if name.endswith("q_proj.weight"):
                weight = rope_interleave(weight, config.num_attention_heads)
            elif name.endswith("k_proj.weight"):
                weight = rope_interleave(weight, config.num_key_value_heads)
        array = weight.numpy()
        qtype = gguf.GGMLQuantizationType.F32
        if array.ndim == 2 and dtype == "f16":
            qtype = gguf.GGMLQuantizationType.F16
        elif array.ndim == 2 and dtype == "q8_0":
            # q8_0 blocks hold 32 values of a row; a row of another width stays f16
            qtype = gguf.GGMLQuantizationType.Q8_0 if array.shape[1] % 32 == 0 \
                else gguf.GGMLQuantizationType.F16
        out.append((gguf_name(name), gguf.quants.quantize(array, qtype), qtype))
    return out


def _add_tokenizer(writer, tokenizer: BPETokenizer, vocab_size: int) -> None:
    gguf = _gguf()

    if tokenizer.add_prefix_space or not tokenizer.use_regex or tokenizer.ignore_merges:
        raise ValueError("GGUF export needs a GPT-2 style byte-level BPE (add_prefix_space "
                         "false, use_regex true, ignore_merges false)")
    if len(tokenizer) > vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens, the model only {vocab_size}")
    added = {t.id: t for t in tokenizer.added_tokens}
    tokens, types = [], []
    for i in range(vocab_size):
        if i >= len(tokenizer):  # embedding rows no token uses: llama.cpp needs a name each
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(tokenizer.id_to_token(i))
        types.append(gguf.TokenType.NORMAL if i not in added else
                     gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(GGUF_PRE_TOKENIZER)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([f"{a} {b}" for a, b in tokenizer.merges])
    writer.add_bos_token_id(tokenizer.token_to_id(IM_START))
    writer.add_eos_token_id(tokenizer.token_to_id(IM_END))
    writer.add_eot_token_id(tokenizer.token_to_id(IM_END))
    writer.add_pad_token_id(tokenizer.token_to_id(END_OF_TEXT))
    writer.add_add_bos_token(False)  # MiniMind's prompts start with <|im_start|>system itself
    writer.add_add_eos_token(False)
    writer.add_chat_template(jinja_template_of(tokenizer))


def write_gguf(model: MiniMindForCausalLM, tokenizer: BPETokenizer, path: str | os.PathLike,
               dtype: str = "f16", name: str = "minimind") -> Path:
    """Write ``model`` and ``tokenizer`` as one GGUF file (atomically) for llama.cpp / Ollama.

    ``dtype``: "f32", "f16" (half the bytes) or "q8_0" (llama.cpp's 8-bit blocks: 32 int8
    values and one f16 scale, ~0.27x the f32 bytes).
    """
    gguf = _gguf()

    if dtype not in GGUF_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(GGUF_DTYPES)}, got {dtype!r}")
    config = model.config
    check_gguf_exportable(config, name)
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[dtype]
    tensors = _gguf_tensors(model, dtype)
    with atomic_path(path) as tmp:
        writer = gguf.GGUFWriter(tmp, GGUF_QWEN3_ARCH if config.qk_norm else GGUF_ARCH)
        writer.add_name(name)
        writer.add_file_type(file_type)
        if dtype == "q8_0":
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        writer.add_vocab_size(config.vocab_size)
        writer.add_context_length(config.max_position_embeddings)
        writer.add_embedding_length(config.hidden_size)
        writer.add_block_count(config.num_hidden_layers)
        writer.add_feed_forward_length(config.intermediate_size)
        writer.add_head_count(config.num_attention_heads)
        writer.add_head_count_kv(config.num_key_value_heads)
        writer.add_rope_dimension_count(config.head_dim)
        if config.qk_norm:  # a MiniMind-3 head may be wider than hidden / heads
            writer.add_key_length(config.head_dim)
            writer.add_value_length(config.head_dim)
        writer.add_rope_freq_base(config.rope_theta)
        writer.add_layer_norm_rms_eps(config.rms_norm_eps)
        _add_tokenizer(writer, tokenizer, config.vocab_size)
        for tensor_name, array, qtype in tensors:
            writer.add_tensor(tensor_name, array, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return Path(path)


# --- reading back ------------------------------------------------------------------------


def _field(reader, key: str, source: Path):
    field = reader.get_field(key)
    if field is None:
        raise ValueError(f"{source}: metadata key {key!r} is missing")
    return field.contents()


def _read_config(reader, source: Path, tied: bool) -> MiniMindConfig:
    arch = _field(reader, "general.architecture", source)
    if arch not in (GGUF_ARCH, GGUF_QWEN3_ARCH):
        raise ValueError(f"{source}: general.architecture is {arch!r}, expected "
                         f"{GGUF_ARCH!r} or {GGUF_QWEN3_ARCH!r}")

    def get(key: str):
        value = _field(reader, f"{arch}.{key}", source)
        # subtle: floats are stored as f32; the shortest decimal that rounds to the same f32
        # gives back the 1e-05 that was written, not 9.99999974e-06
        return float(str(np.float32(value))) if isinstance(value, float) else value

    return MiniMindConfig(
        vocab_size=len(_field(reader, "tokenizer.ggml.tokens", source)),
        hidden_size=get("embedding_length"), num_hidden_layers=get("block_count"),
        num_attention_heads=get("attention.head_count"),
        num_key_value_heads=get("attention.head_count_kv"),
        intermediate_size=get("feed_forward_length"),
        max_position_embeddings=get("context_length"), rope_theta=get("rope.freq_base"),
        rms_norm_eps=get("attention.layer_norm_rms_epsilon"), tie_word_embeddings=tied,
        **({"qk_norm": True, "intermediate_rule": "pi", "head_dim": get("attention.key_length")}
           if arch == GGUF_QWEN3_ARCH else {}))


def _read_tokenizer(reader, source: Path) -> BPETokenizer:
    gguf = _gguf()

    tokens = _field(reader, "tokenizer.ggml.tokens", source)
    types = _field(reader, "tokenizer.ggml.token_type", source)
    merges = [tuple(m.split(" ")) for m in _field(reader, "tokenizer.ggml.merges", source)]
    vocab = {t: i for i, (t, kind) in enumerate(zip(tokens, types, strict=True))
             if kind != gguf.TokenType.UNUSED}
    added = [AddedToken(t, i, special=kind == gguf.TokenType.CONTROL)
             for i, (t, kind) in enumerate(zip(tokens, types, strict=True))
             if kind in (gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED)]
    return BPETokenizer(vocab, merges, added)


def load_gguf(path: str | os.PathLike) -> tuple[MiniMindForCausalLM, BPETokenizer]:
    """Our model (fp32, q/k rows back in rotate-half order) and tokenizer from a GGUF file
    ``write_gguf`` wrote (or any ``llama`` / ``qwen3`` GGUF with a GPT-2 style tokenizer)."""
    gguf = _gguf()

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such GGUF file")
    reader = gguf.GGUFReader(path)
    arrays = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    config = _read_config(reader, path, tied="output.weight" not in arrays)
    model = MiniMindForCausalLM(config)
    state = {}
    for name in model.state_dict():
        key = gguf_name(name)
        if name == "lm_head.weight" and config.tie_word_embeddings:
            key = GGUF_NAMES["model.embed_tokens.weight"]  # tied: the same tensor
        if key not in arrays:
            raise ValueError(f"{path}: tensor {key!r} is missing")
        weight = torch.tensor(np.asarray(arrays[key], dtype=np.float32))  # a copy
        if not config.qk_norm and name.endswith("q_proj.weight"):
            weight = rope_deinterleave(weight, config.num_attention_heads)
        elif not config.qk_norm and name.endswith("k_proj.weight"):
            weight = rope_deinterleave(weight, config.num_key_value_heads)
        state[name] = weight.reshape(model.state_dict()[name].shape)
    model.load_state_dict(state, strict=True)
    return model.eval(), _read_tokenizer(reader, path)


# --- the command -------------------------------------------------------------------------


#: what a Hugging Face export folder holds: a folder of only these may be exported over
HF_EXPORT_FILES = {CONFIG_FILE, WEIGHTS_FILE, "generation_config.json", *TOKENIZER_FILES}
GGUF_MAGIC = b"GGUF"


def check_export_target(model_dir: Path, out: Path, format: str) -> None:
    """Refuse an ``--out`` whose writing would destroy something: the model folder itself, a
    place inside it, a folder that holds it, a folder of other files, a file that is not an
    earlier GGUF export. (The export itself then goes through a temporary name and a rename.)"""
    model, target = model_dir.resolve(), out.resolve()
    if format == "gguf" and target.is_dir():
        raise ValueError(f"{out} is a folder; --out names the .gguf file to write")
    if format == "hf" and target.exists() and not target.is_dir():
        raise ValueError(f"{out} is a file; --out names the folder to write")
    if target == model or model in target.parents:
        raise ValueError(f"--out {out} is {'the' if target == model else 'inside the'} model "
                         f"folder {model_dir}: exporting there would replace or mix with the "
                         "model it reads; choose a place outside it")
    if target in model.parents:
        raise ValueError(f"--out {out} holds the model folder {model_dir}: replacing it would "
                         "delete the model; choose a new folder")
    if format == "gguf":
        if target.exists() and not _is_gguf(target):
            raise ValueError(f"{out} exists and is not a GGUF file: it is not overwritten; "
                             "choose another --out")
        return
    others = sorted(p.name + ("/" if p.is_dir() else "") for p in target.iterdir()
                    if p.is_dir() or p.name not in HF_EXPORT_FILES) if target.is_dir() else []
    if others:
        shown = ", ".join(others[:4]) + (f" and {len(others) - 4} more" if len(others) > 4 else "")
        raise ValueError(f"--out {out} holds other files ({shown}): an export writes into a new "
                         "or empty folder, or over an earlier export; choose another --out")


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def export(model_dir: str | os.PathLike, out: str | os.PathLike, format: str,
           dtype: str | None = None, name: str | None = None) -> Path:
    """``python -m minimind_lib export``: the model folder ``model_dir`` (a stage folder) as a
    GGUF file (``dtype`` f32 / f16 / q8_0, default f16) or a Hugging Face folder
    (``hf.save_pretrained``, fp32, with the tokenizer and its chat template)."""
    model_dir, out = Path(model_dir), Path(out)
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if format == "hf" and dtype is not None:
        raise ValueError("--dtype applies to gguf only (the Hugging Face folder is fp32)")
    if (model_dir / QUANT_FILE).is_file():
        raise ValueError(f"{model_dir / QUANT_FILE}: an int8 folder; export the fp32 model it "
                         "came from (e.g. the dpo stage) instead, with --dtype q8_0 for 8 bits")
    if (model_dir / VISION_FILE).is_file():
        raise ValueError(f"{model_dir}: a vision-language model folder; GGUF and Hugging Face "
                         "exports hold the language model only, so its image encoder and "
                         f"projector ({VISION_FILE}) would be lost: not exported")
    check_export_target(model_dir, out, format)
    check_gguf_exportable(read_config(model_dir), str(model_dir))
    model, tokenizer = load_model(model_dir), find_tokenizer(model_dir)
    if format == "gguf":
        return write_gguf(model, tokenizer, out, dtype or "f16",
                          name or f"minimind-{model_dir.resolve().name}")
    with tempfile.TemporaryDirectory() as tokenizer_dir:
        tokenizer.save_pretrained(tokenizer_dir)
        return save_pretrained(model, out, tokenizer_dir)
