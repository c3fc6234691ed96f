"""Mixture of experts (minimind_lib.model.moe.MoEFeedForward, notebook 11): logits and the
auxiliary loss against an independent reference written here from MiniMind's formulas, train
vs eval mode, the one-expert model equals the dense one, MiniMind's parameter names, and the
aux loss reaching the training loss and the metrics log."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
from minimind_lib.model.checkpoint import load_model, save_model
from minimind_lib.model.decoder import causal_lm_loss
from minimind_lib.model.moe import MoEFeedForward, expert_load, load_balancing_loss
from minimind_lib.training import TrainConfig, train

TINY = dict(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, intermediate_size=48)
MOE_SETTINGS = {
    "minimind-defaults": dict(),  # 4 experts, top-2, 1 shared, renormalised, per sequence
    "top1-no-shared": dict(num_experts_per_tok=1, n_shared_experts=0),
    "top3-of-6-two-shared-raw-batch": dict(n_routed_experts=6, num_experts_per_tok=3,
                                           n_shared_experts=2, norm_topk_prob=False,
                                           seq_aux=False, aux_loss_alpha=0.1),
    "all-experts": dict(n_routed_experts=3, num_experts_per_tok=3),
}


def moe_config(**overrides) -> MiniMindConfig:
    return MiniMindConfig(**{**TINY, "use_moe": True, **overrides})


def make_model(config: MiniMindConfig, seed: int = 0) -> MiniMindForCausalLM:
    torch.manual_seed(seed)
    model = MiniMindForCausalLM(config)
    with torch.no_grad():  # a sharper router than the 0.02 init, so routing really varies
        for layer in model.model.layers:
            if isinstance(layer.mlp, MoEFeedForward):
                layer.mlp.gate.weight.normal_(0, 0.5)
    return model


# --- the reference: MiniMind's MoE written from its formulas, every expert on every token ----


def swiglu(x, ffn):
    return F.linear(F.silu(F.linear(x, ffn.gate_proj.weight)) * F.linear(x, ffn.up_proj.weight),
                    ffn.down_proj.weight)


def reference_moe(x, layer: MoEFeedForward, k, norm_topk_prob, alpha, seq_aux):
    """(output, aux loss) of one MoE layer for x (B, T, C), computed densely: every expert
    runs on every token and is weighted 0 unless chosen; the aux loss counts with Python
    loops over the chosen experts."""
    B, T, _ = x.shape
    probs = torch.softmax(x @ layer.gate.weight.T, dim=-1)  # (B, T, E)
    n_experts = probs.shape[-1]
    top_p, top_i = probs.topk(k, dim=-1)
    if k > 1 and norm_topk_prob:
        top_p = top_p / top_p.sum(-1, keepdim=True)
    dense_w = torch.zeros_like(probs).scatter(-1, top_i, top_p)  # (B, T, E), 0 = not chosen
    y = sum(dense_w[..., e:e + 1] * swiglu(x, layer.experts[e]) for e in range(n_experts))
    y = y + sum((swiglu(x, shared) for shared in layer.shared_experts), torch.zeros_like(x))
    groups = [[b] for b in range(B)] if seq_aux else [list(range(B))]
    per_group = []
    for rows in groups:
        tokens = len(rows) * T
        counts = [sum(int((top_i[b] == e).sum()) for b in rows) for e in range(n_experts)]
        mean_p = probs[rows].reshape(tokens, n_experts).mean(0)
        # fraction of the tokens routed to e, times E / k: 1 for every expert when balanced
        f = [counts[e] / tokens * n_experts / k for e in range(n_experts)]
        per_group.append(sum(f[e] * mean_p[e] for e in range(n_experts)))
    return y, alpha * sum(per_group) / len(per_group)


class ReferenceMoE(nn.Module):
    def __init__(self, layer: MoEFeedForward, config: MiniMindConfig):
        super().__init__()
        self.layer, self.config, self.aux_loss = layer, config, None

    def forward(self, x):
        c = self.config
        y, self.aux_loss = reference_moe(x, self.layer, c.num_experts_per_tok, c.norm_topk_prob,
                                         c.aux_loss_alpha, c.seq_aux)
        return y


def reference_model(model: MiniMindForCausalLM) -> MiniMindForCausalLM:
    ref = copy.deepcopy(model)
    for layer in ref.model.layers:
        layer.mlp = ReferenceMoE(layer.mlp, model.config)
    return ref


@pytest.mark.parametrize("train_mode", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", sorted(MOE_SETTINGS))
def test_moe_logits_and_aux_loss_equal_the_reference(name, train_mode):
    model = make_model(moe_config(**MOE_SETTINGS[name])).train(train_mode)
    ref = reference_model(model).train(train_mode)
    ids = torch.randint(0, 61, (3, 17))
    out = model(ids, labels=ids, return_logits=True)
    want_logits = ref(ids).logits
    want_aux = sum(layer.mlp.aux_loss for layer in ref.model.layers)
    # fp32; the library sums the same k + shared expert outputs in another order and runs each
    # expert on a subset of rows: rounding ~1e-7, a wrong weight or expert shows as >1e-2
    torch.testing.assert_close(out.logits, want_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.aux_loss, want_aux, atol=1e-6, rtol=1e-5)
    ce = causal_lm_loss(want_logits, ids)
    # training minimises CE + aux (as MiniMind's trainer); eval reports the plain CE
    torch.testing.assert_close(out.loss, ce + want_aux if train_mode else ce,
                               atol=1e-5, rtol=1e-5)
    # without return_logits: the chunked head's loss, the same to fp32 rounding
    torch.testing.assert_close(model(ids, labels=ids).loss, out.loss, atol=1e-6, rtol=1e-5)


def test_routing_really_varies_in_these_tests():
    model = make_model(moe_config())
    load = expert_load(model, torch.randint(0, 61, (3, 17)))  # (L, E)
    assert load.shape == (2, 4) and load.sum(1).tolist() == [3 * 17 * 2] * 2
    assert (load > 0).all(), "every expert should get tokens, or the reference test is weak"


def test_train_and_eval_mode_give_identical_logits():
    model = make_model(moe_config())
    ids = torch.randint(0, 61, (2, 20))
    train_logits = model.train()(ids).logits
    eval_logits = model.eval()(ids).logits
    # one dispatch (sorted by expert) in both modes and dropout 0: the same float operations
    assert torch.equal(train_logits, eval_logits)


def test_one_expert_top1_no_shared_is_the_dense_model():
    dense = make_model(MiniMindConfig(**TINY)).eval()
    moe = make_model(moe_config(n_routed_experts=1, num_experts_per_tok=1,
                                n_shared_experts=0)).eval()
    state = {k.replace(".mlp.", ".mlp.experts.0."): v for k, v in dense.state_dict().items()}
    state.update({k: v for k, v in moe.state_dict().items() if k.endswith("mlp.gate.weight")})
    moe.load_state_dict(state, strict=True)
    ids = torch.randint(0, 61, (2, 24))
    # softmax over one expert is exactly 1.0: the same matmuls on the same rows, plus an exact
    # add to zeros, so the logits agree to the last bit in practice; 1e-6 allows a kernel's
    # different blocking of a gathered copy
    torch.testing.assert_close(moe(ids).logits, dense(ids).logits, atol=1e-6, rtol=0)
    # one expert always gets every slot with probability 1: f = 1, P = 1, per layer
    assert moe(ids).aux_loss.item() == pytest.approx(moe.config.aux_loss_alpha * 2)


def minimind_moe_keys(config: MiniMindConfig) -> dict[str, tuple[int, ...]]:
    """The state dict MiniMind's MoE model (model/model_minimind.py, MiniMind2) holds, written
    from its module names: MOEFeedForward.{gate (MoEGate.weight), experts, shared_experts}."""
    c, i, e = config.hidden_size, config.intermediate_size, config.n_routed_experts
    kv = config.num_key_value_heads * config.head_dim
    keys = {"model.embed_tokens.weight": (config.vocab_size, c), "model.norm.weight": (c,),
            "lm_head.weight": (config.vocab_size, c)}
    for n in range(config.num_hidden_layers):
        p = f"model.layers.{n}."
        keys |= {p + "input_layernorm.weight": (c,), p + "post_attention_layernorm.weight": (c,),
                 p + "self_attn.q_proj.weight": (c, c), p + "self_attn.k_proj.weight": (kv, c),
                 p + "self_attn.v_proj.weight": (kv, c), p + "self_attn.o_proj.weight": (c, c),
                 p + "mlp.gate.weight": (e, c)}
        experts = [f"experts.{j}" for j in range(e)]
        experts += [f"shared_experts.{j}" for j in range(config.n_shared_experts)]
        for x in experts:
            keys |= {f"{p}mlp.{x}.gate_proj.weight": (i, c), f"{p}mlp.{x}.up_proj.weight": (i, c),
                     f"{p}mlp.{x}.down_proj.weight": (c, i)}
    return keys


@pytest.mark.parametrize("name", sorted(MOE_SETTINGS))
def test_state_dict_has_minimind_moe_names_and_shapes(name):
    config = moe_config(**MOE_SETTINGS[name])
    ours = {k: tuple(v.shape) for k, v in make_model(config).state_dict().items()}
    assert ours == minimind_moe_keys(config)


def test_aux_loss_trains_the_router_and_alpha_zero_turns_it_off():
    model = make_model(moe_config()).train()
    ids = torch.randint(0, 61, (2, 16))
    model(ids).aux_loss.backward()
    gate_grad = model.model.layers[0].mlp.gate.weight.grad
    assert gate_grad is not None and gate_grad.abs().sum() > 0
    off = make_model(moe_config(aux_loss_alpha=0.0)).train()
    out = off(ids, labels=ids, return_logits=True)
    assert out.aux_loss.item() == 0.0
    assert out.loss.item() == pytest.approx(causal_lm_loss(out.logits, ids).item())


def test_load_balancing_loss_extremes():
    B, T, E, k = 2, 8, 4, 2
    uniform = torch.full((B, T, E), 1 / E)
    any_choice = torch.randint(0, E, (B, T, k))
    # uniform router probabilities: alpha, whatever the counts
    assert load_balancing_loss(uniform, any_choice, 0.5).item() == pytest.approx(0.5)
    # every token sends both slots to experts 0 and 1 with all the probability there: E / k
    collapsed = torch.zeros(B, T, E)
    collapsed[..., :2] = 0.5
    both = torch.tensor([0, 1]).expand(B, T, k)
    assert load_balancing_loss(collapsed, both, 1.0).item() == pytest.approx(E / k)


def test_empty_experts_still_get_a_gradient_for_ddp():
    # DDP needs every parameter in the graph on every rank: an expert without tokens runs on
    # zero rows, so its gradient is zero rather than missing
    model = make_model(moe_config(n_routed_experts=8, num_experts_per_tok=1))
    ids = torch.tensor([[1, 2]])
    model.train()(ids, labels=ids).loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    assert any(p.grad.abs().sum() == 0 for p in model.model.layers[0].mlp.experts.parameters())


def test_active_parameters_and_expert_load_errors():
    moe = make_model(moe_config())
    per_expert = 3 * 32 * 48
    assert moe.num_parameters() - moe.num_active_parameters() == 2 * 2 * per_expert
    dense = make_model(MiniMindConfig(**TINY))
    assert dense.num_active_parameters() == dense.num_parameters()
    with pytest.raises(ValueError, match="no MoE layers"):
        expert_load(dense, torch.tensor([[1]]))


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_experts_per_tok=5), "num_experts_per_tok"),
    (dict(n_routed_experts=0), "n_routed_experts must be positive"),
    (dict(n_shared_experts=-1), "n_shared_experts"),
    (dict(scoring_func="sigmoid"), "only 'softmax'"),
    (dict(aux_loss_alpha=-0.1), "aux_loss_alpha"),
])
def test_moe_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        moe_config(**kwargs)


def test_moe_checkpoint_round_trip_and_old_configs_still_load(tmp_path):
    model = make_model(moe_config(n_shared_experts=2)).eval()
    loaded = load_model(save_model(model, tmp_path / "moe"))
    assert loaded.config == model.config and loaded.config.use_moe
    ids = torch.randint(0, 61, (1, 9))
    assert torch.equal(loaded(ids).logits, model(ids).logits)
    old = {k: v for k, v in MiniMindConfig(**TINY).to_dict().items()
           if k in TINY or k in ("rope_theta", "rms_norm_eps", "dropout", "tie_word_embeddings")}
    assert MiniMindConfig.from_dict(old) == MiniMindConfig(**TINY)  # a config.json from before MoE
    assert MiniMindForCausalLM(MiniMindConfig()).num_parameters() == 25_829_888


class RandomTokens(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        ids = torch.randint(0, 61, (17,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def test_training_logs_aux_loss_and_minimises_ce_plus_aux():
    model = make_model(moe_config())
    config = TrainConfig(batch_size=4, seq_len=16, max_steps=3, warmup_steps=1, precision="fp32",
                         device="cpu", progress=False)
    rows = train(model, RandomTokens(), config)
    assert all(r["aux_loss"] > 0 for r in rows)
    # the logged loss is CE + aux (the training-mode loss); aux is ~alpha per layer
    assert all(r["loss"] > r["aux_loss"] for r in rows)
    assert rows[0]["aux_loss"] == pytest.approx(2 * 0.01, rel=0.5)
    dense_rows = train(make_model(MiniMindConfig(**TINY)), RandomTokens(), config)
    assert "aux_loss" not in dense_rows[0]
