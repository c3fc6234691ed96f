"""Checkpoints: model folders round-trip, writes are atomic, loading is strict."""

import json

import pytest
import torch

from minimind_lib.core.atomic import atomic_path
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM, checkpoint
from minimind_lib.model.checkpoint import (
    CheckpointMismatchError,
    latest_checkpoint,
    load_checkpoint,
    load_model,
    save_checkpoint,
    save_model,
)

CONFIG = MiniMindConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=64)


def model(config: MiniMindConfig = CONFIG, seed: int = 0) -> MiniMindForCausalLM:
    torch.manual_seed(seed)
    return MiniMindForCausalLM(config)


def test_save_load_model_round_trip(tmp_path):
    m = model()
    save_model(m, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text()) == CONFIG.to_dict()  # flat fields
    loaded = load_model(tmp_path)
    x = torch.randint(0, 64, (2, 10))
    torch.testing.assert_close(loaded(x).logits, m.eval()(x).logits, rtol=0, atol=0)
    # the tie survives the round trip (safetensors stores the shared tensor once)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()


def test_loading_into_another_config_is_an_error(tmp_path):
    save_model(model(), tmp_path)
    bigger = model(MiniMindConfig(**{**CONFIG.to_dict(), "hidden_size": 64}))
    with pytest.raises(CheckpointMismatchError, match="model.safetensors does not fit the model"):
        checkpoint.load_weights(bigger, tmp_path / "model.safetensors")
    state = {"step": 1}
    ckpt = save_checkpoint(tmp_path / "run", 1, model(), state)
    with pytest.raises(CheckpointMismatchError, match=r"another model config.*hidden_size"):
        load_checkpoint(ckpt, bigger)


def test_missing_or_unexpected_tensors_are_errors(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    checkpoint.save_weights(net, tmp_path / "w.safetensors")
    deeper = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2),
                                 torch.nn.Linear(2, 2))
    with pytest.raises(CheckpointMismatchError, match="2.weight"):
        checkpoint.load_weights(deeper, tmp_path / "w.safetensors")
    with pytest.raises(CheckpointMismatchError, match="1.weight"):
        checkpoint.load_weights(torch.nn.Sequential(torch.nn.Linear(4, 4)),
                                tmp_path / "w.safetensors")


def test_config_json_with_unknown_field_is_an_error(tmp_path):
    save_model(model(), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "n_experts": 4}))
    with pytest.raises(ValueError,
                       match=r"config.json: unknown MiniMindConfig field\(s\): n_experts"):
        load_model(tmp_path)


def test_atomic_write_keeps_old_content_on_failure(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half-writ")
        raise RuntimeError("killed")
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]  # the temporary file is gone


def test_a_crash_while_saving_leaves_the_previous_checkpoint_loadable(tmp_path, monkeypatch):
    m = model()
    save_checkpoint(tmp_path, 10, m, {"step": 10})
    trained = model(seed=1)

    def crash(tmp_dir):  # all files written, the rename not yet done
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 20, trained, {"step": 20}, write_hook=crash)

    # a crash inside the weights write itself: safetensors has written part of the file
    real_save = checkpoint.safetensors.torch.save_model

    def partial_write(module, filename, **kwargs):
        real_save(module, filename, **kwargs)
        with open(filename, "r+b") as f:
            f.truncate(100)
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.safetensors.torch, "save_model", partial_write)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 30, trained, {"step": 30})
    monkeypatch.undo()

    latest = latest_checkpoint(tmp_path)
    assert latest.name == "step_0000010"
    fresh = model(seed=2)
    assert load_checkpoint(latest, fresh)["step"] == 10
    for k, v in m.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v)
    # the next successful save clears the crashed saves' leftovers and the old checkpoint
    save_checkpoint(tmp_path, 40, trained, {"step": 40})
    assert (sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
            == ["latest", "step_0000040"])


def test_keep_several_checkpoints(tmp_path):
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model(), {"step": step}, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert names == ["step_0000002", "step_0000003"]
    assert latest_checkpoint(tmp_path).name == "step_0000003"


def test_no_checkpoint_gives_none(tmp_path):
    assert latest_checkpoint(tmp_path) is None


def test_a_libraries_disk_full_error_is_named_with_the_path_whatever_space_is_left(tmp_path):
    """Issue 49.6: ``export --format hf`` on a full disk said ``SafetensorError ... No space
    left on device`` naming no path (the partial file was gone, so the disk looked free)."""
    import errno

    from minimind_lib.core.atomic import disk_full_named

    class SafetensorError(Exception):
        pass

    target = tmp_path / "hf"
    with pytest.raises(OSError) as e, disk_full_named(target):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: "
                              "StorageFull, message: \"No space left on device\" })")
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(target)
    with pytest.raises(ValueError, match="unrelated"), disk_full_named(target):
        raise ValueError("unrelated")


def test_a_device_problem_is_not_called_a_checkpoint_mismatch(tmp_path, monkeypatch):
    """Issue 49.9: 'pin_memory=True requires a CUDA device' came back as a mismatch."""
    import safetensors.torch

    from minimind_lib.model.checkpoint import CheckpointMismatchError, load_weights

    model = MiniMindForCausalLM(MiniMindConfig(vocab_size=16, hidden_size=16,
                                               num_hidden_layers=1, num_attention_heads=2,
                                               num_key_value_heads=1))
    save_model(model, tmp_path / "m")

    def no_cuda(*args, **kwargs):
        raise RuntimeError("Attempted to set pin_memory=True, which requires a CUDA device")

    monkeypatch.setattr(safetensors.torch, "load_model", no_cuda)
    with pytest.raises(RuntimeError, match="could not be placed on cuda") as e:
        load_weights(model, tmp_path / "m" / "model.safetensors", device="cuda")
    assert not isinstance(e.value, CheckpointMismatchError)
