"""Finished stages are never thrown away silently: fingerprints that survive moving the course
folder, decisions ``ensure`` prints, and rebuilds that keep the previous run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minimind_lib import REPO_ROOT
from minimind_lib.__main__ import main
from minimind_lib.core.filenames import MARKER_FILE
from minimind_lib.course.pipeline import PREVIOUS_DIR, differences, ensure, file_hash
from minimind_lib.course.stages import read_marker


def _clone(tmp_path: Path) -> Path:
    """A second copy of the course in another folder: the library and the bundled data."""
    clone = tmp_path / "second clone"
    shutil.copytree(REPO_ROOT / "minimind_lib", clone / "minimind_lib",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO_ROOT / "data", clone / "data",
                    ignore=shutil.ignore_patterns("minimind", "full"))
    return clone


def _ensure_in(clone: Path, stage: str, root: Path) -> str:
    """Run ``ensure(stage)`` with the clone's code and data, in its own process; its output."""
    code = ("from minimind_lib.course import pipeline; "
            f"pipeline.ensure({stage!r}, 'smoke', root={str(root)!r}, progress=False)")
    env = {**os.environ, "PYTHONPATH": str(clone), "OMP_NUM_THREADS": "1"}
    env.pop("MINIMIND_DATA_DIR", None)
    result = subprocess.run([sys.executable, "-c", code], cwd=clone, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _run_ids(root: Path) -> dict[str, str]:
    return {s: read_marker(root / s)["run_id"] for s in ("tokenizer", "pretrain", "sft")}


def test_a_second_clone_reuses_everything(smoke_runs, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(smoke_runs, root)
    before = _run_ids(root)
    out = _ensure_in(_clone(tmp_path), "sft", root)
    assert "[pipeline] stage" not in out, out  # nothing trained
    assert out.count("[pipeline] reusing") == 3, out  # tokenizer, pretrain, sft: each said so
    assert _run_ids(root) == before


def test_a_changed_data_file_is_named_and_the_old_model_kept(smoke_runs, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(smoke_runs, root)
    clone = _clone(tmp_path)
    path = clone / "data" / "sft_sample.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    first["conversations"][-1]["content"] += " (edited)"
    path.write_text("\n".join([json.dumps(first, ensure_ascii=False), *lines[1:]]) + "\n",
                    encoding="utf-8")
    old = read_marker(root / "sft")["run_id"]
    out = _ensure_in(clone, "sft", root)
    assert "'sft' must be rebuilt: data sft_sample.jsonl changed" in out, out
    assert "[pipeline] reusing 'pretrain'" in out
    kept = root / PREVIOUS_DIR / f"sft-{old[:8]}"
    assert (kept / "model.safetensors").is_file() and read_marker(kept)["run_id"] == old
    assert read_marker(root / "sft")["run_id"] != old


def test_the_number_of_evaluation_questions_is_in_the_fingerprint(smoke_runs, tmp_path):
    """``--set eval_per_task=N`` changes what a stage's eval.json measures, so a finished sft
    run scored on another number of questions is rebuilt, not reused with a stale eval.json
    (``sft.eval_per_task`` is no setting: the CLI refuses it, naming the valid keys). Stages
    that evaluate nothing keep their runs."""
    from minimind_lib.course.pipeline import fingerprint, is_complete
    from minimind_lib.course.profiles import get_profile, override

    root = tmp_path / "runs"
    shutil.copytree(smoke_runs, root)
    smoke = get_profile("smoke")
    fewer = override(smoke, {"eval_per_task": "3"})
    assert is_complete("sft", smoke, root) and not is_complete("sft", fewer, root)
    assert differences(fingerprint("sft", smoke, root), fingerprint("sft", fewer, root)) == [
        f"eval_per_task {smoke.eval_per_task} -> 3"]
    assert is_complete("pretrain", fewer, root) and is_complete("tokenizer", fewer, root)
    assert main(["sft", "--profile", "smoke", "--out", str(root),
                 "--set", "sft.eval_per_task=3"]) == 1  # a user error, named


def test_differences_name_each_change():
    old = {"settings": {"learning_rate": 1e-3, "betas": [0.9, 0.95]}, "seed": 42,
           "data": {"a.jsonl": "1", "b.jsonl": "2"}, "requires": {"pretrain": "abc"}}
    new = {"settings": {"learning_rate": 2e-3, "betas": [0.9, 0.95]}, "seed": 42,
           "data": {"a.jsonl": "1", "c.jsonl": "3"}, "requires": {"pretrain": "def"}}
    assert differences(old, new) == [
        "settings.learning_rate 0.001 -> 0.002", "data b.jsonl removed", "data c.jsonl added",
        "requires.pretrain abc -> def"]
    assert differences(old, old) == []


def test_file_hash_is_cached_by_size_and_mtime(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_text("one\n")
    first = file_hash(path, tmp_path)
    cache = json.loads((tmp_path / ".hashes.json").read_text())
    assert cache[str(path.resolve())]["sha256"] == first
    path.write_text("two\n")  # same size, new content, new mtime
    os.utime(path, ns=(1, 1))
    assert file_hash(path, tmp_path) != first


def test_force_keeps_the_previous_run_and_runs_lists_it(smoke_runs, tmp_path, capsys):
    root = tmp_path / "runs"
    shutil.copytree(smoke_runs, root, ignore=shutil.ignore_patterns("sft", "pretrain"))
    old = read_marker(root / "tokenizer")["run_id"]
    ensure("tokenizer", "smoke", root=root, force=True, progress=False)
    kept = root / PREVIOUS_DIR / f"tokenizer-{old[:8]}"
    assert (kept / MARKER_FILE).is_file() and "(forced)" in capsys.readouterr().out
    assert main(["runs", "--out", str(root)]) == 0
    listing = capsys.readouterr().out
    assert "kept tokenizer-" in listing and "--clean" in listing
    assert main(["runs", "--out", str(root), "--clean"]) == 0
    assert not (root / PREVIOUS_DIR).exists() and (root / "tokenizer" / MARKER_FILE).is_file()


@pytest.mark.parametrize("marker", [False, True])
def test_an_unfinished_stage_stays_in_place(tmp_path, marker):
    """A crashed run (no stage.json) keeps its checkpoints where --resume finds them."""
    from minimind_lib.course.pipeline import _keep_previous

    stage = tmp_path / "pretrain"
    (stage / "checkpoints").mkdir(parents=True)
    if marker:
        (stage / MARKER_FILE).write_text(json.dumps({"run_id": "f" * 32}))
    _keep_previous(stage, tmp_path, None)
    assert stage.exists() != marker
    assert (tmp_path / PREVIOUS_DIR / "pretrain-ffffffff").exists() == marker


def test_init_starts_a_stage_from_another_model(smoke_runs, tmp_path):
    """--init: the dpo stage starts from a given model folder; its sft prerequisite (and so
    pretraining) is neither needed nor run, and the folder's weights enter the fingerprint."""
    from minimind_lib.course.pipeline import fingerprint
    from minimind_lib.course.profiles import get_profile, override

    profile = override(get_profile("smoke"), {"dpo.max_steps": "4", "eval_per_task": "2"})
    root = tmp_path / "runs"
    out = ensure("dpo", profile, root=root, init=smoke_runs / "sft", progress=False)
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["dpo", "tokenizer"]
    requires = read_marker(out)["fingerprint"]["requires"]
    assert set(requires) == {"tokenizer", "init"} and requires["init"] == fingerprint(
        "dpo", profile, root, smoke_runs / "sft")["requires"]["init"]
    record = json.loads((out / "run_config.json").read_text())
    assert record["init"] == str(smoke_runs / "sft")
    with pytest.raises(ValueError, match="does not apply to stage 'tokenizer'"):
        ensure("tokenizer", profile, root=root, init=smoke_runs / "sft")
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        ensure("dpo", profile, root=root, init=tmp_path)
