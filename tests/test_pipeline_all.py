"""`python -m minimind_lib all` end to end: tokenizer -> pretrain -> sft -> dpo -> quantize on a
shrunken smoke profile, then report.md; a second run reuses every finished stage."""

import json
from dataclasses import replace

import pytest

import minimind_lib.__main__ as cli
from minimind_lib.core.filenames import FIGURES_DIR, REPORT_FILE
from minimind_lib.course.pipeline import find_model_dir, stages_in_all
from minimind_lib.course.profiles import get_profile
from minimind_lib.course.stages import read_marker
from minimind_lib.model.checkpoint import load_model
from minimind_lib.model.int8 import QuantLinear
from minimind_lib.model.quantize import model_size_bytes

STAGES = tuple(s.name for s in stages_in_all())


def tiny_smoke():
    """The smoke profile with a few steps per stage: the whole pipeline, in well under the
    full smoke run's time (this test checks the plumbing, not the learning)."""
    p = get_profile("smoke")
    few = {"warmup_steps": 1, "eval_every": 4, "save_every": 4}
    return replace(
        p, eval_per_task=2,
        pretrain=replace(p.pretrain, max_steps=6, max_examples=300, **few),
        sft=replace(p.sft, max_steps=6, batch_size=8, max_examples=200, **few),
        dpo=replace(p.dpo, max_steps=4, batch_size=4, max_examples=60, **few))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs") / "smoke"
    profile = tiny_smoke()
    mp = pytest.MonkeyPatch()
    mp.setattr(cli, "get_profile", lambda name=None: profile)
    # (thread count: `make test` runs torch on one thread, see the Makefile's TEST_THREADS)
    try:
        assert cli.main(["all", "--profile", "smoke", "--out", str(root), "--no-progress"]) == 0
        yield root, mp
    finally:
        mp.undo()


def test_every_stage_finished(run):
    root, _ = run
    for stage in STAGES:
        marker = read_marker(root / stage)
        assert marker is not None and marker["stage"] == stage, stage
    for stage in ("pretrain", "sft", "dpo"):
        rows = [json.loads(line) for line in (root / stage / "metrics.jsonl").open()]
        assert rows and all("loss" in r for r in rows), stage
    assert find_model_dir(root) == root / "dpo"  # what `serve` picks by default


def test_quantize_output(run):
    root, _ = run
    fp32 = load_model(root / "dpo")
    int8 = load_model(root / "quantize")
    assert isinstance(int8.model.layers[0].mlp.up_proj, QuantLinear)
    assert model_size_bytes(int8) < 0.3 * model_size_bytes(fp32)
    summary = read_marker(root / "quantize")["summary"]
    assert summary["source"] == "dpo"
    assert {"fp32", "fp16", "bf16", "int8 (ours)"} <= set(summary["perplexity"])
    ppl = summary["perplexity"]
    assert abs(ppl["int8 (ours)"] / ppl["fp32"] - 1) < 0.03  # a few percent at most
    rows = [json.loads(line) for line in (root / "quantize" / "metrics.jsonl").open()]
    assert [r["name"] for r in rows][:4] == ["fp32", "fp16", "bf16", "int8 (ours)"]
    bpb = {r["name"]: r["metrics"]["bits_per_byte"] for r in rows if not r["note"]}
    assert abs(bpb["int8 (ours)"] / bpb["fp32"] - 1) < 0.01  # log-scale: moves less than ppl
    assert (root / "quantize" / "tokenizer.json").is_file()  # serve --model works on it alone


def test_report(run):
    root, _ = run
    text = (root / REPORT_FILE).read_text()
    for stage in STAGES:
        assert f"| {stage} | done |" in text
    for stage in ("pretrain", "sft", "dpo"):
        png = root / FIGURES_DIR / f"{stage}_loss.png"
        assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
        assert f"]({FIGURES_DIR}/{stage}_loss.png)" in text
        section = text.split(f"]({FIGURES_DIR}/{stage}_loss.png)")[1][:1500]
        # every curve labelled: what the training loss averages, what validation measures
        described = next(s for s in stages_in_all() if s.name == stage)
        assert (f"Training curve: {described.training}." in section
                and f"Validation curve: {described.validation}." in section), stage
    assert "final_offline_val_loss" in text  # DPO: the offline pairs' loss, labelled apart
    assert "| int8 (ours) |" in text and "perplexity" in text
    assert "bits/byte |" in text and "bits per byte: pretrain" in text  # format table, sft
    assert "exact-match" in text and "preference" in text.lower()


def test_second_run_reuses_finished_stages(run, capsys):
    root, _ = run
    before = {s: read_marker(root / s)["run_id"] for s in STAGES}
    assert cli.main(["all", "--profile", "smoke", "--out", str(root), "--no-progress"]) == 0
    assert {s: read_marker(root / s)["run_id"] for s in STAGES} == before
    assert "[pipeline] stage" not in capsys.readouterr().out  # nothing ran again
