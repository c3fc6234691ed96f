"""The concept diagrams of the notebooks (notebooks/figures/): every figure a notebook shows
exists, draw_figures.py draws exactly the SVG files kept there, and the Chinese edition's
(notebooks/figures/zh/) are drawn with a translation of every label."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from minimind_lib import REPO_ROOT

FIGURES = REPO_ROOT / "notebooks" / "figures"
SHOWN = re.compile(r"\]\((figures/[\w.-]+\.svg)\)")


def _script():
    spec = importlib.util.spec_from_file_location("draw_figures", FIGURES / "draw_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _shown() -> dict[str, set[str]]:
    shown = {}
    for notebook in sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        shown[notebook.name] = set(SHOWN.findall(text))
    return shown


def test_every_figure_a_notebook_shows_exists():
    for notebook, figures in _shown().items():
        for figure in figures:
            assert (REPO_ROOT / "notebooks" / figure).is_file(), (
                f"{notebook} shows missing {figure}")


def test_the_script_draws_exactly_the_kept_files(tmp_path):
    script = _script()
    kept = {p.stem for p in FIGURES.glob("*.svg")}
    assert set(script.FIGURES) == kept, (
        f"drawn but not kept: {sorted(set(script.FIGURES) - kept)}; kept but not drawn: "
        f"{sorted(kept - set(script.FIGURES))}: run python notebooks/figures/draw_figures.py")
    written = script.draw(["course_map", "attention_shapes"], tmp_path)
    assert [p.name for p in written] == ["course_map.svg", "attention_shapes.svg"]
    assert all(p.read_text(encoding="utf-8").lstrip().startswith("<?xml") for p in written)


def test_every_figure_has_its_chinese_twin_and_the_chinese_notebooks_show_them(tmp_path):
    """notebooks/figures/zh/ holds every diagram drawn with the labels of
    notebooks/i18n/zh/figures.json: drawing them all succeeds (an English label without its
    translation stops it, naming the label) and gives the committed files, each label keeps
    its numbers, and the Chinese notebooks show these files."""
    from minimind_lib.course.i18n import same_facts

    script = _script()
    assert {p.stem for p in (FIGURES / "zh").glob("*.svg")} == set(script.FIGURES)
    written = script.draw([], tmp_path, lang="zh")
    stale = [p.name for p in written
             if p.read_bytes() != (FIGURES / "zh" / p.name).read_bytes()]
    assert not stale, f"{stale}: run python notebooks/figures/draw_figures.py --lang zh"
    table = script.read_labels("zh")
    assert {k: same_facts(k, v) for k, v in table.items() if same_facts(k, v)} == {}
    for notebook in sorted((REPO_ROOT / "notebooks" / "zh").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        for figure in re.findall(r"\]\((\.\./figures/[\w/.-]+\.svg)\)", text):
            assert figure.startswith("../figures/zh/"), f"{notebook.name} shows {figure}"
            assert (notebook.parent / figure).is_file(), f"{notebook.name} shows missing {figure}"


def test_a_label_without_its_translation_stops_the_drawing(tmp_path, monkeypatch):
    script = _script()
    table = script.read_labels("zh")
    monkeypatch.setattr(script, "read_labels", lambda lang: {k: v for k, v in table.items()
                                                              if k != "tokenizer"})
    with pytest.raises(SystemExit, match="tokenizer"):
        script.draw(["course_map"], tmp_path, lang="zh")


def test_every_figure_is_shown_somewhere():
    shown = set().union(*_shown().values())
    unused = sorted(f"figures/{p.name}" for p in FIGURES.glob("*.svg"))
    assert not [f for f in unused if f not in shown], [f for f in unused if f not in shown]
