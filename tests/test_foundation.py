"""The course foundation: packaging, profiles, device/precision choice, notebooks' storage."""

import json
import re
from pathlib import Path

import pytest
import torch

from minimind_lib import REPO_ROOT
from minimind_lib.core.device import BF16, FP16, FP32, pick_device, pick_precision
from minimind_lib.course.profiles import PROFILE_NAMES, get_profile, resolve_profile_name
from minimind_lib.model import MiniMindConfig

# --- packaging -------------------------------------------------------------------------


def _pyproject_requirements() -> dict[str, str]:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    meta = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(meta["dependencies"])
    for extra in meta["optional-dependencies"].values():
        reqs += extra
    return {re.split(r"[<>=!~\[ ]", r, maxsplit=1)[0].lower(): r.replace(" ", "") for r in reqs}


def _environment_requirements() -> dict[str, str]:
    # environment.yml's pip section: "      - name>=x" lines (the -e line installs the repo)
    lines = (REPO_ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    reqs = [line.strip()[2:] for line in lines[start + 1:] if line.strip().startswith("- ")]
    reqs = [r for r in reqs if not r.startswith(("-e ", "-c "))]
    return {re.split(r"[<>=!~\[ ]", r, maxsplit=1)[0].lower(): r.replace(" ", "") for r in reqs}


def test_environment_yml_matches_pyproject():
    assert _environment_requirements() == _pyproject_requirements()


def test_torch_is_pinned_to_the_tested_range():
    assert _pyproject_requirements()["torch"] == "torch>=2.5,<2.14"


def test_ci_runs_the_readme_test_command():
    assert "make test" in (REPO_ROOT / ".ci" / "run").read_text()
    assert "make test" in (REPO_ROOT / "README.md").read_text()
    assert "make run" in (REPO_ROOT / "README.md").read_text()


# --- profiles --------------------------------------------------------------------------


def test_profile_from_env_var(monkeypatch):
    monkeypatch.setenv("MINIMIND_PROFILE", "smoke")
    assert get_profile().name == "smoke"
    monkeypatch.setenv("MINIMIND_PROFILE", "CPU")  # case-insensitive
    assert get_profile().name == "cpu"


def test_explicit_name_beats_env_var(monkeypatch):
    monkeypatch.setenv("MINIMIND_PROFILE", "smoke")
    assert get_profile("full").name == "full"


def test_auto_follows_cuda(monkeypatch):
    monkeypatch.delenv("MINIMIND_PROFILE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_profile_name() == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_profile_name("auto") == "gpu"


def test_unknown_profile_lists_valid_names(monkeypatch):
    with pytest.raises(ValueError, match="smoke, cpu, gpu, full, minimind3, auto"):
        get_profile("tiny")
    monkeypatch.setenv("MINIMIND_PROFILE", "gpuu")
    with pytest.raises(ValueError, match="unknown profile 'gpuu'"):
        get_profile()


def test_profiles_grow_from_smoke_to_full():
    smoke, cpu, full = (get_profile(n) for n in ("smoke", "cpu", "full"))
    assert full.model == MiniMindConfig()  # MiniMind2-Small exactly
    assert smoke.model.hidden_size < cpu.model.hidden_size < full.model.hidden_size
    for stage in ("pretrain", "sft", "dpo"):
        assert getattr(smoke, stage).max_steps <= getattr(cpu, stage).max_steps
        s = getattr(cpu, stage)
        assert s.seq_len <= cpu.model.max_position_embeddings
        assert 0 <= s.warmup_steps < s.max_steps


def test_profile_names_are_the_documented_ones():
    assert PROFILE_NAMES == ("smoke", "cpu", "gpu", "full", "minimind3", "auto")


def test_runs_dir_is_per_profile(monkeypatch, tmp_path):
    monkeypatch.setenv("MINIMIND_RUNS_DIR", str(tmp_path))
    assert get_profile("smoke").runs_dir == tmp_path / "smoke"


# --- device and precision --------------------------------------------------------------


def test_precision_rule():
    cuda, cpu, mps = torch.device("cuda"), torch.device("cpu"), torch.device("mps")
    assert pick_precision(cuda, cuda_bf16=True) == BF16
    assert pick_precision(cuda, cuda_bf16=False) == FP16
    assert pick_precision(cpu, cpu_bf16=True) == BF16
    assert pick_precision(cpu, cpu_bf16=False) == FP32
    assert pick_precision(mps) == FP32
    assert pick_precision(cpu, "fp32", cpu_bf16=True) == FP32  # an explicit request wins


def test_only_fp16_uses_a_scaler():
    assert [p.use_scaler for p in (FP32, BF16, FP16)] == [False, False, True]
    assert not FP32.autocast and BF16.autocast


def test_unknown_precision_is_an_error():
    with pytest.raises(ValueError, match="auto, fp32, bf16, fp16"):
        pick_precision(torch.device("cpu"), "int4")


def test_device_order(monkeypatch):
    monkeypatch.delenv("MINIMIND_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device().type == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert pick_device().type == "mps"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert pick_device().type == "cpu"
    monkeypatch.setenv("MINIMIND_DEVICE", "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device().type == "cpu"


def test_bf16_context_runs_matmul_in_bf16():
    x = torch.randn(4, 4)
    with BF16.context(torch.device("cpu")):
        assert (x @ x).dtype == torch.bfloat16
    with FP32.context(torch.device("cpu")):
        assert (x @ x).dtype == torch.float32


# --- notebooks -------------------------------------------------------------------------

# the course notebooks and their worked answers (notebooks/solutions/)
NOTEBOOKS = sorted(p for p in (REPO_ROOT / "notebooks").rglob("*.ipynb")
                   if ".ipynb_checkpoints" not in p.parts)


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no notebook"
    assert NOTEBOOKS[0].name == "00_setup_and_data.ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_notebook_stored_without_outputs(path: Path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert not cell.get("outputs"), f"{path.name} cell {i} has outputs"
            assert cell.get("execution_count") is None, (
                f"{path.name} cell {i} has an execution count")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_notebook_checks_itself(path: Path):
    # correctness lives in assert cells, so nbval-lax really checks something
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert re.search(r"^\s*assert ", code, re.M), f"{path.name} has no assert cell"
