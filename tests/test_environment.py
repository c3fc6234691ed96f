"""The locked environment (constraints.txt), the environment switches a spread measurement
uses ($MINIMIND_SEED, $MINIMIND_CPU_BF16, $MINIMIND_QUOTED_RECORD), and the spread report."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys

import pytest
import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from minimind_lib import REPO_ROOT
from minimind_lib.core import device
from minimind_lib.core.environment import (
    LOCK_FILE,
    lock_drift,
    lock_pins,
    parse_lock,
    same_release,
)
from minimind_lib.course.profiles import get_profile
from minimind_lib.course.quoted import check_quoted

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11


def _project() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]


def _all_pins() -> dict[str, list[str]]:
    """Every version the lock pins each name at, whatever its marker (a name may fork)."""
    pins: dict[str, list[str]] = {}
    for name, version, _marker in lock_pins(LOCK_FILE.read_text()):
        pins.setdefault(name, []).append(version)
    return pins


def test_the_lock_pins_every_dependency_inside_its_range():
    project, pins = _project(), _all_pins()
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    for text in requirements:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is a dependency but constraints.txt does not pin it"
        for version in pins[name]:
            assert req.specifier.contains(version, prereleases=True), (text, version)


def test_torch_is_locked_by_version_not_by_a_local_build():
    assert _all_pins()["torch"] == ["2.13.0"]
    assert same_release("2.13.0+cpu", "2.13.0") and not same_release("2.12.1", "2.13.0")


def test_the_lock_covers_every_platform_and_the_cuda_build():
    text = LOCK_FILE.read_text()
    assert "pywinpty==" in text and "os_name == 'nt'" in text    # Jupyter's terminal on Windows
    assert "sys_platform == 'darwin'" in text
    assert re.search(r"^nvidia-\S+==\S+ ; .*sys_platform == 'linux'", text, re.M)  # CUDA torch
    assert "uv pip compile --universal" in text       # the header says how it was made


def test_every_install_of_the_makefile_goes_through_the_lock():
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(r"^PIP\s*:=.*pip install -q -c \$\(LOCK\)$", makefile, re.M)
    for line in makefile.splitlines():
        if "pip install" in line and not line.startswith("PIP"):
            # only test-latest installs without the lock: it exists to try the newest versions
            assert ".venv-latest" in line or "$(PIP)" in line.split("||")[0], line


def test_parse_lock_keeps_the_pins_whose_marker_holds():
    text = ("numpy==2.4.6\n    # via torch\n"
            "pywinpty==3.1.2 ; os_name == 'nt'\n"
            "overrides==7.7.0 ; python_full_version >= '3.0'\n"
            "-e .\n# numpy==1.0 in a comment\n")
    pins = parse_lock(text)
    assert pins["numpy"] == "2.4.6" and pins["overrides"] == "7.7.0"
    assert ("pywinpty", "3.1.2", "os_name == 'nt'") in lock_pins(text)   # every platform's pins
    assert ("pywinpty" in pins) == (os.name == "nt")


def test_lock_drift_names_what_differs(tmp_path):
    installed = Version(pytest.__version__)
    lock = tmp_path / "constraints.txt"
    lock.write_text(f"pytest=={installed}\ntorch=={Version(torch.__version__).public}\n")
    assert lock_drift(lock) == []
    lock.write_text("pytest==0.0.1\nno-such-package==1.0\n")
    (drift,) = lock_drift(lock)
    assert (drift.name, drift.installed, drift.locked) == ("pytest", str(installed), "0.0.1")
    assert lock_drift(tmp_path / "missing.txt") is None


def test_seed_from_the_environment(monkeypatch):
    monkeypatch.setenv("MINIMIND_SEED", "7")
    profile = get_profile("smoke")
    assert profile.seed == 7 and "seed=7" in profile.overrides
    monkeypatch.setenv("MINIMIND_SEED", "seven")
    with pytest.raises(ValueError, match=r"\$MINIMIND_SEED"):
        get_profile("smoke")
    monkeypatch.delenv("MINIMIND_SEED")
    assert get_profile("smoke").seed == 42


@pytest.mark.parametrize(("value", "native"), [("0", False), ("1", True)])
def test_cpu_bf16_from_the_environment(monkeypatch, value, native):
    monkeypatch.setenv("MINIMIND_CPU_BF16", value)
    device.cpu_has_native_bf16.cache_clear()
    try:
        assert device.cpu_has_native_bf16() is native
        assert device.pick_precision(torch.device("cpu")).name == ("bf16" if native else "fp32")
        monkeypatch.setenv("MINIMIND_CPU_BF16", "yes")
        device.cpu_has_native_bf16.cache_clear()
        with pytest.raises(ValueError, match="MINIMIND_CPU_BF16"):
            device.cpu_has_native_bf16()
    finally:
        monkeypatch.delenv("MINIMIND_CPU_BF16")
        device.cpu_has_native_bf16.cache_clear()


def test_record_mode_collects_every_figure_instead_of_raising(monkeypatch, tmp_path, capsys):
    record = tmp_path / "figures.jsonl"
    monkeypatch.setenv("MINIMIND_QUOTED_RECORD", str(record))
    check_quoted({"rate": (0.8, 1.0), "loss": (2.0, 3.0, "{:.2f}")},
                 {"rate": 0.5, "loss": [2.5, 2.7]})
    check_quoted({"rate": (0.8, 1.0)}, {"rate": 0.9})
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(r["name"], r["values"]) for r in rows] == [("rate", [0.5]), ("loss", [2.5, 2.7]),
                                                        ("rate", [0.9])]
    assert rows[1]["range"] == [2.0, 3.0, "{:.2f}"] and rows[1]["text"] == "2.00-3.00"
    assert "drifted (recorded, not raised): rate" in capsys.readouterr().out
    monkeypatch.delenv("MINIMIND_QUOTED_RECORD")
    with pytest.raises(AssertionError, match="rate: the text says 80-100%"):
        check_quoted({"rate": (0.8, 1.0)}, {"rate": 0.5})


def _spread_module():
    spec = importlib.util.spec_from_file_location(
        "quoted_spread", REPO_ROOT / "benchmarks" / "quoted_spread.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module           # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_spread_report_flags_a_range_some_config_left(tmp_path, capsys):
    spread = _spread_module()
    for config, ppl, rate in (("base", 2722.0, 0.9), ("fp32", 4974.0, 0.95)):
        folder = tmp_path / "records" / config
        folder.mkdir(parents=True)
        (folder / "05_sft.jsonl").write_text(
            json.dumps({"name": "ppl", "range": [3000, 4300, "{:,.0f}"], "text": "3,000-4,300",
                        "values": [ppl]}) + "\n"
            + json.dumps({"name": "rate", "range": [0.8, 1.0], "text": "80-100%",
                          "values": [rate]}) + "\n")
    assert spread.report(tmp_path) == 1
    out = capsys.readouterr().out
    (ppl_row,) = [row for row in out.splitlines() if row.startswith("05_sft") and " ppl " in row]
    assert "2,722 .. 4,974" in ppl_row and "TOO TIGHT (base, fp32)" in ppl_row
    low, high = (float(x.replace(",", "")) for x in ppl_row.split("suggest ")[1].split(" - "))
    assert low <= 2722 and high >= 4974
    assert "1 ranges too tight" in out
    rows = json.loads((tmp_path / "spread.json").read_text())
    assert {r["figure"]: bool(r["verdict"]) for r in rows} == {"ppl": True, "rate": False}


def test_spread_names_what_moved_from_a_baseline(tmp_path):
    spread = _spread_module()
    for run, value in (("before", 3.02), ("after", 3.10)):
        folder = tmp_path / run / "records" / "base"
        folder.mkdir(parents=True)
        (folder / "04_pretraining.jsonl").write_text(
            json.dumps({"name": "loss", "range": [2.0, 3.5, "{:.2f}"], "text": "2.00-3.50",
                        "values": [value]}) + "\n"
            + json.dumps({"name": "steps", "range": [80, 80, "{:,}"], "text": "80",
                          "values": [80]}) + "\n")
    (line,) = spread.moved(spread.collect(tmp_path / "after"), spread.collect(tmp_path / "before"))
    assert line.startswith("04_pretraining") and "loss" in line and line.endswith("3.02 -> 3.10")


def test_spread_compares_a_figure_whose_quoted_range_changed(tmp_path):
    spread = _spread_module()
    for run, text, value in (("before", "2.00-3.50", 3.02), ("after", "1.90-3.60", 3.10)):
        folder = tmp_path / run / "records" / "base"
        folder.mkdir(parents=True)
        record = {"name": "loss", "range": [2.0, 3.5, "{:.2f}"], "text": text, "values": [value]}
        (folder / "04_pretraining.jsonl").write_text(json.dumps(record) + "\n")
    (line,) = spread.moved(spread.collect(tmp_path / "after"), spread.collect(tmp_path / "before"))
    assert line.endswith("3.02 -> 3.10")
