"""Position encodings for long inputs (notebook 12): RoPE scaling (PI, NTK, YaRN) against the
issue's formula and transformers' rope-init functions, ALiBi against Bloom, attention with
ALiBi / no position encoding against a reference written from the formulas, and the
long-context evaluation helpers (minimind_lib.evaluation.long_context)."""

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.bloom.modeling_bloom import build_alibi_tensor

from minimind_lib.evaluation.long_context import (
    extend,
    loss_by_position,
    perplexity_by_length,
    rope_variants,
)
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
from minimind_lib.model.attention import Attention
from minimind_lib.model.checkpoint import load_model, save_model
from minimind_lib.model.hf import from_hf, to_hf
from minimind_lib.model.positions import alibi_bias, alibi_slopes, rope_frequencies, rope_tables

MINIMIND_YARN = {"type": "yarn", "factor": 16, "original_max_position_embeddings": 2048,
                 "beta_fast": 32, "beta_slow": 1, "attention_factor": 1.0}


def yarn_from_the_issue(d, theta, s, L, beta_fast, beta_slow):
    """f'(i) = f(i)((1 - γ_i) + γ_i / s), γ the linear ramp between low and high, clamped to
    [0, 1]; low = floor(d ln(L / (β_fast 2π)) / (2 ln θ)), high = ceil(same with β_slow);
    MiniMind clamps low >= 0, high <= d/2 - 1.  Plain Python floats (float64)."""
    low = max(math.floor(d * math.log(L / (beta_fast * 2 * math.pi)) / (2 * math.log(theta))), 0)
    high = min(math.ceil(d * math.log(L / (beta_slow * 2 * math.pi)) / (2 * math.log(theta))),
               d // 2 - 1)
    freqs = []
    for i in range(d // 2):
        f = theta ** (-2 * i / d)
        gamma = min(max((i - low) / max(high - low, 0.001), 0.0), 1.0)
        freqs.append(f * ((1 - gamma) + gamma / s))
    return torch.tensor(freqs, dtype=torch.float64)


@pytest.mark.parametrize("d, theta, scaling", [
    (64, 1e6, MINIMIND_YARN),                                   # MiniMind2 with its YaRN dict
    (32, 1e6, {**MINIMIND_YARN, "original_max_position_embeddings": 256, "factor": 8}),
    (16, 1e4, {**MINIMIND_YARN, "original_max_position_embeddings": 512, "factor": 4,
               "beta_fast": 16, "beta_slow": 2, "attention_factor": 1.2}),
    (128, 5e5, {**MINIMIND_YARN, "factor": 2.5}),
    # theta 100: the ramp would end at pair 12, past the last pair 7: MiniMind's clamp
    (16, 100.0, {**MINIMIND_YARN, "original_max_position_embeddings": 4096, "factor": 2}),
])
def test_yarn_tables_match_the_formula(d, theta, scaling):
    max_pos = int(scaling["original_max_position_embeddings"] * scaling["factor"])
    want = yarn_from_the_issue(d, theta, scaling["factor"],
                               scaling["original_max_position_embeddings"],
                               scaling["beta_fast"], scaling["beta_slow"])
    freqs, attention_factor = rope_frequencies(d, theta, max_pos, scaling)
    # float32 frequencies vs float64 Python: ~1e-7 relative
    torch.testing.assert_close(freqs.double(), want, rtol=1e-6, atol=0)
    assert attention_factor == scaling["attention_factor"]
    cos, sin = rope_tables(d, max_pos, theta, scaling)
    for pos in (0, 1, 777, max_pos - 1):
        angles = torch.cat((want, want)) * pos
        # the fp32 angle pos * f_i (<= pos radians) is off by a few float32 ulps (1.2e-7
        # relative, from f_i and from the product), and cos/sin move by as much: 4 ulps of pos
        tol = 1e-6 + 4.8e-7 * pos
        torch.testing.assert_close(cos[pos].double(), angles.cos() * attention_factor,
                                   atol=tol, rtol=0)
        torch.testing.assert_close(sin[pos].double(), angles.sin() * attention_factor,
                                   atol=tol, rtol=0)


def test_scaling_only_applies_beyond_the_original_length():
    plain, _ = rope_frequencies(32, 1e6)
    for kind in ("linear", "ntk", "yarn"):
        scaling = {"type": kind, "factor": 8, "original_max_position_embeddings": 256}
        assert torch.equal(rope_frequencies(32, 1e6, 256, scaling)[0], plain)
        assert not torch.equal(rope_frequencies(32, 1e6, 257, scaling)[0], plain)


def hf_frequencies(rope_type, d, theta, max_pos, **params):
    config = LlamaConfig(hidden_size=d * 4, num_attention_heads=4, head_dim=d,
                         max_position_embeddings=max_pos,
                         rope_parameters={"rope_type": rope_type, "rope_theta": theta, **params})
    return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=params.pop("seq_len", None))


@pytest.mark.parametrize("d, theta, original, factor", [
    (64, 1e6, 2048, 16), (32, 1e6, 256, 8), (16, 1e4, 512, 4), (128, 5e5, 4096, 2),
])
def test_tables_equal_transformers_where_the_definitions_coincide(d, theta, original, factor):
    max_pos = original * factor
    base = {"factor": factor, "original_max_position_embeddings": original}
    # linear (PI): transformers' "linear" is the same f / s
    ours, _ = rope_frequencies(d, theta, max_pos, {"type": "linear", **base})
    theirs, _ = hf_frequencies("linear", d, theta, max_pos, factor=float(factor))
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)  # float32 pow: rounding only
    # YaRN: transformers' "yarn" with MiniMind's explicit attention_factor 1.0 (its default is
    # the paper's 0.1 ln s + 1); the ramp's upper clamp (D - 1 there, D/2 - 1 here) is not hit
    yarn = {"beta_fast": 32, "beta_slow": 1, "attention_factor": 1.0}
    ours, our_factor = rope_frequencies(d, theta, max_pos, {"type": "yarn", **base, **yarn})
    theirs, their_factor = hf_frequencies("yarn", d, theta, max_pos, **base, **yarn)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
    assert our_factor == their_factor == 1.0
    _, paper_factor = hf_frequencies("yarn", d, theta, max_pos, **base)
    assert paper_factor == pytest.approx(0.1 * math.log(factor) + 1)  # where MiniMind differs
    # NTK-aware: transformers' "dynamic" with factor 1 at seq_len = s * max_position_embeddings
    # computes base * s**(d / (d - 2)), our static NTK base for factor s
    ours, _ = rope_frequencies(d, theta, max_pos, {"type": "ntk", **base})
    theirs, _ = hf_frequencies("dynamic", d, theta, original, factor=1.0, seq_len=max_pos)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=0)


def test_ntk_keeps_the_fastest_pair_and_interpolates_the_slowest_by_s():
    plain, _ = rope_frequencies(32, 1e4)
    ntk, _ = rope_frequencies(32, 1e4, 4096, {"type": "ntk", "factor": 8,
                                               "original_max_position_embeddings": 512})
    assert ntk[0] == plain[0]
    assert (plain[-1] / ntk[-1]).item() == pytest.approx(8 ** (30 / 30), rel=1e-4)


def scaled_config(scaling, **kw):
    return MiniMindConfig(vocab_size=50, hidden_size=64, num_hidden_layers=2,
                          num_attention_heads=4, max_position_embeddings=64, rope_theta=1e4,
                          rope_scaling=scaling, **kw)


@pytest.mark.parametrize("kind", ["yarn", "linear"])
def test_scaled_rope_model_equals_transformers_llama(kind):
    scaling = {"type": kind, "factor": 4, "original_max_position_embeddings": 16}
    if kind == "yarn":
        scaling["attention_factor"] = 0.9  # also check that cos/sin carry the factor
    torch.manual_seed(0)
    ours = MiniMindForCausalLM(scaled_config(scaling)).eval()
    theirs = to_hf(ours, attn_implementation="eager").eval()
    ids = torch.randint(0, 50, (2, 60))
    # fp32, same operations: rounding only (~1e-6)
    torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, atol=1e-4, rtol=1e-4)
    assert from_hf(theirs).config == ours.config


@pytest.mark.parametrize("config, message", [
    (MiniMindConfig(hidden_size=64, num_attention_heads=4, use_moe=True), "use_moe=True"),
    (MiniMindConfig(hidden_size=64, num_attention_heads=4, position_encoding="alibi"),
     "position_encoding='alibi'"),
    (MiniMindConfig(hidden_size=64, num_attention_heads=4, position_encoding="none"),
     "position_encoding='none'"),
    (scaled_config({"type": "ntk", "factor": 4, "original_max_position_embeddings": 16}),
     "type 'ntk'"),
    # theta 100, head_dim 16, L 4096: the ramp would end at pair 12 > D/2 - 1 = 7, where
    # transformers (clamping at D - 1) and MiniMind (at D/2 - 1) disagree
    (MiniMindConfig(vocab_size=50, hidden_size=64, num_attention_heads=4, rope_theta=100.0,
                    max_position_embeddings=8192, num_hidden_layers=1,
                    rope_scaling={"type": "yarn", "factor": 2,
                                  "original_max_position_embeddings": 4096}), "differs from ours"),
])
def test_to_hf_refuses_what_llama_cannot_express(config, message):
    with pytest.raises(ValueError, match=message):
        to_hf(MiniMindForCausalLM(config))


@pytest.mark.parametrize("scaling, message", [
    ({"type": "dynamic"}, "choose one of linear, ntk, yarn"),
    ({"type": "yarn", "mscale": 1}, "unknown to type 'yarn'"),
    ({"type": "linear", "factor": 0.5}, "must be >= 1"),
    ({"type": "yarn", "beta_fast": "32"}, "beta_fast'] must be a positive number"),
    ([("type", "yarn")], "must be a dict or None"),
])
def test_rope_scaling_validation(scaling, message):
    with pytest.raises(ValueError, match=message):
        scaled_config(scaling)


def test_rope_scaling_needs_rope_and_position_encoding_is_checked():
    with pytest.raises(ValueError, match="rope_scaling needs position_encoding='rope'"):
        MiniMindConfig(position_encoding="alibi", rope_scaling={"type": "yarn"})
    with pytest.raises(ValueError, match="choose one of rope, alibi, none"):
        MiniMindConfig(position_encoding="absolute")


def test_config_round_trip_fills_minimind_yarn_defaults(tmp_path):
    config = scaled_config({"type": "yarn"})
    assert config.rope_scaling == MINIMIND_YARN
    assert MiniMindConfig.from_dict(config.to_dict()) == config
    alibi = scaled_config(None, position_encoding="alibi")
    model = MiniMindForCausalLM(alibi).eval()
    loaded = load_model(save_model(model, tmp_path / "alibi"))
    assert loaded.config.position_encoding == "alibi"
    ids = torch.randint(0, 50, (1, 12))
    assert torch.equal(loaded(ids).logits, model(ids).logits)


# --- ALiBi --------------------------------------------------------------------------------


@pytest.mark.parametrize("num_heads", [1, 2, 3, 4, 5, 6, 8, 12, 16, 20, 24, 32])
def test_alibi_slopes_equal_bloom(num_heads):
    bloom = build_alibi_tensor(torch.ones(1, 3), num_heads, torch.float32)  # (H, 1, 3)
    bloom_slopes = bloom[:, 0, 1]  # Bloom's bias is slope * key position: position 1
    # Bloom raises a float32 base to integer powers, we compute 2**(-8h/P) in float64 and
    # round once: at most a few float32 ulps apart
    torch.testing.assert_close(alibi_slopes(num_heads), bloom_slopes, rtol=1e-6, atol=0)


def test_alibi_bias_softmax_equals_bloom_plus_causal_mask():
    H, T = 6, 9
    scores = torch.randn(H, T, T)
    ours = torch.softmax(scores + alibi_bias(alibi_slopes(H), T, T), dim=-1)
    bloom = build_alibi_tensor(torch.ones(1, T), H, torch.float32)  # (H, 1, T): m_h * j
    causal = torch.full((T, T), float("-inf")).triu(1)
    # Bloom adds m_h * j, we add m_h * (j - i): they differ by m_h * i in each row, which
    # softmax ignores
    theirs = torch.softmax(scores + bloom + causal, dim=-1)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)


def reference_attention(attn: Attention, x, position_encoding):
    """softmax(q kᵀ / √d - m_h (i - j), causal) v from the weights: ALiBi, or no positions."""
    B, T, _ = x.shape
    H, Hkv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q = (x @ attn.q_proj.weight.T).view(B, T, H, D).transpose(1, 2)
    k = (x @ attn.k_proj.weight.T).view(B, T, Hkv, D).transpose(1, 2)
    v = (x @ attn.v_proj.weight.T).view(B, T, Hkv, D).transpose(1, 2)
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)  # (B, H, T, T)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    if position_encoding == "alibi":
        slopes = torch.tensor([2 ** (-8 * (h + 1) / H) for h in range(H)])  # H a power of 2
        scores = scores - slopes[:, None, None] * (i - j)
    scores = scores.masked_fill(j > i, float("-inf"))
    y = torch.softmax(scores, -1) @ v  # (B, H, T, D)
    return y.transpose(1, 2).reshape(B, T, H * D) @ attn.o_proj.weight.T


@pytest.mark.parametrize("use_sdpa", [True, False], ids=["sdpa", "manual"])
@pytest.mark.parametrize("position_encoding", ["alibi", "none"])
def test_attention_equals_the_reference(position_encoding, use_sdpa):
    config = MiniMindConfig(hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                            position_encoding=position_encoding)
    torch.manual_seed(0)
    attn = Attention(config, use_sdpa=use_sdpa).eval()
    x = torch.randn(2, 13, 64)
    y, _ = attn(x, None, None)
    # fp32, same sums in another order: ~1e-7
    torch.testing.assert_close(y, reference_attention(attn, x, position_encoding),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("use_sdpa", [True, False], ids=["sdpa", "manual"])
@pytest.mark.parametrize("position_encoding", ["alibi", "none"])
def test_kv_cache_and_generation_without_rope(position_encoding, use_sdpa):
    torch.manual_seed(0)
    model = MiniMindForCausalLM(scaled_config(None, position_encoding=position_encoding))
    model = model.eval().set_attention(use_sdpa)
    ids = torch.randint(0, 50, (2, 16))
    full = model(ids).logits
    out = model(ids[:, :7], use_cache=True)
    pieces, cache = [out.logits], out.past_key_values
    out = model(ids[:, 7:12], past_key_values=cache, use_cache=True)  # a chunk: bottom-right bias
    pieces, cache = pieces + [out.logits], out.past_key_values
    for t in range(12, 16):
        out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
        pieces, cache = pieces + [out.logits], out.past_key_values
    # the same attention rows computed in pieces: fp32 rounding only
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)
    prompt = ids[:, :5]
    assert torch.equal(model.generate(prompt, 10, temperature=0),
                       model.generate(prompt, 10, temperature=0, use_cache=False))


def test_alibi_and_nope_models_store_no_position_tables():
    for pe in ("alibi", "none"):
        model = MiniMindForCausalLM(scaled_config(None, position_encoding=pe))
        assert not hasattr(model.model, "rope_cos")
        assert set(model.state_dict()) == set(MiniMindForCausalLM(scaled_config(None)).state_dict())
    with pytest.raises(ValueError, match="longer than the model allows"):
        model(torch.zeros(1, 65, dtype=torch.long))


# --- minimind_lib.evaluation.long_context -----------------------------------------------------


def test_extend_keeps_the_weights_and_scaling_starts_past_the_training_length():
    torch.manual_seed(0)
    model = MiniMindForCausalLM(scaled_config(None)).eval()  # a RoPE model, table of 64
    ids = torch.randint(0, 50, (2, 32))
    longer = extend(model, 256)
    assert torch.equal(longer(ids).logits, model(ids).logits)  # same table prefix, same weights
    for name, scaling in rope_variants(64, 64).items():  # factor 1: not longer, so unscaled
        assert torch.equal(extend(model, 64, scaling)(ids).logits, model(ids).logits), name
    for name, scaling in rope_variants(16, 64).items():  # factor 4 from position 0 on
        if scaling is not None:
            scaled = extend(model, 64, scaling)(ids).logits
            assert not torch.allclose(scaled, model(ids).logits), name
    with pytest.raises(ValueError, match="rope_scaling needs position_encoding='rope'"):
        extend(MiniMindForCausalLM(scaled_config(None, position_encoding="alibi")), 128,
               rope_variants(64, 128)["RoPE + PI"])


def test_perplexity_by_length_scores_the_same_text_at_every_length():
    torch.manual_seed(0)
    model = MiniMindForCausalLM(scaled_config(None, position_encoding="alibi")).eval()
    tokens = torch.randint(0, 50, (70,))  # trimmed to 64 = a multiple of the longest length
    ppl = perplexity_by_length(model, tokens, [16, 32])
    windows = tokens[:64].view(4, 16)
    logits = model(windows).logits[:, :-1]
    want = F.cross_entropy(logits.reshape(-1, 50), windows[:, 1:].reshape(-1)).exp().item()
    assert ppl[16] == pytest.approx(want, rel=1e-5)
    by_position = loss_by_position(model, tokens, 32, bucket=8)
    assert by_position.shape == (3,)  # 31 predictions in buckets of 8
    with pytest.raises(ValueError, match="do not fill one window of 128"):
        perplexity_by_length(model, tokens, [128])
