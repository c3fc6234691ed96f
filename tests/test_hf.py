"""minimind_lib.model.hf: MiniMind equals transformers' Llama (logits, generation, files)."""

import json
import os

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"  # never reach the network, even by accident

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from minimind_lib import DATA_DIR  # noqa: E402
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM  # noqa: E402
from minimind_lib.model.decoder import attention_maps
from minimind_lib.model.hf import (  # noqa: E402
    from_hf,
    from_pretrained,
    load_pretrained,
    save_pretrained,
    to_hf,
)

BASE = dict(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128)
CONFIGS = {
    "gqa-tied": MiniMindConfig(**BASE),
    "mha-untied": MiniMindConfig(**{**BASE, "num_key_value_heads": 4,
                                    "tie_word_embeddings": False}),
    "mqa-3layers": MiniMindConfig(**{**BASE, "num_key_value_heads": 1, "num_hidden_layers": 3,
                                     "rope_theta": 1e4, "rms_norm_eps": 1e-6}),
    "wide-heads": MiniMindConfig(**{**BASE, "hidden_size": 96, "num_attention_heads": 3,
                                    "num_key_value_heads": 1, "intermediate_size": 200}),
}


def make_model(config: MiniMindConfig, seed: int = 0) -> MiniMindForCausalLM:
    torch.manual_seed(seed)
    model = MiniMindForCausalLM(config).eval()
    with torch.no_grad():  # non-trivial norm weights, so a misplaced norm would show
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_equal_llama(name, attn):
    ours = make_model(CONFIGS[name])
    theirs = to_hf(ours, attn_implementation=attn)
    ids = torch.randint(0, 300, (2, 40))
    with torch.no_grad():
        a, b = ours(ids, labels=ids, return_logits=True), theirs(ids, labels=ids)
    # fp32: same operations, same order up to kernel choice; 1e-4 absolute on logits of
    # size ~1 leaves room only for float rounding (we measure ~1e-6), not for a wrong op
    assert (a.logits - b.logits).abs().max().item() < 1e-4
    torch.testing.assert_close(a.loss, b.loss, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["gqa-tied", "mha-untied"])
def test_greedy_generation_equals_transformers(name):
    ours = make_model(CONFIGS[name], seed=2)
    theirs = to_hf(ours)
    prompt = torch.randint(3, 300, (1, 6))
    mine = ours.generate(prompt, 40, temperature=0)
    ref = theirs.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    assert torch.equal(mine, ref)


def test_from_hf_round_trip_and_unsupported_configs():
    ours = make_model(CONFIGS["mha-untied"])
    back = from_hf(to_hf(ours))
    assert back.config == ours.config
    for (k, v), (k2, v2) in zip(ours.state_dict().items(), back.state_dict().items(),
                                strict=True):
        assert k == k2 and torch.equal(v, v2)
    theirs = to_hf(ours)
    theirs.config.mlp_bias = True
    with pytest.raises(ValueError, match="mlp_bias=True"):
        from_hf(theirs)


def write_tiny_tokenizer(folder) -> None:
    """A small byte-level BPE with the course's special tokens and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>",
                                  "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world, hello minimind"] * 20, trainer)
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                "{% endif %}")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": template}))


def test_save_pretrained_loads_with_auto_classes(tmp_path):
    ours = make_model(CONFIGS["gqa-tied"])
    write_tiny_tokenizer(tmp_path / "tok")
    folder = save_pretrained(ours, tmp_path / "hf", tokenizer_dir=tmp_path / "tok")
    assert {"config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= {p.name for p in folder.iterdir()}
    hf_model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    ids = torch.randint(0, 300, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(hf_model(ids).logits, ours(ids).logits, atol=1e-4, rtol=0)
    assert torch.equal(from_pretrained(folder)(ids).logits, ours(ids).logits)
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    text = tok.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_tokens_to_ids("<|im_end|>") == 2
    # saving again replaces the folder atomically; no staging folders are left behind
    save_pretrained(ours, folder, tokenizer_dir=None)
    assert not (folder / "tokenizer.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "tok"]


def test_serving_loads_a_transformers_folder_as_it_loads_a_stage_folder(tmp_path):
    """``loading.load_for_serving`` (serve, chat, bench) opens the transformers export of a
    model and its stage folder to the same logits, each with the tokenizer beside it."""
    from minimind_lib.inference.loading import load_for_serving
    from minimind_lib.model.checkpoint import save_model

    ours = make_model(CONFIGS["gqa-tied"])
    write_tiny_tokenizer(tmp_path / "tok")
    folder = save_pretrained(ours, tmp_path / "hf", tokenizer_dir=tmp_path / "tok")
    save_model(ours, tmp_path / "stage")
    (tmp_path / "stage" / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
    ids = torch.randint(0, 300, (1, 12))
    with torch.no_grad():
        (hf, tok_hf), (stage, tok_stage) = (load_for_serving(d, "cpu")
                                            for d in (folder, tmp_path / "stage"))
        assert torch.equal(hf(ids).logits, stage(ids).logits)
    assert len(tok_hf) == len(tok_stage) and not hf.training


def test_save_pretrained_with_missing_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="lacks tokenizer.json, tokenizer_config.json"):
        save_pretrained(make_model(CONFIGS["gqa-tied"]), tmp_path / "hf",
                        tokenizer_dir=tmp_path / "nothing")
    assert not (tmp_path / "hf").exists()


def test_save_pretrained_with_the_course_tokenizer(tmp_path):
    tok_dir = DATA_DIR / "tokenizer"
    if not (tok_dir / "tokenizer.json").is_file():
        pytest.skip(f"{tok_dir}/tokenizer.json not built yet (notebook 01 / tokenizer stage)")
    config = MiniMindConfig(**{**BASE, "vocab_size": 6400})
    folder = save_pretrained(make_model(config), tmp_path / "hf", tokenizer_dir=tok_dir)
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert tok.decode(tok("hello, MiniMind")["input_ids"]) == "hello, MiniMind"
    assert tok.chat_template


def test_attention_maps_equal_llama_eager_attentions():
    ours = make_model(CONFIGS["gqa-tied"])
    theirs = to_hf(ours, attn_implementation="eager")
    ids = torch.randint(0, 300, (2, 24))
    with torch.no_grad():
        ref = torch.stack(theirs(ids, output_attentions=True).attentions)  # (L, B, H, T, T)
    maps = attention_maps(ours, ids)
    # probabilities in [0, 1] from the same fp32 ops: rounding only
    torch.testing.assert_close(maps, ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:-1]))


# --- MiniMind-3: QK-norm, the pi width, Qwen3's layout -------------------------------------


def test_presets_have_minimind_parameter_counts():
    from minimind_lib.model import preset

    counts = {"minimind2-small": 25_829_888, "minimind2": 104_030_976,
              "minimind2-moe": 145_029_760, "minimind-3": 63_912_192,
              "minimind-3-moe": 198_416_640}
    for name, count in counts.items():
        with torch.device("meta"):
            assert MiniMindForCausalLM(preset(name)).num_parameters() == count, name
    m3 = preset("minimind-3")
    assert (m3.intermediate_size, m3.head_dim, m3.rms_norm_eps) == (2432, 96, 1e-6)
    with pytest.raises(ValueError, match="unknown preset 'minimind-4'; presets: minimind2-small"):
        preset("minimind-4")


def _minimind3(seed: int = 0, **overrides) -> MiniMindForCausalLM:
    """A small MiniMind-3 (QK-norm) with norm weights moved off 1, so the norms matter."""
    config = MiniMindConfig(**{"hidden_size": 64, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "num_key_value_heads": 2,
                               "qk_norm": True, "intermediate_rule": "pi",
                               "rms_norm_eps": 1e-6, "max_position_embeddings": 128,
                               **overrides})
    model = make_model(config, seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model


@pytest.mark.parametrize("head_dim", [None, 32])  # the quotient, and one Qwen3 allows beside it
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_minimind3_gives_qwen3s_logits(head_dim, attn):
    from transformers import Qwen3ForCausalLM

    ours = _minimind3(head_dim=head_dim)
    theirs = to_hf(ours, attn)
    assert isinstance(theirs, Qwen3ForCausalLM) and theirs.config.head_dim == ours.config.head_dim
    ids = torch.randint(0, ours.config.vocab_size, (2, 19),
                        generator=torch.Generator().manual_seed(1))
    for training in (False, True):  # dropout 0: train mode computes the same
        ours.train(training)
        theirs.train(training)
        # tolerance: the same fp32 ops in the same order; 1e-5 allows SDPA's kernel choice
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, rtol=0, atol=1e-5)
    back = from_hf(theirs)
    assert back.config.qk_norm and back.config.head_dim == ours.config.head_dim
    torch.testing.assert_close(back.eval()(ids).logits, ours.eval()(ids).logits, rtol=0, atol=0)


def _folder_and_pth(ours: MiniMindForCausalLM, tmp_path) -> list[MiniMindForCausalLM]:
    """``ours`` saved as MiniMind exports it (a transformers folder) and as its trainer writes
    it (a ``.pth``), each loaded back with ``ours``' exact logits: the two loaded models."""
    ids = torch.randint(0, ours.config.vocab_size, (1, 12),
                        generator=torch.Generator().manual_seed(2))
    to_hf(ours).save_pretrained(tmp_path / "export")
    torch.save(ours.state_dict(), tmp_path / "minimind3.pth")
    loaded = [load_pretrained(tmp_path / "export"), load_pretrained(tmp_path / "minimind3.pth")]
    for model in loaded:
        torch.testing.assert_close(model(ids).logits, ours(ids).logits, rtol=0, atol=0)
    return loaded


def test_load_pretrained_reads_minimind3_as_qwen3_folder_and_pth(tmp_path):
    folder, pth = _folder_and_pth(_minimind3().eval(), tmp_path)
    assert folder.config.qk_norm and folder.config.rms_norm_eps == 1e-6
    # heads and head_dim off the shapes
    assert pth.config.qk_norm and pth.config.head_dim == 16 and pth.config.intermediate_size == 256


def _minimind3_moe(top_k: int = 1, seed: int = 0) -> MiniMindForCausalLM:
    """A small MiniMind-3-MoE (Qwen3-MoE's layer: no shared expert, the top-k renormalised)."""
    return _minimind3(seed, use_moe=True, n_routed_experts=4, num_experts_per_tok=top_k,
                      n_shared_experts=0, router_aux_loss_coef=5e-4, intermediate_size=96)


def _router_logits(model: MiniMindForCausalLM, ids: torch.Tensor) -> list[torch.Tensor]:
    """Each MoE layer's router logits (B*T, E) for ``ids``, read off ``mlp.gate``."""
    seen = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, a, out: seen.append(out))
             for layer in model.model.layers]
    try:
        model(ids)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def _minimind3_aux(logits: list[torch.Tensor], top_k: int, coef: float) -> torch.Tensor:
    """MiniMind-3's load-balancing loss written out (model_minimind.py, MOEFeedForward): per
    layer, E * sum_e (share of the batch's choices on e) * (mean probability of e), times the
    coefficient, summed over layers."""
    total = torch.zeros(())
    for layer in logits:
        scores = torch.softmax(layer.float(), dim=-1)  # (N, E)
        chosen = scores.topk(top_k, dim=-1).indices  # (N, k)
        load = torch.nn.functional.one_hot(chosen, scores.shape[-1]).float().mean(0)  # (k, E)
        total = total + (load * scores.mean(0)).sum() * scores.shape[-1] * coef
    return total


@pytest.mark.parametrize("top_k", [1, 2])
def test_minimind3_moe_gives_qwen3_moes_logits_and_routing(top_k):
    from transformers import Qwen3MoeForCausalLM
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    ours = _minimind3_moe(top_k)
    theirs = to_hf(ours)
    assert isinstance(theirs, Qwen3MoeForCausalLM)
    ids = torch.randint(0, ours.config.vocab_size, (2, 19),
                        generator=torch.Generator().manual_seed(1))
    for training in (False, True):
        ours.train(training)
        theirs.train(training)
        out = theirs(ids, output_router_logits=True)
        torch.testing.assert_close(ours(ids).logits, out.logits, rtol=0, atol=1e-5)
        routers = _router_logits(ours, ids)
        for mine, hf in zip(routers, out.router_logits, strict=True):
            torch.testing.assert_close(mine, hf, rtol=0, atol=1e-6)
        # the aux losses: both from the same routers, each by its own definition
        torch.testing.assert_close(out.aux_loss, load_balancing_loss_func(
            tuple(routers), 4, top_k), rtol=1e-6, atol=0)
        torch.testing.assert_close(ours(ids).aux_loss, _minimind3_aux(routers, top_k, 5e-4),
                                   rtol=1e-5, atol=0)
    back = from_hf(theirs)
    assert back.config == ours.config
    torch.testing.assert_close(back.eval()(ids).logits, ours.eval()(ids).logits, rtol=0, atol=0)


def test_load_pretrained_reads_minimind3_moe_folder_and_pth(tmp_path):
    ours = _minimind3_moe().eval()
    folder, pth = _folder_and_pth(ours, tmp_path)
    assert folder.config == ours.config
    assert (pth.config.num_experts_per_tok, pth.config.router_aux_loss_coef,
            pth.config.n_shared_experts) == (1, 5e-4, 0)
    with pytest.raises(ValueError, match="MiniMind2's MoE as a Qwen3-MoE"):
        to_hf(make_model(MiniMindConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                        num_attention_heads=4, use_moe=True, qk_norm=True)))


def test_minimind3_config_json_and_minimind2s_unchanged(tmp_path):
    from minimind_lib.course.profiles import get_profile, override
    from minimind_lib.model.checkpoint import load_model, save_model

    assert set(MiniMindConfig().to_dict()).isdisjoint({"qk_norm", "head_dim",
                                                        "intermediate_rule"})
    model = _minimind3(head_dim=32)
    save_model(model, tmp_path / "m3")
    saved = json.loads((tmp_path / "m3" / "config.json").read_text())
    assert saved["qk_norm"] is True and saved["head_dim"] == 32
    assert saved["intermediate_rule"] == "pi"
    loaded = load_model(tmp_path / "m3")
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(loaded(ids).logits, model.eval()(ids).logits, rtol=0, atol=0)
    wider = override(get_profile("smoke"), {"model.hidden_size": "128"}).model
    assert wider.head_dim == 128 // wider.num_attention_heads  # derived again, not kept at 16
