"""The Chinese edition (issue 35): every notebook's twin is built from the English notebook and
its translation file, so code cells are the English ones by construction; a changed English
cell without its translation, a missing translation and a stale one fail, naming the notebook,
the cell and the first changed line; numbers, LaTeX and code spans agree in every pair;
README.zh.md is built the same way and the two READMEs link to each other."""

from __future__ import annotations

import json
import re

import pytest

from minimind_lib import REPO_ROOT
from minimind_lib.course import i18n
from minimind_lib.course.exercises import exercise

ENGLISH = i18n.english_notebooks()  # the course notebooks, then the worked answers


@pytest.mark.parametrize("english", ENGLISH, ids=i18n.label)
def test_the_chinese_twin_is_a_fresh_build_with_the_same_code(english):
    twin = i18n.twin_path(english)
    assert twin.is_file(), f"{twin} is missing: run `python scripts/build_i18n.py`"
    built = i18n.build_notebook(english)  # raises on a missing or drifted translation
    assert twin.read_text(encoding="utf-8") == i18n.dumps(built), (
        f"{twin.relative_to(REPO_ROOT)} is not a fresh build: run `python scripts/build_i18n.py`")
    source = json.loads(english.read_text(encoding="utf-8"))["cells"]
    assert [c["id"] for c in source] == [c["id"] for c in built["cells"]]
    for en, zh in zip(source, built["cells"], strict=True):
        assert en["cell_type"] == zh["cell_type"]
        if en["cell_type"] == "code":
            assert en["source"] == zh["source"], f"{english.name}: code cell {en['id']} differs"
    assert i18n.notebook_problems(english) == []  # numbers, LaTeX and code agree in every pair


def translated_as_it_is(english):
    """A translation of every markdown cell of ``english`` as its text today."""
    nb = json.loads(english.read_text(encoding="utf-8"))
    return {c["id"]: {"en_sha256": i18n.sha("".join(c["source"])), "en": "".join(c["source"]),
                      "zh": "译文 " + "".join(c["source"])}
            for c in nb["cells"] if c["cell_type"] == "markdown"}


def test_a_changed_english_cell_without_its_translation_fails_naming_it(tmp_path, monkeypatch):
    english = ENGLISH[0]
    translation = translated_as_it_is(english)
    monkeypatch.setattr(i18n, "read_translation", lambda *a, **k: translation)
    assert i18n.build_notebook(english)["cells"][0]["source"][0].startswith("译文 ")
    nb = json.loads(english.read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if c["cell_type"] == "markdown")
    lines = "".join(cell["source"]).splitlines(True)
    lines[2] = "A sentence a teacher added.\n"
    cell["source"] = lines
    changed = tmp_path / english.name
    changed.write_text(json.dumps(nb), encoding="utf-8")
    with pytest.raises(i18n.TranslationDrift) as err:
        i18n.build_notebook(changed)
    message = str(err.value)
    assert english.name in message and cell["id"] in message
    assert "first changed line 3" in message and "A sentence a teacher added." in message


def test_a_missing_or_stale_translation_is_an_error_not_english(tmp_path, monkeypatch):
    english = ENGLISH[0]
    original = translated_as_it_is(english)
    first = next(iter(original))
    cases = (({k: v for k, v in original.items() if k != first}, "no zh translation"),
             ({**original, first: {**original[first], "zh": " "}}, "no zh translation"),
             ({**original, "gone1234": original[first]}, "cells that are gone"))
    for broken, words in cases:
        monkeypatch.setattr(i18n, "read_translation", lambda *a, b=broken, **k: b)
        with pytest.raises(i18n.TranslationDrift, match=words):
            i18n.build_notebook(english)


def test_same_facts_catches_a_changed_number_formula_or_code_span():
    en = "Loss $L = 2$ after `train()` ran 1,200 steps (85-100%)."
    assert i18n.same_facts(en, "损失 $L = 2$，`train()` 跑了 1,200 步（85-100%）。") == []
    assert i18n.same_facts(en, "损失 $L = 2$，`train()` 跑了 1,300 步（85-100%）。") == [
        "numbers missing in the translation: ['1200']",
        "numbers only in the translation: ['1300']"]
    assert "latex missing" in i18n.same_facts(en, "损失 $L=2$，`train()` 1,200 85-100%")[0]
    assert "code missing" in i18n.same_facts(en, "损失 $L = 2$，train() 1,200 85-100%")[0]


def test_the_chinese_readme_is_built_current_and_linked_both_ways():
    assert i18n.readme_problems("zh") == []
    zh = (REPO_ROOT / "README.zh.md").read_text(encoding="utf-8")
    assert zh == i18n.readme_text("zh"), "README.zh.md is stale: run scripts/build_i18n.py"
    assert "[English](README.md)" in zh
    assert "[中文版](README.zh.md)" in (REPO_ROOT / "README.md").read_text(encoding="utf-8")


def test_every_notebook_has_a_twin_and_nothing_else_is_built():
    english = {i18n.label(p) for p in ENGLISH}
    assert len(english) == 2 * len(list(i18n.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")))
    zh = i18n.NOTEBOOKS / "zh"
    built = {str(p.relative_to(zh)) for p in zh.rglob("*.ipynb")
             if ".ipynb_checkpoints" not in p.parts}
    assert built == english


def test_the_exercise_helper_speaks_the_notebooks_language(tmp_path, monkeypatch, capsys):
    def stub(*args):
        raise NotImplementedError

    zh = tmp_path / "notebooks" / "zh"
    zh.mkdir(parents=True)
    monkeypatch.delenv(i18n.LANG_ENV, raising=False)
    monkeypatch.chdir(zh)  # where Jupyter starts a Chinese notebook's kernel
    assert i18n.language() == "zh"
    assert exercise("17.2", stub) is False
    assert "练习 17.2：还没有完成" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="练习 17.2：还不对") as err:
        exercise("17.2", lambda lls, choices: (0, 0))
    assert "raw pick" not in str(err.value)  # the check's explanation, in Chinese too
    (zh / "solutions").mkdir()
    monkeypatch.chdir(zh / "solutions")
    assert i18n.language() == "zh"
    monkeypatch.chdir(tmp_path)
    assert i18n.language() == "en"
    monkeypatch.setenv(i18n.LANG_ENV, "zh")
    assert i18n.language() == "zh"



def test_every_check_message_has_its_translation_with_the_same_fields():
    """Each message a check can fail with (read from the source) has a Chinese template with the
    same fields and numbers; a changed English message without its translation fails here."""
    table = json.loads((i18n.I18N_DIR / "zh" / "exercise_messages.json").read_text(
        encoding="utf-8"))
    templates = i18n.message_templates()
    assert sorted(table) == templates, (
        f"untranslated: {sorted(set(templates) - set(table))[:3]}; "
        f"gone: {sorted(set(table) - set(templates))[:3]}")
    fields = re.compile(r"(?<!\{)\{\d+\}(?!\})")
    for english, chinese in table.items():
        assert chinese.strip(), f"no translation of {english!r}"
        assert sorted(fields.findall(english)) == sorted(fields.findall(chinese)), english
        assert chinese.format(*range(9)) and i18n.same_facts(
            fields.sub(" ", english), fields.sub(" ", chinese)) == [], english


def test_a_wrong_answer_is_explained_in_chinese(monkeypatch):
    monkeypatch.setenv(i18n.LANG_ENV, "zh")
    from test_exercises import WRONG

    explained = 0
    for exercise_id, answer in WRONG.items():
        try:
            exercise(exercise_id, answer)
        except AssertionError as e:
            assert str(e).startswith(f"练习 {exercise_id}：还不对。")
            explained += "检查的说明" not in str(e)
    assert explained >= 0.9 * len(WRONG), f"{explained} of {len(WRONG)} in Chinese"
