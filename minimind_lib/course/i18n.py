"""The course in another language, kept in step with the English one by construction.

Code cells are shared: a translated notebook is built from the English one, cell by cell; only
its markdown cells come from the translation file ``notebooks/i18n/<lang>/NN_name.json``::

    {"notebook": "05_sft.ipynb",
     "cells": {"<cell id>": {"en_sha256": "<hash of the English text>",
                             "en": "<the English text that was translated>",
                             "zh": "<the translation>"}}}

``build_notebook`` refuses to build when a markdown cell has no translation, or when its English
text changed since it was translated (``TranslationDrift`` names the notebook, the cell and the
first changed line): a translation never falls back to English, and never silently lags it.
``scripts/build_i18n.py`` writes ``notebooks/<lang>/NN_name.ipynb``; ``tests/test_i18n.py``
proves the committed ones equal a fresh build. ``same_facts`` compares the numbers, LaTeX
spans and code spans of a text and its translation.

The worked answers (``notebooks/solutions/``) have twins in ``notebooks/<lang>/solutions/``;
the README's opening, quick start, course table and hardware notes become ``README.<lang>.md``
the same way. The exercise helper (``course.exercises.exercise``) speaks ``language()``:
``$MINIMIND_LANG``, else the language of the notebook folder Jupyter started the kernel in
(``notebooks/zh/``), the checks' explanations included (``translate_message``: every message
template in ``course/exercises*.py`` has its translation in ``exercise_messages.json``). The
concept diagrams' labels live in ``figures.json`` (``notebooks/figures/draw_figures.py --lang``).

>>> sha("a\\n")[:12]
'87428fc52280'
>>> first_changed_line("one\\ntwo\\nthree", "one\\n2\\nthree")
(2, 'two', '2')
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import json
import os
import re
from pathlib import Path

from minimind_lib import REPO_ROOT

NOTEBOOKS = REPO_ROOT / "notebooks"
I18N_DIR = NOTEBOOKS / "i18n"
LANGUAGES = ("zh",)
LANG_ENV = "MINIMIND_LANG"


class TranslationDrift(ValueError):
    """A markdown cell without a translation, or whose English changed since."""


def sha(text: str) -> str:
    """The English text's fingerprint (SHA-256, hex)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def language() -> str:
    """``"zh"`` in a Chinese notebook's kernel (started in ``notebooks/zh/``) or with
    ``MINIMIND_LANG=zh``; else ``"en"``."""
    chosen = os.environ.get(LANG_ENV, "").strip().lower()
    if chosen:
        return chosen if chosen in LANGUAGES else "en"
    parts = Path.cwd().parts
    return next((b for a, b in zip(parts, parts[1:], strict=False)
                 if a == "notebooks" and b in LANGUAGES),
                "en")


#: what the exercise helper says, per language ("wrong" wraps ``explain``'s message; English
#: re-raises the check's own error)
EXERCISE_WORDS = {
    "en": {"stub": "exercise {id}: not done yet (a worked answer: "
                   "notebooks/solutions/{notebook}_*.ipynb)",
           "correct": "exercise {id}: correct"},
    "zh": {"stub": "练习 {id}：还没有完成（参考答案：notebooks/zh/solutions/{notebook}_*.ipynb）",
           "correct": "练习 {id}：正确",
           "wrong": "练习 {id}：还不对。{why}",
           "as_is": "检查的说明：{why}"},  # a message without a template (e.g. a bare value)
}


def first_changed_line(old: str, new: str) -> tuple[int, str, str]:
    """(1-based line number, old line, new line) of the first difference of two texts."""
    a, b = old.splitlines(), new.splitlines()
    for k in range(max(len(a), len(b))):
        x = a[k] if k < len(a) else "<end of text>"
        y = b[k] if k < len(b) else "<end of text>"
        if x != y:
            return k + 1, x, y
    return 0, "", ""


def _folder(notebook: str | Path) -> str:
    """``"solutions"`` for a worked answers notebook, else ``""``."""
    return "solutions" if Path(notebook).parent.name == "solutions" else ""


def label(notebook: str | Path) -> str:
    """``05_sft.ipynb``, ``solutions/05_sft.ipynb``: how messages name a notebook."""
    return str(Path(_folder(notebook)) / Path(notebook).name)


def translation_path(notebook: str | Path, lang: str = "zh") -> Path:
    """``notebooks/i18n/<lang>/NN_name.json`` (``.../solutions/NN_name.json`` for a worked
    answers notebook)."""
    return I18N_DIR / lang / _folder(notebook) / (Path(notebook).stem + ".json")


def twin_path(english: str | Path, lang: str = "zh") -> Path:
    """Where the translated notebook of ``english`` lives: ``notebooks/<lang>/`` (and its
    ``solutions/``)."""
    return NOTEBOOKS / lang / label(english)


def english_notebooks() -> list[Path]:
    """The course notebooks and their worked answers, in English."""
    return (sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
            + sorted((NOTEBOOKS / "solutions").glob("[0-9][0-9]_*.ipynb")))


def read_translation(notebook: str | Path, lang: str = "zh") -> dict[str, dict]:
    """Cell id -> {en_sha256, en, <lang>} of a notebook (an error names a missing file)."""
    path = translation_path(notebook, lang)
    if not path.is_file():
        raise TranslationDrift(f"{label(notebook)}: no translation file {path}")
    data = json.loads(path.read_text(encoding="utf-8"))
    return data["cells"]


def _source(cell: dict) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def check_cell(notebook: str, cell_id: str, english: str, entry: dict | None,
               lang: str = "zh") -> str:
    """The translation of one markdown cell, or ``TranslationDrift`` saying what is wrong."""
    where = f"{notebook}, markdown cell {cell_id}"
    if entry is None or not entry.get(lang, "").strip():
        raise TranslationDrift(f"{where}: no {lang} translation (starts {english[:60]!r}); add "
                               f"it to {translation_path(notebook, lang).relative_to(REPO_ROOT)}")
    if entry.get("en_sha256") != sha(english):
        line, old, new = first_changed_line(entry.get("en", ""), english)
        raise TranslationDrift(f"{where}: the English text changed since it was translated "
                               f"(first changed line {line}: was {old!r}, now {new!r}); update "
                               f"its {lang} text, en and en_sha256 in "
                               f"{translation_path(notebook, lang).relative_to(REPO_ROOT)}")
    return entry[lang]


def build_notebook(english_path: str | Path, lang: str = "zh") -> dict:
    """The translated notebook: the English one with every markdown cell replaced by its
    checked translation (image links re-pointed from ``figures/x.svg`` to the translated
    diagram, ``../figures/<lang>/x.svg``), code cells untouched, outputs cleared."""
    english_path = Path(english_path)
    name = label(english_path)
    nb = json.loads(english_path.read_text(encoding="utf-8"))
    cells = read_translation(english_path, lang)
    ids = {c["id"] for c in nb["cells"] if c["cell_type"] == "markdown"}
    stale = sorted(set(cells) - ids)
    if stale:
        raise TranslationDrift(f"{name}: translations of cells that are gone: "
                               f"{', '.join(stale)} (remove them from "
                               f"{translation_path(english_path, lang).relative_to(REPO_ROOT)})")
    out = copy.deepcopy(nb)
    for cell in out["cells"]:
        if cell["cell_type"] == "markdown":
            text = check_cell(name, cell["id"], _source(cell),
                              cells.get(cell["id"]), lang)
            text = text.replace("](figures/", f"](../figures/{lang}/")  # its diagrams
            cell["source"] = text.splitlines(True)
        elif cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    out["metadata"] = {**out.get("metadata", {}), "language": lang}
    return out


def notebook_problems(english_path: str | Path, lang: str = "zh") -> list[str]:
    """What is wrong with a notebook's translation, one line each: missing or drifted cells
    (the first one found), or the cells whose numbers, LaTeX or code differ (``same_facts``)."""
    english_path = Path(english_path)
    try:
        built = build_notebook(english_path, lang)
    except TranslationDrift as e:
        return [str(e)]
    source = json.loads(english_path.read_text(encoding="utf-8"))["cells"]
    return [f"{label(english_path)}, markdown cell {en['id']}: {p}"
            for en, tr in zip(source, built["cells"], strict=True) if en["cell_type"] == "markdown"
            for p in same_facts(_source(en), _source(tr))]


def dumps(nb: dict) -> str:
    """A notebook (or a translation file) as the repository stores it."""
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


# --- numbers, formulas and code: the same in both languages ---------------------------------

_LATEX = re.compile(r"\$\$.+?\$\$|\$[^$]+\$", re.S)  # inline math may wrap a line too
_CODE = re.compile(r"(`+)[\s\S]+?\1")  # `x`, ``x``, a fenced block; may wrap lines
_NUMBER = re.compile(r"(?<![A-Za-z0-9_.])\d[\d,]*(?:\.\d+)?")


def facts(text: str) -> dict[str, set[str]]:
    """The LaTeX spans, code spans and numbers (outside both) of a markdown text, as sets (a
    translation may say a number once where the English repeats it).

    >>> f = facts("loss $L = 2$ at `lr=3e-4`, 1,200 steps and 12.5%")
    >>> sorted(f["latex"]), sorted(f["code"]), sorted(f["numbers"])
    (['$L = 2$'], ['`lr=3e-4`'], ['12.5', '1200'])
    """
    code = [" ".join(m.group(0).split()) for m in _CODE.finditer(text)]  # wrapping aside
    rest = _CODE.sub(" ", text)  # first: a `$VAR` in code is not LaTeX
    latex = [" ".join(m.split()) for m in _LATEX.findall(rest)]
    rest = _LATEX.sub(" ", rest)
    rest = re.sub(r"\]\([^)]*\)", "]", rest)  # a link's target is not a figure
    numbers = [n.replace(",", "") for n in _NUMBER.findall(rest)]
    return {"latex": set(latex), "code": set(code), "numbers": set(numbers)}


def same_facts(english: str, translated: str) -> list[str]:
    """What differs between the two texts' LaTeX, code spans and numbers (empty: the same)."""
    a, b = facts(english), facts(translated)
    problems = []
    for kind in ("latex", "code", "numbers"):
        missing, extra = a[kind] - b[kind], b[kind] - a[kind]
        if missing:
            problems.append(f"{kind} missing in the translation: {sorted(missing)}")
        if extra:
            problems.append(f"{kind} only in the translation: {sorted(extra)}")
    return problems


# --- README.<lang>.md: the README's opening, quick start, course table and hardware notes --

#: the README parts a translated README mirrors: the opening (before the first "## "), then
#: these sections by their heading
README_SECTIONS = ("## Quick start", "## The course", "## Profiles and hardware")
README_LINKS = {"zh": ("README.zh.md", "[中文版](README.zh.md)", "[English](README.md)")}


def readme_parts(text: str) -> dict[str, str]:
    """The opening and ``README_SECTIONS`` of a README, by heading (the opening: ``""``)."""
    parts: dict[str, str] = {}
    chunks = re.split(r"(?m)^(?=## )", text)
    parts[""] = chunks[0]
    for chunk in chunks[1:]:
        heading = chunk.splitlines()[0].strip()
        if heading in README_SECTIONS:
            parts[heading] = chunk
    missing = [h for h in README_SECTIONS if h not in parts]
    if missing:
        raise TranslationDrift(f"README.md: sections {missing} are gone; update "
                               "minimind_lib/course/i18n.py README_SECTIONS")
    return parts


def _readme_pairs(lang: str) -> list[tuple[str, str, str]]:
    """(part, English, checked translation) of each ``readme_parts`` part."""
    english = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    entries = read_translation("README", lang)
    return [(heading or "(opening)", text,
             check_cell("README.md", heading or "(opening)", text, entries.get(heading), lang))
            for heading, text in readme_parts(english).items()]


def readme_text(lang: str = "zh") -> str:
    """``README.<lang>.md`` as built from the README's translated parts."""
    return "\n".join(t.rstrip("\n") + "\n" for _, _, t in _readme_pairs(lang))


def build_readme(lang: str = "zh") -> Path:
    """Write ``README.<lang>.md`` (``readme_text``) and return its path."""
    path = REPO_ROOT / README_LINKS[lang][0]
    path.write_text(readme_text(lang), encoding="utf-8")
    return path


def readme_problems(lang: str = "zh") -> list[str]:
    """Missing or drifted README translations, numbers that differ, a stale README.<lang>.md,
    or a README that does not link to it."""
    try:
        pairs = _readme_pairs(lang)
    except TranslationDrift as e:
        return [str(e)]
    found = [f"README.md, {part}: {p}" for part, en, tr in pairs for p in same_facts(en, tr)]
    name, link, _ = README_LINKS[lang]
    built = REPO_ROOT / name
    if not built.is_file() or built.read_text(encoding="utf-8") != readme_text(lang):
        found.append(f"{name} is not a fresh build: run `python scripts/build_i18n.py`")
    if link not in (REPO_ROOT / "README.md").read_text(encoding="utf-8"):
        found.append(f"README.md does not link to {name} ({link})")
    return found


# --- the exercise checks' messages -------------------------------------------------------------

EXERCISE_MODULES = sorted((Path(__file__).parent).glob("exercises*.py"))
_FIELD = re.compile(r"\{(\d+)\}")


def _template(node: ast.expr) -> str | None:
    """A message's text with ``{0}``, ``{1}``... where its f-string puts values (literal braces
    doubled); None for a message that is not a string literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.replace("{", "{{").replace("}", "}}")
    if not isinstance(node, ast.JoinedStr):
        return None
    parts, k = [], 0
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value).replace("{", "{{").replace("}", "}}"))
        else:
            parts.append(f"{{{k}}}")
            k += 1
    return "".join(parts)


def message_templates() -> list[str]:
    """Every message the exercise checks can fail with (``assert ..., msg`` and
    ``raise AssertionError(msg)`` in ``course/exercises*.py``), as templates, sorted."""
    found = set()
    for path in EXERCISE_MODULES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            msg = None
            if isinstance(node, ast.Assert):
                msg = node.msg
            elif (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                  and getattr(node.exc.func, "id", "") == "AssertionError" and node.exc.args):
                msg = node.exc.args[0]
            if msg is not None and (template := _template(msg)) is not None:
                found.add(template)
    return sorted(found)


def _pattern(template: str) -> re.Pattern:
    """The regular expression a template's messages match, one group per field."""
    pieces = re.split(r"(\{\d+\})", template.replace("{{", "\0").replace("}}", "\1"))
    return re.compile("".join(
        "(.*?)" if _FIELD.fullmatch(p) else re.escape(p.replace("\0", "{").replace("\1", "}"))
        for p in pieces), re.S)


@functools.cache
def _message_table(lang: str) -> tuple[tuple[re.Pattern, str], ...]:
    """(pattern, translation) of every translated message template of ``lang``."""
    path = I18N_DIR / lang / "exercise_messages.json"
    table = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return tuple((_pattern(t), zh) for t, zh in table.items() if zh.strip())


def translate_message(text: str, lang: str = "zh") -> str | None:
    """A check's message in ``lang`` (its template's translation, the values put back), or
    None when no template matches.

    >>> translate_message("got 3, expected 4", "xx") is None
    True
    """
    for pattern, translated in _message_table(lang):
        if match := pattern.fullmatch(text):
            return translated.format(*match.groups())
    return None


def explain(message: str, lang: str) -> str:
    """A check's message as the exercise helper says it in ``lang``: translated, else (a bare
    value, no template) framed as it is."""
    translated = translate_message(message, lang)
    return translated if translated is not None else EXERCISE_WORDS[lang]["as_is"].format(
        why=message)
