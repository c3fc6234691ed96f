"""GGUF and Hugging Face export (minimind_lib.inference.export, `python -m minimind_lib export`).

Always on: the file read back with ``gguf.GGUFReader`` (metadata, tokenizer, tensor names,
types and shapes), a from-scratch forward pass in llama.cpp's own layout (interleaved RoPE,
GGUF names, tied head) that must reproduce our logits, the round trip through ``load_gguf``,
and the CLI. tests/test_llama_cpp.py runs the file in llama.cpp itself where it is built.
"""

import math
import sys

import gguf
import numpy as np
import pytest
import torch

from minimind_lib.__main__ import main
from minimind_lib.inference.export import (
    GGUF_NAMES,
    export,
    load_gguf,
    rope_deinterleave,
    rope_interleave,
    write_gguf,
)
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
from minimind_lib.model.checkpoint import load_model, save_model
from minimind_lib.model.hf import from_pretrained
from minimind_lib.model.positions import apply_rope, rope_tables
from minimind_lib.model.quantize import quantize_int8
from minimind_lib.tokenizer import load_tokenizer
from minimind_lib.tokenizer.chat3 import MINIMIND3_CHAT_TEMPLATE

TOK = load_tokenizer()
GQA = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           max_position_embeddings=128)


def make_model(seed=0, **overrides) -> MiniMindForCausalLM:
    torch.manual_seed(seed)
    model = MiniMindForCausalLM(MiniMindConfig(**{**GQA, **overrides})).eval()
    with torch.no_grad():  # larger than init weights: logits far apart, a wrong layout shows
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    return model


def prompt_ids(text="你好, world! The quick brown fox."):
    return torch.tensor([TOK.encode(text, allowed_special=set())])  # (1, T)


# --- the q/k row order ---------------------------------------------------------------------


def interleaved_rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE as Meta's original Llama and llama.cpp's ``llama`` apply it: dimensions (2i, 2i+1)
    form a complex number rotated by pos * theta^(-2i/D) (RoFormer eq. 34). x: (T, H, D)."""
    T, _, D = x.shape
    freqs = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (D/2,)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), freqs)  # (T, D/2)
    z = torch.view_as_complex(x.double().reshape(T, -1, D // 2, 2).contiguous())  # (T, H, D/2)
    rotation = torch.polar(torch.ones_like(angles), angles)[:, None]  # (T, 1, D/2)
    return torch.view_as_real(z * rotation).reshape(x.shape)


def test_interleaving_the_rows_turns_rotate_half_into_interleaved_rope():
    """q.k scores of our RoPE on W equal interleaved RoPE on rope_interleave(W)."""
    torch.manual_seed(0)
    heads, D, C, T = 3, 8, 16, 5
    w, x = torch.randn(heads * D, C), torch.randn(T, C)
    cos, sin = rope_tables(D, T, theta=1e4)
    ours = apply_rope((x @ w.T).reshape(T, heads, D).transpose(0, 1), cos, sin)  # (H, T, D)
    theirs = interleaved_rope((x @ rope_interleave(w, heads).T).reshape(T, heads, D), 1e4)
    theirs = theirs.transpose(0, 1).float()  # (H, T, D)
    # the rotated vectors differ (another order), their dot products do not: fp32 scores of
    # size ~10 agree to ~1e-5
    torch.testing.assert_close(ours @ ours.transpose(1, 2), theirs @ theirs.transpose(1, 2),
                               atol=1e-4, rtol=1e-5)
    assert torch.equal(rope_deinterleave(rope_interleave(w, heads), heads), w)


def neox_rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE (GPT-NeoX's, llama.cpp's qwen3) on (T, H, D) in float64."""
    T, _, D = x.shape
    freqs = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (D/2,)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), freqs)[:, None]  # (T, 1, D/2)
    x1, x2 = x.double()[..., :D // 2], x.double()[..., D // 2:]
    return torch.cat([x1 * angles.cos() - x2 * angles.sin(),
                      x2 * angles.cos() + x1 * angles.sin()], dim=-1)


def llama_cpp_forward(path, ids: list[int]) -> torch.Tensor:
    """Logits (T, V) computed only from what the GGUF file says, the way llama.cpp's ``llama``
    graph computes them (GGUF names, interleaved RoPE, the head falling back to token_embd), or
    its ``qwen3`` graph (per-head RMSNorm on q and k, then rotate-half RoPE; the key length read
    from the file)."""
    reader = gguf.GGUFReader(path)
    meta = {f.name: f.contents() for f in reader.fields.values()}
    w = {t.name: torch.tensor(gguf.quants.dequantize(t.data, t.tensor_type)).double()
         for t in reader.tensors}
    arch = meta["general.architecture"]
    H, KV = meta[f"{arch}.attention.head_count"], meta[f"{arch}.attention.head_count_kv"]
    eps, theta = meta[f"{arch}.attention.layer_norm_rms_epsilon"], meta[f"{arch}.rope.freq_base"]

    def norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    x = w["token_embd.weight"][ids]  # (T, C)
    T, C = x.shape
    D = meta.get(f"{arch}.attention.key_length", C // H)
    mask = torch.full((T, T), -math.inf).triu(1)
    for i in range(meta[f"{arch}.block_count"]):
        h = norm(x, w[f"blk.{i}.attn_norm.weight"])
        q = (h @ w[f"blk.{i}.attn_q.weight"].T).reshape(T, H, D)
        k = (h @ w[f"blk.{i}.attn_k.weight"].T).reshape(T, KV, D)
        if arch == "qwen3":
            q = neox_rope(norm(q, w[f"blk.{i}.attn_q_norm.weight"]), theta)
            k = neox_rope(norm(k, w[f"blk.{i}.attn_k_norm.weight"]), theta)
        else:
            q, k = interleaved_rope(q, theta), interleaved_rope(k, theta)
        v = (h @ w[f"blk.{i}.attn_v.weight"].T).reshape(T, KV, D)
        k, v = (t.repeat_interleave(H // KV, dim=1).transpose(0, 1) for t in (k, v))  # (H, T, D)
        att = torch.softmax(q.transpose(0, 1) @ k.transpose(1, 2) / math.sqrt(D) + mask, -1)
        x = x + (att @ v).transpose(0, 1).reshape(T, H * D) @ w[f"blk.{i}.attn_output.weight"].T
        h = norm(x, w[f"blk.{i}.ffn_norm.weight"])
        gate, up = h @ w[f"blk.{i}.ffn_gate.weight"].T, h @ w[f"blk.{i}.ffn_up.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[f"blk.{i}.ffn_down.weight"].T
    head = w.get("output.weight", w["token_embd.weight"])
    return norm(x, w["output_norm.weight"]) @ head.T


@pytest.mark.parametrize("tied", [True, False])
def test_the_file_alone_reproduces_our_logits(tmp_path, tied):
    model = make_model(1, tie_word_embeddings=tied)
    path = write_gguf(model, TOK, tmp_path / "m.gguf", "f32")
    ids = prompt_ids()
    with torch.no_grad():
        ours = model(ids).logits[0]
    # fp32 model vs a float64 re-implementation: logits of size ~10 agree to ~1e-5
    torch.testing.assert_close(llama_cpp_forward(path, ids[0].tolist()).float(), ours,
                               atol=1e-3, rtol=1e-4)


MINIMIND3 = dict(qk_norm=True, intermediate_rule="pi", rms_norm_eps=1e-6, head_dim=32)


@pytest.mark.parametrize("tied", [True, False])
def test_minimind3_exports_as_llama_cpps_qwen3(tmp_path, tied):
    """MiniMind-3 (QK-norm, a head wider than hidden / heads): the qwen3 architecture, its
    q/k norms as attn_q_norm / attn_k_norm, q/k rows unchanged (rotate-half RoPE), the key
    length in the metadata; the file alone gives our logits, and it reads back exactly."""
    model = make_model(4, tie_word_embeddings=tied, **MINIMIND3)
    with torch.no_grad():
        for layer in model.model.layers:  # norm weights off 1, so a missing norm shows
            layer.self_attn.q_norm.weight.add_(torch.randn(32) * 0.3)
            layer.self_attn.k_norm.weight.add_(torch.randn(32) * 0.3)
    path = write_gguf(model, TOK, tmp_path / "m3.gguf", "f32")
    reader = gguf.GGUFReader(path)
    meta = {f.name: f.contents() for f in reader.fields.values()}
    assert meta["general.architecture"] == "qwen3"
    assert (meta["qwen3.attention.key_length"], meta["qwen3.attention.value_length"]) == (32, 32)
    tensors = {t.name: t for t in reader.tensors}
    assert {"blk.1.attn_q_norm.weight", "blk.1.attn_k_norm.weight"} <= set(tensors)
    q = torch.tensor(tensors["blk.0.attn_q.weight"].data)
    assert torch.equal(q, model.model.layers[0].self_attn.q_proj.weight.detach())
    ids = prompt_ids()
    with torch.no_grad():
        ours = model(ids).logits[0]
    torch.testing.assert_close(llama_cpp_forward(path, ids[0].tolist()).float(), ours,
                               atol=1e-3, rtol=1e-4)
    back, _ = load_gguf(path)
    assert back.config == model.config
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits[0], ours, rtol=0, atol=0)


# --- what the file holds --------------------------------------------------------------------


def test_metadata_tokenizer_and_tensors_read_back(tmp_path):
    model = make_model(2)
    path = write_gguf(model, TOK, tmp_path / "m.gguf", "f16", name="tiny")
    reader = gguf.GGUFReader(path)
    meta = {f.name: f.contents() for f in reader.fields.values()}
    c = model.config
    assert meta["general.architecture"] == "llama" and meta["general.name"] == "tiny"
    assert meta["general.file_type"] == gguf.LlamaFileType.MOSTLY_F16
    expected = {"context_length": c.max_position_embeddings, "embedding_length": c.hidden_size,
                "block_count": c.num_hidden_layers, "feed_forward_length": c.intermediate_size,
                "attention.head_count": c.num_attention_heads,
                "attention.head_count_kv": c.num_key_value_heads,
                "rope.dimension_count": c.head_dim}
    assert {k: meta[f"llama.{k}"] for k in expected} == expected
    assert meta["llama.rope.freq_base"] == pytest.approx(c.rope_theta)
    assert meta["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(c.rms_norm_eps)
    # the tokenizer: GPT-2 style BPE, our tokens and merges in order, specials as control tokens
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    assert meta["tokenizer.ggml.tokens"] == [TOK.id_to_token(i) for i in range(len(TOK))]
    assert meta["tokenizer.ggml.merges"] == [f"{a} {b}" for a, b in TOK.merges]
    types = meta["tokenizer.ggml.token_type"]
    specials = [TOK.token_to_id(t) for t in TOK.special_tokens]
    assert [types[i] for i in specials] == [gguf.TokenType.CONTROL] * 9  # ChatML + MiniMind-3
    assert set(types) - {gguf.TokenType.CONTROL} == {gguf.TokenType.NORMAL}
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"],
            meta["tokenizer.ggml.padding_token_id"]) == (1, 2, 0)
    assert meta["tokenizer.ggml.add_bos_token"] is False
    assert meta["tokenizer.chat_template"] == MINIMIND3_CHAT_TEMPLATE  # the format it speaks
    # tensors: GGUF names, no output.weight (tied), 2-D in f16, norms in f32, values kept
    tensors = {t.name: t for t in reader.tensors}
    names = {n.format(i=i) for n in GGUF_NAMES.values() for i in range(c.num_hidden_layers)
             if "q_norm" not in n and "k_norm" not in n}  # the q/k norms are qwen3's
    assert set(tensors) == names - {"output.weight"}
    for t in tensors.values():
        wanted = gguf.GGMLQuantizationType.F16 if len(t.shape) == 2 else \
            gguf.GGMLQuantizationType.F32
        assert t.tensor_type == wanted, t.name
    up = model.model.layers[1].mlp.up_proj.weight.detach()
    assert list(tensors["blk.1.ffn_up.weight"].shape) == list(up.shape)[::-1]  # ggml: (in, out)
    torch.testing.assert_close(torch.tensor(tensors["blk.1.ffn_up.weight"].data).float(), up,
                               atol=1e-3, rtol=1e-3)  # f16: 11 significant bits
    q = torch.tensor(tensors["blk.0.attn_q.weight"].data).float()
    torch.testing.assert_close(rope_deinterleave(q, c.num_attention_heads),
                               model.model.layers[0].self_attn.q_proj.weight.detach(),
                               atol=1e-3, rtol=1e-3)


def q8_0_error_bound(w: torch.Tensor) -> torch.Tensor:
    """Largest q8_0 error of each weight: each block of 32 values of a row stores
    round(x / d) with d = max|block| / 127 kept in f16, so |x - x_hat| <= d/2 + 127 |d - d_f16|,
    and |d - d_f16| <= d * 2^-11."""
    d = w.reshape(w.shape[0], -1, 32).abs().amax(-1, keepdim=True) / 127  # (rows, blocks, 1)
    return (d * (0.5 + 127 * 2**-11)).expand(-1, -1, 32).reshape(w.shape)


@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0"])
def test_load_gguf_round_trip(tmp_path, dtype):
    """Back to our model: f32 exactly (same logits); f16 and q8_0 weights within the rounding
    of their format (f16: 11 significant bits; q8_0: ``q8_0_error_bound``)."""
    model = make_model(3, tie_word_embeddings=False)
    back, tokenizer = load_gguf(write_gguf(model, TOK, tmp_path / "m.gguf", dtype))
    assert back.config == model.config
    assert tokenizer.to_dict() == TOK.to_dict()
    theirs = back.state_dict()
    for name, w in model.state_dict().items():
        err = (theirs[name] - w).abs()
        if dtype == "f32" or w.dim() == 1:  # norm weights stay f32 in every file
            assert torch.equal(theirs[name], w), name
        elif dtype == "f16":
            assert (err <= w.abs() * 2**-11 + 2**-24).all(), name  # + the f16 subnormal step
        else:
            assert (err <= q8_0_error_bound(w) * (1 + 1e-6)).all(), name
    ids = prompt_ids()
    if dtype == "f32":
        assert torch.equal(back(ids).logits, model(ids).logits)


def test_sizes_and_the_q8_0_fallback(tmp_path):
    model = make_model(4)

    def tensor_bytes(dtype):
        reader = gguf.GGUFReader(write_gguf(model, TOK, tmp_path / f"{dtype}.gguf", dtype))
        return sum(int(t.n_bytes) for t in reader.tensors)

    f32, f16, q8_0 = (tensor_bytes(d) for d in ("f32", "f16", "q8_0"))
    # f16 halves the 2-D weights (norms stay f32); q8_0 stores 34 bytes per 32 weights
    assert 0.5 < f16 / f32 < 0.51 and 34 / 64 <= q8_0 / f16 < 0.54
    # hidden 40: rows of 40 values are no whole number of 32-value q8_0 blocks -> f16
    odd = make_model(5, hidden_size=40, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=64)
    reader = gguf.GGUFReader(write_gguf(odd, TOK, tmp_path / "odd.gguf", "q8_0"))
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.F16
    assert types["blk.0.ffn_down.weight"] == gguf.GGMLQuantizationType.Q8_0  # rows of 64
    with pytest.raises(ValueError, match="dtype must be one of"):
        write_gguf(model, TOK, tmp_path / "x.gguf", "q4_0")
    assert not (tmp_path / "x.gguf").exists()


def test_a_smaller_tokenizer_is_padded_with_unused_tokens(tmp_path):
    model = make_model(6, vocab_size=len(TOK) + 5)
    reader = gguf.GGUFReader(write_gguf(model, TOK, tmp_path / "m.gguf", "f32"))
    types = reader.get_field("tokenizer.ggml.token_type").contents()
    assert len(types) == len(TOK) + 5 and types[-5:] == [gguf.TokenType.UNUSED] * 5
    back, tokenizer = load_gguf(tmp_path / "m.gguf")
    assert tokenizer.to_dict() == TOK.to_dict() and back.config.vocab_size == len(TOK) + 5


# --- the command ------------------------------------------------------------------------


@pytest.fixture
def model_dir(tmp_path):
    folder = save_model(make_model(7), tmp_path / "sft")
    TOK.save(folder / "tokenizer.json")
    return folder


def test_cli_exports_gguf_and_hf(model_dir, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert main(["export", "--format", "gguf", "--model", str(model_dir), "--out", str(out),
                 "--dtype", "q8_0"]) == 0
    assert "m.gguf (gguf" in capsys.readouterr().out
    reader = gguf.GGUFReader(out)
    assert reader.get_field("general.name").contents() == "minimind-sft"
    assert reader.get_field("general.file_type").contents() == gguf.LlamaFileType.MOSTLY_Q8_0
    hf_dir = tmp_path / "hf"
    assert main(["export", "--format", "hf", "--model", str(model_dir), "--out", str(hf_dir)]) == 0
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in hf_dir.iterdir()}
    ids = prompt_ids()
    assert torch.equal(from_pretrained(hf_dir)(ids).logits, load_model(model_dir)(ids).logits)


def test_cli_user_errors_are_one_line_without_traceback(model_dir, tmp_path, capsys):
    cases = [
        (["--format", "gguf", "--model", str(tmp_path / "nowhere")], "config.json: no such file"),
        (["--format", "hf", "--model", str(model_dir), "--dtype", "f16"], "applies to gguf only"),
        (["--format", "gguf", "--model", str(model_dir), "--out", str(tmp_path)], "is a folder"),
    ]
    int8_dir = save_model(quantize_int8(load_model(model_dir)), tmp_path / "int8")
    cases.append((["--format", "gguf", "--model", str(int8_dir)], "an int8 folder"))
    for args, message in cases:
        out = [] if "--out" in args else ["--out", str(tmp_path / "x.gguf")]
        assert main(["export", *args, *out]) == 1
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "x.gguf").exists()


def test_without_the_gguf_package_the_cli_says_what_to_install(model_dir, tmp_path, capsys,
                                                                monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # makes `import gguf` fail
    assert main(["export", "--format", "gguf", "--model", str(model_dir),
                 "--out", str(tmp_path / "x.gguf")]) == 1
    assert "pip install -e '.[export]'" in capsys.readouterr().err


def test_export_refuses_what_llama_cpp_cannot_run(model_dir, tmp_path, monkeypatch):
    """A config option the plain llama architecture lacks (another branch may add MoE) is
    refused with the option named, not written as a file that would compute something else."""
    import minimind_lib.inference.export as ex

    config = load_model(model_dir).config
    object.__setattr__(config, "use_moe", True)
    monkeypatch.setattr(ex, "read_config", lambda _: config)
    with pytest.raises(ValueError, match="use_moe=True"):
        export(model_dir, tmp_path / "x.gguf", "gguf")


def test_gguf_of_the_smoke_sft_model_answers_like_it(smoke_runs, tmp_path):
    """The trained smoke chat model through the file: same greedy answer (fp32 file)."""
    model = load_model(smoke_runs / "sft")
    back, tokenizer = load_gguf(export(smoke_runs / "sft", tmp_path / "sft.gguf", "gguf",
                                       dtype="f32"))
    ids = prompt_ids("1 + 2 =")
    assert torch.equal(back.generate(ids, 12, temperature=0),
                       model.generate(ids, 12, temperature=0))
    assert np.array_equal(tokenizer.encode("你好<|im_end|>"), TOK.encode("你好<|im_end|>"))
