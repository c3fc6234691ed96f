"""Build the translated notebooks from the English ones and their translation files.

    python scripts/build_i18n.py                 # notebooks/zh/*.ipynb (and README.zh.md)
    python scripts/build_i18n.py --check         # say what is missing or drifted, write nothing
    python scripts/build_i18n.py --skeleton NN   # add the untranslated cells of notebook NN to
                                                 # notebooks/i18n/zh/NN_name.json (zh empty);
                                                 # solutions/NN for a worked answers notebook

Every markdown cell needs a translation whose ``en_sha256`` matches today's English text
(``minimind_lib.course.i18n``); the numbers, LaTeX and code spans of each pair must agree
(``same_facts``). A problem names the notebook, the cell and the first changed line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from minimind_lib.course import i18n


def skeleton(prefix: str, lang: str) -> Path:
    """Add every markdown cell of notebook ``prefix`` (or each README part, for ``README``)
    that has no up-to-date translation, with its English text and an empty translation, to
    its translation file."""
    if prefix == "README":
        english = i18n.REPO_ROOT / "README.md"
        texts = i18n.readme_parts(english.read_text(encoding="utf-8"))
    else:
        (english,) = [p for p in i18n.english_notebooks()
                      if str(p.relative_to(i18n.NOTEBOOKS)).startswith(prefix)]
        nb = json.loads(english.read_text(encoding="utf-8"))
        texts = {c["id"]: "".join(c["source"]) for c in nb["cells"]
                 if c["cell_type"] == "markdown"}
    path = i18n.translation_path(english, lang)
    data = (json.loads(path.read_text(encoding="utf-8")) if path.is_file()
            else {"notebook": english.name, "cells": {}})
    for cell_id, text in texts.items():
        entry = data["cells"].get(cell_id, {})
        if entry.get("en_sha256") != i18n.sha(text):
            data["cells"][cell_id] = {"en_sha256": i18n.sha(text), "en": text,
                                      lang: entry.get(lang, "")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(i18n.dumps(data), encoding="utf-8")
    return path


def problems(lang: str) -> list[str]:
    """Every missing, drifted or unfaithful translation, one line each."""
    return ([p for english in i18n.english_notebooks()
             for p in i18n.notebook_problems(english, lang)] + i18n.readme_problems(lang))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lang", default="zh", choices=i18n.LANGUAGES)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--skeleton", metavar="NN", default=None)
    args = parser.parse_args()
    if args.skeleton:
        print(skeleton(args.skeleton, args.lang))
        return 0
    if args.check:
        found = problems(args.lang)
        print("\n".join(found) or "every translation is present, current and faithful")
        return 1 if found else 0
    for english in i18n.english_notebooks():
        out = i18n.twin_path(english, args.lang)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(i18n.dumps(i18n.build_notebook(english, args.lang)), encoding="utf-8")
        print(out)
    readme = i18n.build_readme(args.lang)
    print(readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
