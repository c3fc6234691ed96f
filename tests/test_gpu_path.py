"""The GPU student's path, tested on the CPU: budgets sized to the data (plan), overrides and
run_config.json, the full profile's refusal without data, downloads from a local hub cache,
MiniMind's own weight formats, and activation checkpointing's memory and gradients."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from minimind_lib import REPO_ROOT
from minimind_lib.__main__ import main
from minimind_lib.course.profiles import get_profile, load_config, override, valid_keys
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
from minimind_lib.training import TrainConfig, TrainSettings, train
from minimind_lib.training.memory import activation_bytes, measure_saved_bytes, per_sequence

TINY = MiniMindConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=2, max_position_embeddings=32768)


# --- plan: budgets fit the data present ----------------------------------------------------


@pytest.mark.parametrize("name", ["smoke", "cpu", "gpu"])
def test_plan_json_reads_the_bundled_data_at_most_ten_times(name, capsys, monkeypatch):
    monkeypatch.delenv("MINIMIND_DATA_DIR", raising=False)
    assert main(["plan", "--profile", name, "--json", "--no-cpu-probe"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["stages"]) == {"pretrain", "sft", "dpo"}
    for stage, s in result["stages"].items():
        assert {"tokens_planned", "tokens_available", "passes", "steps"} <= set(s)
        assert 0 < s["passes"] <= 10, (stage, s["passes"])
        assert s["steps"] > 0 and s["tokens_available"] > 0 and not s["estimated"]
        # the planned steps are what the engine will run on the same data
        settings = getattr(get_profile(name), stage)
        if stage == "pretrain":
            assert s["steps"] == settings.planned_steps(s["examples_available"])


def test_gpu_budget_is_in_passes_capped_by_steps():
    s = get_profile("gpu").pretrain
    per_pass = 2000 // s.batch_size
    assert s.planned_steps(2000) == s.epochs * per_pass  # small data: passes decide
    assert s.planned_steps(10**9) == s.max_steps  # big data: the time cap decides


def test_train_resolves_epochs_into_steps():
    dataset = [{"input_ids": torch.tensor([1, 2, 3, 4]), "labels": torch.tensor([1, 2, 3, 4])}] * 12
    torch.manual_seed(0)
    model = MiniMindForCausalLM(TINY)
    config = TrainConfig(batch_size=4, seq_len=4, max_steps=None, epochs=2.5, warmup_steps=1,
                         precision="fp32", device="cpu", progress=False)
    rows = train(model, dataset, config)
    assert [r["step"] for r in rows] == list(range(1, 9))  # ceil(2.5 passes x 3 steps)
    with pytest.raises(ValueError, match="needs a budget"):
        TrainSettings(max_steps=None)


# --- overrides and the run record -------------------------------------------------------------


def test_set_runs_three_steps_and_records_them(tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["pretrain", "--profile", "smoke", "--out", str(out), "--no-progress",
                 "--set", "pretrain.max_steps=3", "--set", "pretrain.eval_every=1"]) == 0
    rows = [json.loads(line) for line in (out / "pretrain" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    record = json.loads((out / "pretrain" / "run_config.json").read_text())
    assert record["settings"]["max_steps"] == 3 and "pretrain.max_steps=3" in record["overrides"]
    assert record["model"] == get_profile("smoke").model.to_dict()
    assert "[plan] 3 steps" in capsys.readouterr().out  # the stage logs its plan first


def test_a_misspelt_key_lists_the_valid_ones_without_a_traceback():
    result = subprocess.run(
        [sys.executable, "-m", "minimind_lib", "pretrain", "--profile", "smoke",
         "--set", "pretrain.max_step=3"], capture_output=True, text=True, cwd=REPO_ROOT,
        timeout=120)
    assert result.returncode == 1
    assert "unknown setting 'pretrain.max_step'" in result.stderr
    assert "max_steps" in result.stderr and "Traceback" not in result.stderr


def test_override_types_and_errors():
    smoke = get_profile("smoke")
    p = override(smoke, {"train.gradient_checkpointing": "yes", "dpo.beta": "0.5",
                         "pretrain.max_examples": "none", "sft.betas": "0.9,0.99",
                         "model.hidden_size": "128", "seed": "7"})
    assert p.train.gradient_checkpointing and p.dpo.beta == 0.5 and p.seed == 7
    assert p.pretrain.max_examples is None and p.sft.betas == (0.9, 0.99)
    assert p.model.intermediate_size == MiniMindConfig(hidden_size=128,
                                                       num_attention_heads=4).intermediate_size
    for bad, message in [({"pretrain.learning_rate": "nan"}, "finite"),
                         ({"pretrain.batch_size": "2.5"}, "integer"),
                         ({"pretrain.batch_size": "0"}, "must be positive"),
                         ({"bogus.x": "1"}, "sections: model, pretrain"),
                         ({"dpo.beta": "-1"}, "beta must be positive")]:
        with pytest.raises(ValueError, match=message):
            override(smoke, bad)
    assert "train.gradient_checkpointing" in valid_keys(smoke)


def test_config_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("seed = 3\n[pretrain]\nmax_steps = 5\nlearning_rate = 1e-3\n"
                    "[train]\ncompile = false\n")
    p = override(get_profile("smoke"), load_config(path))
    assert (p.seed, p.pretrain.max_steps, p.pretrain.learning_rate) == (3, 5, 1e-3)
    path.write_text("[pretrain\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config(path)


def test_full_without_minimind_data_names_download(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MINIMIND_DATA_DIR", str(tmp_path / "empty"))
    assert main(["pretrain", "--profile", "full", "--out", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: profile full:") and "download data" in err
    assert not (tmp_path / "runs").exists()  # refused before anything started


def test_minimind3_profile_is_minimind3s_zero_recipe(tmp_path, monkeypatch, capsys):
    from minimind_lib.model import preset

    profile = get_profile("minimind3")
    assert profile.model == preset("minimind-3") and profile.needs_minimind_data
    assert (profile.pretrain.seq_len, profile.sft.seq_len) == (768, 768)
    assert (profile.pretrain.epochs, profile.sft.epochs, profile.sft.learning_rate) == (1, 1, 1e-5)
    monkeypatch.setenv("MINIMIND_DATA_DIR", str(tmp_path / "empty"))
    assert main(["sft", "--profile", "minimind3", "--out", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert "has no sft_t2t_mini.jsonl" in err and "download data" in err
    assert not (tmp_path / "runs").exists()


# --- download, offline from a hub cache the test builds ---------------------------------------


def _hub_cache(root: Path, repo: str, repo_type: str, files: dict[str, bytes]) -> None:
    """The layout huggingface_hub reads: <type>s--owner--name/{refs/main, snapshots/<commit>/}."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    folder = root / f"{repo_type}s--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    for name, content in files.items():
        target = folder / "snapshots" / commit / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def _minimind_files() -> dict[str, bytes]:
    """Small files in exactly MiniMind's current formats: bundled lines with the course's
    extra keys dropped, and MiniMind's documented tool-use SFT line."""
    from minimind_lib import DATA_DIR
    from tests.test_data_validation import MINIMIND_LINES

    def jsonl(records) -> bytes:
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()

    def head(name, n):
        with open(DATA_DIR / name, encoding="utf-8") as f:
            return [json.loads(line) for _, line in zip(range(n), f, strict=False)]

    texts = [{"text": r["text"]} for r in head("pretrain_sample.jsonl", 400)]
    chats = [{"conversations": r["conversations"]} for r in head("sft_sample.jsonl", 200)]
    return {"pretrain_t2t_mini.jsonl": jsonl(texts),
            "sft_t2t_mini.jsonl": jsonl(MINIMIND_LINES["sft"] + chats),
            "dpo.jsonl": jsonl(MINIMIND_LINES["dpo"]), "rlaif.jsonl": jsonl(MINIMIND_LINES["rl"]),
            "agent_rl.jsonl": jsonl(MINIMIND_LINES["agent_rl"]),
            "agent_rl_math.jsonl": jsonl(MINIMIND_LINES["agent_rl"][1:])}


def test_download_data_offline_from_the_hub_cache(tmp_path, monkeypatch, capsys):
    """MiniMind's current file names through a local hub cache: the quick set by default, a set
    or names by --files; then pretrain and sft train on what came (smoke budgets)."""
    files = _minimind_files()
    _hub_cache(tmp_path / "hub", "jingyaogong/minimind_dataset", "dataset", files)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = tmp_path / "data"
    assert main(["download", "data", "--to", str(data)]) == 0
    out = capsys.readouterr().out
    assert "4 file(s)" in out and "local hub cache" in out and "MINIMIND_DATA_DIR=" in out
    assert sorted(p.name for p in data.iterdir()) == [
        "dpo.jsonl", "pretrain_t2t_mini.jsonl", "rlaif.jsonl", "sft_t2t_mini.jsonl"]
    assert main(["download", "data", "--files", "agent", "--to", str(data)]) == 0
    one = str(tmp_path / "one")
    assert main(["download", "data", "--files", "agent_rl_math", "--to", one]) == 0
    assert [p.name for p in (tmp_path / "one").iterdir()] == ["agent_rl_math.jsonl"]
    for name, content in files.items():
        assert (data / name).read_bytes() == content
    capsys.readouterr()
    assert main(["download", "data", "--files", "minimind2", "--to", str(tmp_path / "old")]) == 1
    assert "pretrain_hq.jsonl, sft_mini_512.jsonl of jingyaogong/minimind_dataset not in the " \
           "local hub cache" in capsys.readouterr().err
    assert main(["download", "data", "--files", "sft_512"]) == 1
    assert "unknown data file(s) sft_512.jsonl" in capsys.readouterr().err
    assert main(["download", "model", "--files", "mini"]) == 1

    monkeypatch.setenv("MINIMIND_DATA_DIR", str(data))
    runs = tmp_path / "runs"
    assert main(["sft", "--profile", "smoke", "--out", str(runs), "--set", "pretrain.max_steps=4",
                 "--set", "sft.max_steps=4", "--set", "eval_per_task=2"]) == 0
    sft = json.loads((runs / "sft" / "stage.json").read_text())["summary"]
    # 204 lines: the 200 bundled chats, the plain and inline-think MiniMind lines and the two
    # tool-use lines, all rendered in MiniMind-3's format (the course tokenizer reserves its
    # markers); none is left out as unrenderable
    assert sft["unrenderable"] == 0 and sft["examples"] + sft["skipped"] == 204
    pretrain = json.loads((runs / "pretrain" / "stage.json").read_text())
    assert pretrain["summary"]["steps"] == 4


def test_download_model_offline_then_load_it(tmp_path, monkeypatch):
    from minimind_lib.core import download
    from minimind_lib.model.hf import load_pretrained, to_hf

    torch.manual_seed(0)
    ours = MiniMindForCausalLM(TINY).eval()
    export = tmp_path / "export"
    to_hf(ours).save_pretrained(export)
    _hub_cache(tmp_path / "hub", "jingyaogong/MiniMind2-Small", "model",
               {p.name: p.read_bytes() for p in export.iterdir()})
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    artifact = replace(download.ARTIFACTS["model"], default_dir=tmp_path / "models" / "default")
    monkeypatch.setitem(download.ARTIFACTS, "model", artifact)
    loaded = load_pretrained("jingyaogong/MiniMind2-Small")  # a hub id: download, then load
    assert (tmp_path / "models" / "MiniMind2-Small" / "config.json").is_file()
    ids = torch.randint(0, TINY.vocab_size, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, ours(ids).logits, rtol=0, atol=1e-5)


def test_download_model_by_name_offline_minimind3(tmp_path, monkeypatch, capsys):
    """``download model --name minimind-3`` from a hub cache holding a Qwen3 export (MiniMind-3's
    format), then ``load_pretrained`` on the folder it wrote: the same logits."""
    from minimind_lib.core import download
    from minimind_lib.model.hf import load_pretrained, to_hf

    torch.manual_seed(0)
    ours = MiniMindForCausalLM(replace(TINY, qk_norm=True, intermediate_rule="pi",
                                       rms_norm_eps=1e-6)).eval()
    to_hf(ours).save_pretrained(tmp_path / "export")
    _hub_cache(tmp_path / "hub", "jingyaogong/minimind-3", "model",
               {p.name: p.read_bytes() for p in (tmp_path / "export").iterdir()})
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    artifact = replace(download.ARTIFACTS["model"], default_dir=tmp_path / "models" / "default")
    monkeypatch.setitem(download.ARTIFACTS, "model", artifact)
    assert main(["download", "model", "--name", "minimind-3"]) == 0
    assert "jingyaogong/minimind-3:" in capsys.readouterr().out
    folder = tmp_path / "models" / "minimind-3"
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    ids = torch.randint(0, TINY.vocab_size, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(load_pretrained(folder)(ids).logits, ours(ids).logits,
                                   rtol=0, atol=1e-5)
    with pytest.raises(SystemExit):  # argparse names the choices
        main(["download", "model", "--name", "minimind-4"])


# --- MiniMind's weights in our model ------------------------------------------------------------


def test_load_pretrained_minimind_formats(tmp_path):
    """MiniMind's .pth (fp16 state dict, Llama names) and its Llama export (transformers):
    logits equal to the original. fp16 files: exactly the fp32 model with fp16-rounded
    weights; an fp32 export: within 1e-5 (float rounding of the same computation)."""
    transformers = pytest.importorskip("transformers")
    from minimind_lib.model.hf import load_pretrained, to_hf

    torch.manual_seed(0)
    ours = MiniMindForCausalLM(TINY).eval()
    rounded = MiniMindForCausalLM(TINY).eval()
    rounded.load_state_dict({k: v.half().float() for k, v in ours.state_dict().items()})
    torch.save({k: v.half() for k, v in ours.state_dict().items()}, tmp_path / "full_sft_64.pth")
    to_hf(ours).half().save_pretrained(tmp_path / "fp16")
    to_hf(ours).save_pretrained(tmp_path / "fp32")
    ids = torch.randint(0, TINY.vocab_size, (2, 16))
    with torch.no_grad():
        want, want16 = ours(ids).logits, rounded(ids).logits
        theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "fp16",
                                                               dtype=torch.float32)(ids).logits
        pth = load_pretrained(tmp_path / "full_sft_64.pth")
        assert pth.config == TINY  # inferred from the shapes (8 heads: MiniMind's default)
        torch.testing.assert_close(pth(ids).logits, want16, rtol=0, atol=0)
        torch.testing.assert_close(load_pretrained(tmp_path / "fp16")(ids).logits, theirs,
                                   rtol=0, atol=1e-4)
        torch.testing.assert_close(load_pretrained(tmp_path / "fp32")(ids).logits, want,
                                   rtol=0, atol=1e-5)


def test_load_pretrained_rejects_what_it_cannot_load(tmp_path):
    from minimind_lib.model.hf import load_pretrained

    torch.save({"model.embed_tokens.weight": torch.zeros(4, 8)}, tmp_path / "bad.pth")
    with pytest.raises(ValueError, match="not a MiniMind / Llama state dict"):
        load_pretrained(tmp_path / "bad.pth")
    torch.save({"x": object()}, tmp_path / "pickle.pth")
    with pytest.raises(ValueError, match="safely"):
        load_pretrained(tmp_path / "pickle.pth")
    with pytest.raises(FileNotFoundError, match="Hub repo id"):
        load_pretrained(tmp_path / "missing")


# --- activation checkpointing ----------------------------------------------------------------


def test_checkpointing_keeps_a_third_of_the_activations_at_512_tokens():
    """MiniMind2-Small at 512 tokens: bytes kept for backward per sequence, measured with
    saved-tensor hooks, and the memory model's count (equal, byte for byte)."""
    model = MiniMindForCausalLM(MiniMindConfig())
    full = per_sequence(lambda b: measure_saved_bytes(model, b, 512))
    model.gradient_checkpointing_enable()
    kept = per_sequence(lambda b: measure_saved_bytes(model, b, 512))
    assert kept <= 0.35 * full, (kept, full)
    assert full == activation_bytes(MiniMindConfig(), 1, 512)
    assert kept == activation_bytes(MiniMindConfig(), 1, 512, checkpointing=True)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_memory_model_equals_the_measurement(precision, checkpointing):
    config = MiniMindConfig(vocab_size=512, hidden_size=96, num_hidden_layers=3,
                            num_attention_heads=6, num_key_value_heads=2)
    model = MiniMindForCausalLM(config)
    if checkpointing:
        model.gradient_checkpointing_enable()
    dtype = torch.bfloat16 if precision == "bf16" else None
    measured = per_sequence(lambda b: measure_saved_bytes(model, b, 64, precision=dtype))
    assert measured == activation_bytes(config, 1, 64, precision, checkpointing)


def test_checkpointing_gives_identical_training():
    """Same seed, same data: every metrics row of a run with checkpointing equals the run
    without (fp32 on the CPU recomputes bit for bit)."""
    dataset = [{"input_ids": torch.randint(0, 300, (33,)), "labels": None} for _ in range(16)]
    for item in dataset:
        item["labels"] = item["input_ids"]
    runs = []
    for flag in (False, True):
        torch.manual_seed(0)
        model = MiniMindForCausalLM(TINY)
        config = TrainConfig(batch_size=4, seq_len=32, max_steps=4, warmup_steps=1,
                             precision="fp32", device="cpu", progress=False,
                             gradient_checkpointing=flag)
        runs.append(([(r["loss"], r["grad_norm"]) for r in train(model, dataset, config)],
                     model.state_dict()))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(runs[0][1][k], runs[1][1][k]) for k in runs[0][1])


def test_gpu_check_runs_end_to_end_in_its_dry_run():
    """benchmarks/gpu_check.py has never met a GPU here: its --dry-run walks every part (speed
    rows, AMP ratios, real steps) with a tiny model on the CPU, so the prepared script works
    the day a GPU is lent."""
    result = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry-run"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| gpu bf16+ckpt |" in result.stdout and "AMP claim, measured" in result.stdout
    assert "real steps of the gpu profile" in result.stdout


def test_checkpointing_keeps_the_moe_load_balancing_gradient():
    """A MoE layer keeps its aux loss on itself during forward; rerunning the block in
    backward must not lose that loss's gradient (non-reentrant checkpointing keeps it)."""
    import copy

    torch.manual_seed(0)
    model = MiniMindForCausalLM(replace(TINY, use_moe=True, max_position_embeddings=128))
    twin = copy.deepcopy(model).gradient_checkpointing_enable()
    ids = torch.randint(0, TINY.vocab_size, (2, 32))
    for m in (model, twin):
        m.train()
        m(ids, labels=ids).loss.backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), twin.parameters(),
                                                           strict=True))
    assert model.model.layers[0].mlp.gate.weight.grad.abs().sum() > 0


def test_load_pretrained_minimind_moe_pth(tmp_path):
    """MiniMind's MoE .pth (its parameter names: mlp.gate, mlp.experts.N, mlp.shared_experts.N):
    the experts are counted from the tensors and the logits equal the original's."""
    from minimind_lib.model.hf import load_pretrained

    config = replace(TINY, use_moe=True, n_routed_experts=3, n_shared_experts=1)
    torch.manual_seed(0)
    ours = MiniMindForCausalLM(config).eval()
    torch.save(ours.state_dict(), tmp_path / "full_sft_64_moe.pth")
    loaded = load_pretrained(tmp_path / "full_sft_64_moe.pth")
    assert loaded.config == config
    ids = torch.randint(0, config.vocab_size, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, ours(ids).logits, rtol=0, atol=0)


# --- issue 49.7: download without a network, or to a place that is not a folder --------------


def test_download_refuses_a_destination_that_is_not_a_folder_before_fetching(tmp_path, capsys,
                                                                               monkeypatch):
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError("the network was touched")

    monkeypatch.setattr(socket, "create_connection", no_network)
    afile = tmp_path / "passwd"
    afile.write_text("root:x:0:0\n")
    assert main(["download", "model", "--to", str(afile)]) == 1
    assert "a file is there, not a folder" in capsys.readouterr().err
    assert main(["download", "model", "--to", str(afile / "sub")]) == 1
    assert "is not a folder" in capsys.readouterr().err


def test_download_without_a_network_fails_at_once_saying_how_to_work_offline(tmp_path, capsys,
                                                                             monkeypatch):
    import socket

    def no_dns(address, timeout=None):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(socket, "create_connection", no_dns)
    assert main(["download", "model", "--repo", "no-such-owner/x", "--to",
                 str(tmp_path / "m")]) == 1
    err = capsys.readouterr().err
    assert "cannot reach huggingface.co (Name or service not known)" in err
    assert "HF_HUB_OFFLINE=1" in err and "Traceback" not in err
