"""LoRA (minimind_lib.training.lora): the layer against its formula, freezing, counts, merging,
PEFT's adapter format, and the real ``peft`` library applied to the Hugging Face export."""

from __future__ import annotations

import copy
import json
import math

import pytest
import safetensors.torch
import torch
from torch import nn

from minimind_lib.core.filenames import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from minimind_lib.course.profiles import get_profile, override
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
from minimind_lib.model.checkpoint import load_model, save_model
from minimind_lib.training.lora import (
    ATTENTION,
    MLP,
    LoRALinear,
    LoRASettings,
    adapter_state_dict,
    add_lora,
    count_parameters,
    finetune,
    load_adapter,
    lora_layers,
    merge_lora,
    optimizer_state_bytes,
    save_adapter,
)

CONFIG = MiniMindConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=64)


def _model(seed: int = 0) -> MiniMindForCausalLM:
    torch.manual_seed(seed)
    return MiniMindForCausalLM(CONFIG).eval()


def _trained_adapter(model: MiniMindForCausalLM, seed: int = 1, **shape) -> MiniMindForCausalLM:
    """``model`` with adapters whose B is random (as after training), so the update is not 0."""
    add_lora(model, **{"rank": 4, "alpha": 8.0, "target_modules": ATTENTION + MLP, **shape})
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=gen) * 0.1)
    return model


def _ids() -> torch.Tensor:
    return torch.randint(0, CONFIG.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))


# --- the layer -----------------------------------------------------------------------------


def test_lora_linear_is_the_formula_of_the_paper():
    torch.manual_seed(0)
    base = nn.Linear(12, 8, bias=True)
    layer = LoRALinear.from_linear(base, rank=3, alpha=6.0)
    nn.init.normal_(layer.lora_B)
    x = torch.randn(5, 12)
    W, b, A, B = base.weight, base.bias, layer.lora_A, layer.lora_B
    # h = W0 x + b + (alpha / r) B A x, written out (Hu et al. 2021, eq. 3)
    expected = x @ W.T + b + (6.0 / 3) * (x @ A.T) @ B.T
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-6)  # fp32, another order
    assert (A.shape, B.shape) == ((3, 12), (8, 3))


def test_a_new_adapter_changes_nothing_and_a_starts_like_nn_linear():
    torch.manual_seed(0)
    base = nn.Linear(64, 16, bias=False)
    layer = LoRALinear.from_linear(base, rank=8, alpha=16)
    x = torch.randn(4, 64)
    assert torch.equal(layer(x), base(x))  # B = 0: exactly the base layer
    assert torch.count_nonzero(layer.lora_B) == 0
    # Kaiming-uniform with a = sqrt(5): U(-1/sqrt(k), 1/sqrt(k)), as nn.Linear and PEFT
    bound = 1 / math.sqrt(64)
    assert layer.lora_A.abs().max() <= bound and layer.lora_A.abs().max() > 0.9 * bound


def test_at_the_start_only_b_gets_a_gradient():
    model = _model()
    add_lora(model, rank=4, alpha=8, target_modules=("q_proj",))
    model(_ids(), labels=_ids()).loss.backward()
    layer = lora_layers(model)["model.layers.0.self_attn.q_proj"]
    # dL/dA = s B^T (dL/dh) x^T = 0 while B = 0; dL/dB = s (dL/dh) (A x)^T is not
    assert torch.count_nonzero(layer.lora_A.grad) == 0
    assert torch.count_nonzero(layer.lora_B.grad) > 0
    assert all(p.grad is None for n, p in model.named_parameters() if "lora_" not in n)


# --- add_lora, counting --------------------------------------------------------------------


def test_add_lora_freezes_the_base_and_counts_r_times_d_plus_k():
    model = _model()
    total = model.num_parameters()
    names = add_lora(model, rank=4, alpha=8, target_modules=("q_proj", "v_proj", "down_proj"))
    assert len(names) == 3 * CONFIG.num_hidden_layers
    c, kv, inter = CONFIG.hidden_size, CONFIG.num_key_value_heads * CONFIG.head_dim, \
        CONFIG.intermediate_size
    per_layer = 4 * (c + c) + 4 * (c + kv) + 4 * (inter + c)
    counts = count_parameters(model)
    assert counts.trainable == per_layer * CONFIG.num_hidden_layers
    assert counts.total == total + counts.trainable
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(("lora_A", "lora_B")) for n in trainable)


def test_add_lora_refuses_unknown_targets_and_a_second_adapter():
    model = _model()
    with pytest.raises(ValueError, match="'w_proj' is not a projection"):
        add_lora(model, rank=4, alpha=8, target_modules=("w_proj",))
    with pytest.raises(ValueError, match="add_lora: rank must be a positive integer"):
        add_lora(model, rank=0, alpha=8)
    add_lora(model, rank=4, alpha=8)
    with pytest.raises(ValueError, match="already has LoRA layers"):
        add_lora(model, rank=4, alpha=8)


@pytest.mark.parametrize("name", ["cpu", "gpu"])
def test_the_profiles_adapters_train_at_most_2_percent_of_the_model(name):
    """The issue's budget: r = 8 with <= 2% trainable parameters (PEFT's count: adapters
    included in the total)."""
    profile = get_profile(name)
    settings = profile.lora
    model = MiniMindForCausalLM(profile.model)
    add_lora(model, rank=settings.rank, alpha=settings.alpha,
             target_modules=settings.target_modules)
    assert settings.rank == 8 and count_parameters(model).share <= 0.02


def test_target_modules_can_be_set_from_the_command_line():
    p = override(get_profile("smoke"), {"lora.target_modules": "q_proj, v_proj",
                                        "lora.rank": "4"})
    assert p.lora.target_modules == ("q_proj", "v_proj") and p.lora.rank == 4
    with pytest.raises(ValueError, match="'lm_head' is not a projection"):
        override(p, {"lora.target_modules": "lm_head"})
    with pytest.raises(ValueError, match="dropout must be in"):
        LoRASettings(dropout=1.0)


def test_adamw_keeps_state_for_the_adapters_only():
    def state_after_one_step(model):
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
        model(_ids(), labels=_ids()).loss.backward()
        optimizer.step()
        return optimizer_state_bytes(optimizer)

    full, adapted = _model(), _model()
    add_lora(adapted, rank=4, alpha=8)
    tensors = len([p for p in adapted.parameters() if p.requires_grad])
    # two fp32 moments per trainable value, plus one fp32 step counter per tensor
    assert state_after_one_step(adapted) == 8 * count_parameters(adapted).trainable + 4 * tensors
    assert state_after_one_step(full) == (8 * full.num_parameters()
                                          + 4 * len(list(full.parameters())))


# --- merging -------------------------------------------------------------------------------


def test_merged_model_gives_the_adapted_models_logits_and_is_a_plain_model(tmp_path):
    model = _trained_adapter(_model())
    ids = _ids()
    with torch.no_grad():
        adapted = model(ids).logits
        merge_lora(model)
        merged = model(ids).logits
    # the same sums in another order in fp32: differences of a few ulps of logits of size ~1
    torch.testing.assert_close(merged, adapted, rtol=1e-5, atol=1e-5)
    assert not lora_layers(model) and all(p.requires_grad for p in model.parameters())
    assert set(model.state_dict()) == set(_model().state_dict())
    save_model(model, tmp_path)
    assert torch.equal(load_model(tmp_path)(ids).logits, merged)  # strict load: a plain folder


def test_merged_weight_is_w0_plus_scaled_ba():
    model = _trained_adapter(_model())
    layer = lora_layers(model)["model.layers.1.mlp.down_proj"]
    expected = layer.weight + (8.0 / 4) * layer.lora_B @ layer.lora_A
    torch.testing.assert_close(layer.merged().weight, expected, rtol=0, atol=1e-6)


# --- PEFT's format -------------------------------------------------------------------------


def test_adapter_files_round_trip(tmp_path):
    model = _trained_adapter(_model(), target_modules=("q_proj", "o_proj", "up_proj"))
    save_adapter(model, tmp_path)
    config = json.loads((tmp_path / ADAPTER_CONFIG_FILE).read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"], config["target_modules"]) \
        == ("LORA", 4, 8.0, ["q_proj", "o_proj", "up_proj"])
    tensors = safetensors.torch.load_file(str(tmp_path / ADAPTER_WEIGHTS_FILE))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in tensors
    assert tensors.keys() == adapter_state_dict(model).keys()
    loaded = _model()
    load_adapter(loaded, tmp_path)
    ids = _ids()
    assert torch.equal(loaded(ids).logits, model(ids).logits)


def _write_config(folder, **changes):
    path = folder / ADAPTER_CONFIG_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_a_bad_adapter_folder_is_an_error_naming_the_file_and_field(tmp_path):
    save_adapter(_trained_adapter(_model()), tmp_path)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / ADAPTER_CONFIG_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=r"bad/adapter_config.json: not valid JSON"):
        load_adapter(_model(), tmp_path / "bad")
    _write_config(tmp_path, use_dora=True)
    with pytest.raises(ValueError, match=r"adapter_config.json: field 'use_dora' is True"):
        load_adapter(_model(), tmp_path)
    _write_config(tmp_path, use_dora=False, r=8)  # the weights have rank 4
    model = _model()
    with pytest.raises(ValueError, match=r"adapter_model.safetensors: .*lora_A.weight has shape"):
        load_adapter(model, tmp_path)
    assert not lora_layers(model)  # nothing half-loaded
    _write_config(tmp_path, r=4, target_modules=["q_proj"])
    with pytest.raises(ValueError, match=r"adapter_model.safetensors: missing \[\], unexpected"):
        load_adapter(_model(), tmp_path)


@pytest.fixture(scope="module")
def peft():
    return pytest.importorskip("peft", reason="peft is in the dev extra: pip install -e .[dev]")


def test_our_tensor_names_are_the_ones_peft_writes_for_a_llama(peft, tmp_path):
    from minimind_lib.model.hf import to_hf

    model = _trained_adapter(_model(), target_modules=("q_proj", "v_proj", "down_proj"))
    save_adapter(model, tmp_path / "ours")
    config = peft.LoraConfig.from_pretrained(str(tmp_path / "ours"))
    theirs = peft.get_peft_model(to_hf(_model()), config)
    theirs.save_pretrained(str(tmp_path / "theirs"))
    written = safetensors.torch.load_file(str(tmp_path / "theirs" / ADAPTER_WEIGHTS_FILE))
    ours = safetensors.torch.load_file(str(tmp_path / "ours" / ADAPTER_WEIGHTS_FILE))
    assert {k: v.shape for k, v in written.items()} == {k: v.shape for k, v in ours.items()}


def test_peft_applied_to_the_hf_export_gives_the_merged_models_logits(peft, tmp_path):
    """The issue's check: our adapter folder, loaded by the real ``peft`` onto
    ``to_hf(base)``, computes what our merged model computes."""
    from minimind_lib.model.hf import to_hf

    base = _model()
    model = _trained_adapter(copy.deepcopy(base))
    save_adapter(model, tmp_path)
    merged = merge_lora(copy.deepcopy(model))
    hf_lora = peft.PeftModel.from_pretrained(to_hf(base), str(tmp_path)).eval()
    ids = _ids()
    with torch.no_grad():
        theirs, ours = hf_lora(ids).logits, merged(ids).logits
        unmerged, before = model(ids).logits, base(ids).logits
    assert (theirs - before).abs().max() > 0.1  # the adapter changes the logits
    # fp32 throughout; PEFT adds the update unmerged (x W^T + s B(A x)), as our LoRALinear does,
    # and transformers' attention sums in its own order: agreement to ~1e-6 of logits of size
    # ~1, so 1e-5 leaves room for rounding and none for a wrong scale, name or transpose
    torch.testing.assert_close(theirs, unmerged, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
    # and PEFT's own merge gives our merged weights
    theirs_merged = hf_lora.merge_and_unload().state_dict()
    for name, weight in merged.state_dict().items():
        torch.testing.assert_close(theirs_merged[name], weight, rtol=0, atol=1e-6)


# --- the lora stage ------------------------------------------------------------------------


def test_lora_stage_writes_the_adapter_the_merged_model_and_the_scores(smoke_runs, tmp_path):
    import shutil

    from minimind_lib.__main__ import main
    from minimind_lib.course.report import write_report
    from minimind_lib.course.stages import read_marker
    from minimind_lib.evaluation.model_eval import read_eval

    root = tmp_path / "runs"
    shutil.copytree(smoke_runs, root)
    args = ["lora", "--profile", "smoke", "--out", str(root), "--no-progress",
            "--set", "lora.max_steps=6", "--set", "lora.eval_every=3",
            "--set", "lora.replay=0.25", "--set", "eval_per_task=2"]
    assert main(args) == 0
    first = safetensors.torch.load_file(str(root / "lora" / ADAPTER_WEIGHTS_FILE))
    torch.rand(7)  # whatever ran before in the process, the same run gives the same adapters
    assert main(args) == 0  # a named stage always runs (the first run moves to previous/)
    again = safetensors.torch.load_file(str(root / "lora" / ADAPTER_WEIGHTS_FILE))
    assert all(torch.equal(first[k], again[k]) for k in first)
    out = root / "lora"
    merged = load_model(out / "merged")
    assert (out / "merged" / "tokenizer.json").is_file()
    # the adapter files on the SFT model are the merged model
    sft = load_model(root / "sft")
    load_adapter(sft, out)
    ids = _ids()
    torch.testing.assert_close(sft(ids).logits, merged(ids).logits, rtol=1e-5, atol=1e-5)
    assert not torch.equal(load_model(root / "sft")(ids).logits, merged(ids).logits)
    evals = read_eval(out)
    assert list(evals) == ["sft", "lora"]
    for e in evals.values():
        assert {"digits_to_hanzi", "hanzi_to_digits", "arithmetic"} <= set(e.tasks)
    summary = read_marker(out)["summary"]
    assert summary["steps"] == 6 and summary["trainable_parameters"] == sum(
        t.numel() for t in safetensors.torch.load_file(str(out / ADAPTER_WEIGHTS_FILE)).values())
    assert json.loads((out / ADAPTER_CONFIG_FILE).read_text())["base_model_name_or_path"] \
        == str(root / "sft")
    report = write_report(root).read_text()  # an optional stage is reported once it ran
    assert "## LoRA" in report and "digits_to_hanzi" in report and "lora_loss.png" in report


def test_an_interrupted_lora_run_resumes_to_the_same_adapters(tmp_path):
    """Checkpoints hold the adapters (the model's state dict has them), so --resume works."""
    from minimind_lib.data.hanzi_codes import task_records
    from minimind_lib.tokenizer import load_tokenizer

    config = MiniMindConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                            num_key_value_heads=2, max_position_embeddings=128)
    tokenizer, records = load_tokenizer(), task_records("train", 40, seed=0)
    settings = LoRASettings(batch_size=4, seq_len=64, max_steps=6, warmup_steps=1, save_every=3,
                            eval_every=100, learning_rate=1e-2)

    def run(max_steps, resume):
        torch.manual_seed(0)
        model = MiniMindForCausalLM(config)
        add_lora(model, rank=2, alpha=4)
        finetune(model, tokenizer, records, settings, seed=0, out_dir=tmp_path / "run",
                 resume=resume, precision="fp32", progress=False,
                 callbacks=[_stop_after(max_steps)])
        return adapter_state_dict(model)

    with pytest.raises(KeyboardInterrupt):
        run(4, resume=False)  # killed after step 4: the last checkpoint is step 3
    resumed = run(None, resume=True)
    (tmp_path / "run").rename(tmp_path / "first")
    straight = run(None, resume=False)
    assert resumed.keys() == straight.keys()
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], rtol=0, atol=0)


def _stop_after(step):
    def callback(row):
        if step is not None and row["step"] == step:
            raise KeyboardInterrupt
    return callback
