"""minimind_lib.model: shapes, errors, the two attention paths, the KV cache, RoPE, loss."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
from minimind_lib.model.decoder import causal_lm_loss
from minimind_lib.model.positions import apply_rope, rope_tables
from minimind_lib.model.sampling import sample_next_token

TINY = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)
CONFIGS = {
    "gqa": MiniMindConfig(**TINY),
    "mha": MiniMindConfig(**{**TINY, "num_key_value_heads": 4}),
    "mqa-untied": MiniMindConfig(**{**TINY, "num_key_value_heads": 1,
                                    "tie_word_embeddings": False}),
}


def make_model(config: MiniMindConfig, seed: int = 0) -> MiniMindForCausalLM:
    torch.manual_seed(seed)
    return MiniMindForCausalLM(config).eval()


def test_parameter_count_of_minimind2_small():
    model = MiniMindForCausalLM(MiniMindConfig())
    assert model.num_parameters() == 25_829_888
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied
    untied = MiniMindForCausalLM(MiniMindConfig(tie_word_embeddings=False, num_hidden_layers=1))
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight


def test_state_dict_uses_llama_names():
    keys = set(make_model(CONFIGS["gqa"]).state_dict())
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
            "model.layers.1.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight",
            "model.layers.0.input_layernorm.weight",
            "model.layers.0.post_attention_layernorm.weight"} <= keys
    assert not any("rope" in k for k in keys)  # RoPE tables are rebuilt, never stored


@pytest.mark.parametrize("kwargs, message", [
    (dict(hidden_size=100, num_attention_heads=8), "divisible by num_attention_heads"),
    (dict(num_attention_heads=8, num_key_value_heads=3), "divisible by num_key_value_heads"),
    (dict(vocab_size=0), "vocab_size must be positive"),
])
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MiniMindConfig(**kwargs)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_sdpa_path_equals_manual_path(name):
    model = make_model(CONFIGS[name])
    ids = torch.randint(0, 97, (3, 20))
    fast = model(ids).logits
    slow = model.set_attention(use_sdpa=False)(ids).logits
    # fp32; both compute the same sums in different orders: rounding is ~1e-7 relative
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("use_sdpa", [True, False])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_kv_cache_matches_full_recomputation(name, use_sdpa):
    model = make_model(CONFIGS[name]).set_attention(use_sdpa)
    ids = torch.randint(0, 97, (2, 16))
    full = model(ids).logits  # (B, T, V)
    # prefill 7, then a chunk of 5 (bottom-right causal mask), then 4 single tokens
    out = model(ids[:, :7], use_cache=True)
    pieces, cache = [out.logits], out.past_key_values
    for lo, hi in [(7, 12), (12, 13), (13, 14), (14, 15), (15, 16)]:
        out = model(ids[:, lo:hi], past_key_values=cache, use_cache=True)
        pieces.append(out.logits)
        cache = out.past_key_values
    assert cache[0][0].shape == (2, CONFIGS[name].num_key_value_heads, 16, 8)
    # fp32, same math on shorter matrices: only summation-order rounding differs
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_cached_and_uncached_generation_give_identical_tokens(name):
    model = make_model(CONFIGS[name], seed=1)
    prompt = torch.randint(0, 97, (2, 5))
    with_cache = model.generate(prompt, 30, temperature=0, use_cache=True)
    without = model.generate(prompt, 30, temperature=0, use_cache=False)
    assert with_cache.shape == (2, 35)
    assert torch.equal(with_cache, without)
    assert torch.equal(with_cache[:, :5], prompt)
    sampled = [model.generate(prompt, 20, temperature=0.8, top_k=20, top_p=0.9, use_cache=c,
                              generator=torch.Generator().manual_seed(3)) for c in (True, False)]
    assert torch.equal(sampled[0], sampled[1])


def test_generation_stops_at_eos_and_pads_finished_rows():
    model = make_model(CONFIGS["gqa"])
    prompt = torch.randint(0, 97, (3, 4))
    greedy = model.generate(prompt, 10, temperature=0)  # (3, 14)
    eos = int(greedy[0, 6])  # make row 0's 3rd new token the end-of-sequence id
    out = model.generate(prompt, 10, temperature=0, eos_token_id=eos)
    stops = []
    for row_out, row_greedy in zip(out, greedy, strict=True):
        hits = (row_greedy[4:] == eos).nonzero().flatten()
        stop = 4 + int(hits[0]) + 1 if len(hits) else 14  # length up to and incl. first eos
        stops.append(stop)
        assert torch.equal(row_out[:stop], row_greedy[:stop])
        assert (row_out[stop:] == eos).all()  # a finished row is filled with eos
    # decoding ends as soon as every row has finished
    assert out.shape[1] == max(stops) and stops[0] <= 7


@settings(max_examples=25, deadline=None)
@given(m=st.integers(0, 200), n=st.integers(0, 200), shift=st.integers(0, 300))
def test_rope_score_depends_only_on_relative_position(m, n, shift):
    cos, sin = rope_tables(head_dim=16, max_positions=512, theta=1e6)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)

    def score(i: int, j: int) -> torch.Tensor:
        qi = apply_rope(q, cos[i:i + 1], sin[i:i + 1])
        kj = apply_rope(k, cos[j:j + 1], sin[j:j + 1])
        return (qi * kj).sum()

    # fp32 angles up to ~500 rad: sin/cos rounding ~1e-5, a dot of 16 terms of size ~1
    torch.testing.assert_close(score(m, n), score(m + shift, n + shift), atol=1e-4, rtol=1e-4)


def test_loss_is_shifted_cross_entropy_with_ignore_index():
    model = make_model(CONFIGS["gqa"])
    ids = torch.randint(0, 97, (2, 10))
    labels = ids.clone()
    labels[0, :4] = -100
    out = model(ids, labels=labels, return_logits=True)
    logits = out.logits[:, :-1].reshape(-1, 97)
    target = labels[:, 1:].reshape(-1)
    keep = target != -100
    expected = F.cross_entropy(logits[keep], target[keep])
    torch.testing.assert_close(out.loss, expected)
    # untrained with std 0.02 weights: the logits are nearly flat, the loss about ln V
    assert abs(out.loss.item() - math.log(97)) < 0.05
    with pytest.raises(ValueError, match="labels shape"):
        causal_lm_loss(out.logits, labels[:, :5])


def test_loss_backpropagates_to_every_parameter():
    model = make_model(CONFIGS["mqa-untied"]).train()
    ids = torch.randint(0, 97, (2, 12))
    model(ids, labels=ids).loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_bad_inputs_give_clear_errors():
    model = make_model(CONFIGS["gqa"])
    with pytest.raises(ValueError, match=r"token id 97 is outside the vocabulary \[0, 97\)"):
        model(torch.tensor([[1, 97]]))
    with pytest.raises(ValueError, match="token id -1"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError, match="longer than the RoPE table"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="exceeds max_position_embeddings"):
        model.generate(torch.zeros(1, 60, dtype=torch.long), 10)
    with pytest.raises(ValueError, match=r"\(batch, seq_len\)"):
        model(torch.zeros(5, dtype=torch.long))


def test_sampling_respects_top_k_and_top_p():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]]).repeat(500, 1)
    g = torch.Generator().manual_seed(0)
    assert set(sample_next_token(logits, top_k=2, generator=g).tolist()) == {0, 1}
    # probabilities ~ .64 .24 .09 .03 .01: top_p 0.7 keeps the two best (0.64 < 0.7)
    assert set(sample_next_token(logits, top_p=0.7, generator=g).tolist()) == {0, 1}
    assert set(sample_next_token(logits, top_p=0.5, generator=g).tolist()) == {0}
    assert len(set(sample_next_token(logits, temperature=5.0, generator=g).tolist())) == 5
    with pytest.raises(ValueError, match="top_p"):
        sample_next_token(logits, top_p=0.0)


def test_bf16_autocast_forward_runs():
    model = make_model(CONFIGS["gqa"])
    ids = torch.randint(0, 97, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids, labels=ids, return_logits=True)
    assert out.logits.dtype == torch.bfloat16 and out.loss.dtype == torch.float32
    assert torch.isfinite(out.loss)
