"""The pipeline's tokenizer and pretrain stages, end to end on the bundled data (smoke profile)."""

import json
import math
import threading
from dataclasses import replace

import pytest
import torch

from minimind_lib import DATA_DIR
from minimind_lib.__main__ import main
from minimind_lib.core.filenames import MARKER_FILE
from minimind_lib.course import pipeline, stages
from minimind_lib.course.plotting import read_metrics
from minimind_lib.course.profiles import get_profile
from minimind_lib.model.checkpoint import load_model

pytestmark = pytest.mark.skipif(not (DATA_DIR / "tokenizer" / "tokenizer.json").is_file()
                                or not (DATA_DIR / "pretrain_sample.jsonl").is_file(),
                                reason="bundled tokenizer/data not built (make data)")


def test_pretrain_loss_falls_in_the_smoke_profile(smoke_runs):
    rows = read_metrics(smoke_runs / "pretrain")
    profile = get_profile("smoke")
    assert [r["step"] for r in rows] == list(range(1, profile.pretrain.max_steps + 1))
    start = sum(r["loss"] for r in rows[:5]) / 5
    end = sum(r["loss"] for r in rows[-5:]) / 5
    # starts near ln(6400) = 8.76 (uniform guess); 80 steps on real text must gain > 1 nat
    assert abs(start - math.log(profile.model.vocab_size)) < 0.5
    assert end < start - 1.0, (start, end)
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    assert len(val) == profile.pretrain.max_steps // profile.pretrain.eval_every
    assert val[-1] < val[0] and val[-1] < start - 1.0


def test_pretrain_output_is_a_model_folder(smoke_runs):
    out = smoke_runs / "pretrain"
    model = load_model(out)
    assert model.config == get_profile("smoke").model
    ids = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, temperature=0)
    assert ids.shape == (1, 7)
    marker = json.loads((out / MARKER_FILE).read_text())
    assert marker["summary"]["steps"] == 80 and marker["summary"]["val_windows"] > 0
    assert (smoke_runs / "tokenizer" / "tokenizer.json").read_bytes() == (
        DATA_DIR / "tokenizer" / "tokenizer.json").read_bytes()


def test_ensure_reuses_a_complete_stage(smoke_runs, monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("ensure retrained a complete stage")

    monkeypatch.setattr(stages, "train", no_training)
    assert pipeline.ensure("pretrain", "smoke", root=smoke_runs) == smoke_runs / "pretrain"


def test_changed_settings_make_a_stage_stale(smoke_runs):
    profile = get_profile("smoke")
    assert pipeline.is_complete("pretrain", profile, smoke_runs)
    longer = replace(profile, pretrain=replace(profile.pretrain, max_steps=81))
    assert not pipeline.is_complete("pretrain", longer, smoke_runs)


def test_a_failed_stage_leaves_no_marker(tmp_path, monkeypatch):
    def boom(ctx):
        (ctx.out_dir / "half.txt").write_text("partial")
        raise RuntimeError("killed")

    monkeypatch.setitem(stages.STAGES, "boom", stages.Stage("boom", boom))
    with pytest.raises(RuntimeError, match="killed"):
        pipeline.ensure("boom", "smoke", root=tmp_path)
    assert not (tmp_path / "boom" / MARKER_FILE).exists()
    assert not pipeline.is_complete("boom", get_profile("smoke"), tmp_path)


def test_a_second_process_waits_and_reuses_the_finished_stage(tmp_path, monkeypatch):
    fcntl = pytest.importorskip("fcntl")
    runs = []
    monkeypatch.setitem(stages.STAGES, "slow", stages.Stage("slow", lambda ctx: runs.append(1)))
    profile = get_profile("smoke")
    (tmp_path / "slow").mkdir()
    with open(tmp_path / ".slow.lock", "w") as held:  # "another process" runs the stage
        fcntl.flock(held, fcntl.LOCK_EX)
        waiter = threading.Thread(target=pipeline.ensure, args=("slow", profile),
                                  kwargs={"root": tmp_path})
        waiter.start()
        waiter.join(timeout=0.5)
        assert waiter.is_alive() and not runs  # blocked on the lock, not running the stage
        marker = {"run_id": "x", "fingerprint": pipeline.fingerprint("slow", profile, tmp_path)}
        (tmp_path / "slow" / MARKER_FILE).write_text(json.dumps(marker))
        fcntl.flock(held, fcntl.LOCK_UN)
    waiter.join()
    assert not runs  # it found the other process's finished output


def test_unknown_stage_lists_the_stages():
    with pytest.raises(ValueError, match="unknown stage 'sfft'; stages: tokenizer, pretrain"):
        pipeline.ensure("sfft", "smoke")


def test_cli_has_a_subcommand_per_stage(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in stages.STAGES)


def test_every_list_of_stages_is_the_registry(tmp_path):
    """The plan, the settings sections of a profile, ``all``, the fingerprints and the report
    take their stages from ``stages.STAGES``: a stage's settings are the Profile field it names,
    and registering one that names no field is refused."""
    from minimind_lib.course.plan import PLANNED_STAGES
    from minimind_lib.course.profiles import valid_keys
    from minimind_lib.course.report import write_report

    names, smoke = list(stages.STAGES), get_profile("smoke")
    assert list(PLANNED_STAGES) == [n for n in names if n in PLANNED_STAGES] == [
        "pretrain", "sft", "dpo"]
    assert [s.name for s in pipeline.stages_in_all()] == [
        n for n in names if stages.STAGES[n].in_all]
    keys = valid_keys(smoke)
    for st in stages.STAGES.values():
        if st.settings is not None:
            assert st.settings_in(smoke) is getattr(smoke, st.settings)
            assert any(k.startswith(f"{st.settings}.") for k in keys), st.name
    with pytest.raises(ValueError, match="settings 'nope' is not a Profile field"):
        stages.register("x", settings="nope")(lambda ctx: {})
    assert "x" not in stages.STAGES
    report = write_report(tmp_path).read_text()  # nothing ran: a section per stage of `all`
    titles = [s.title for s in pipeline.stages_in_all() if s.title]
    assert [line[3:] for line in report.splitlines() if line.startswith("## ")][1:] == titles


def test_a_damaged_input_stops_the_stage_before_its_finished_run_moves(smoke_runs, tmp_path,
                                                                         capsys):
    """Issue 49.5: a damaged tokenizer.json was named only after the finished pretrain had
    moved to previous/, leaving an unfinished pretrain/ that `runs` listed as done."""
    import shutil

    root = tmp_path / "runs"
    shutil.copytree(smoke_runs, root)
    marker = (root / "pretrain" / MARKER_FILE).read_text()
    (root / "tokenizer" / "tokenizer.json").write_text('{"model": {"vocab": ')
    assert main(["pretrain", "--profile", "smoke", "--out", str(root), "--no-progress"]) == 1
    err = capsys.readouterr().err  # the CLI reruns a stage on purpose: the case of the issue
    assert "tokenizer.json" in err and f"tokenizer --out {root}" in err
    assert (root / "pretrain" / MARKER_FILE).read_text() == marker  # the finished run, in place
    assert not (root / pipeline.PREVIOUS_DIR).exists()
    (root / "sft" / "config.json").write_text("{not json")
    (root / "tokenizer" / "tokenizer.json").write_bytes(
        (smoke_runs / "tokenizer" / "tokenizer.json").read_bytes())
    assert main(["dpo", "--profile", "smoke", "--out", str(root), "--no-progress"]) == 1
    assert "config.json" in capsys.readouterr().err
    assert not (root / "dpo").exists() and not (root / pipeline.PREVIOUS_DIR).exists()
