"""The notebooks' files, read as text: no template placeholder (``{CPU_SEE}``) left unfilled in
a markdown cell, and every cell with its id, in the notebooks and their solutions."""

from __future__ import annotations

import json
import re

from minimind_lib import REPO_ROOT

PLACEHOLDER = re.compile(r"\{[A-Z][A-Z0-9]*_[A-Z0-9_]+\}")


def test_no_placeholder_is_left_in_the_prose():
    notebooks = sorted(REPO_ROOT.glob("notebooks/**/[0-9][0-9]_*.ipynb"))
    assert len(notebooks) >= 14
    left = {}
    for path in notebooks:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        if found := PLACEHOLDER.findall(text):
            left[str(path.relative_to(REPO_ROOT))] = sorted(set(found))
    assert not left, f"fill in the measured figures: {left}"


def test_every_cell_has_an_id():
    """nbformat 4.5 requires cell ids (a missing one is a warning today, an error later)."""
    for path in sorted(REPO_ROOT.glob("notebooks/**/[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        missing = [i for i, c in enumerate(cells) if not c.get("id")]
        assert not missing, f"{path.relative_to(REPO_ROOT)}: cells {missing} have no id"
