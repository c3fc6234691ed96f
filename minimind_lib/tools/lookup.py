"""The look-up tool (notebook 14): who wrote a poem, from the poems the course's pretraining
text ships (``data/pretrain_sample.jsonl``; licences in ``data/LICENSES/``: every entry
reads ``《title》\\n作者：author``), so an answer can be checked against the data itself.

>>> poem_author("静夜思")
'李白'
"""

from __future__ import annotations

import re
from functools import lru_cache

from minimind_lib import DATA_DIR
from minimind_lib.data.readers import read_jsonl

POEMS_FILE = DATA_DIR / "pretrain_sample.jsonl"
_ENTRY = re.compile(r"《([^》\n]{1,40})》\n作者：([^\n]{1,20})")
MAX_TITLE = 40


@lru_cache(maxsize=1)
def poem_authors() -> dict[str, tuple[str, ...]]:
    """Title -> its authors (several poets wrote a 《阙题》), read once from the bundled text."""
    table: dict[str, set[str]] = {}
    for record in read_jsonl(POEMS_FILE, "pretrain"):
        for title, author in _ENTRY.findall(record["text"]):
            table.setdefault(title.strip(), set()).add(author.strip())
    return {title: tuple(sorted(authors)) for title, authors in table.items()}


def poem_author(title: object) -> str:
    """The author of the poem ``title`` (with or without 《》); several, joined by 、."""
    if not isinstance(title, str):
        raise ValueError(f"title must be a string, got {type(title).__name__}")
    key = title.strip().strip("《》").strip()
    if not key or len(key) > MAX_TITLE:
        raise ValueError(f"title must be 1-{MAX_TITLE} characters")
    authors = poem_authors().get(key)
    if authors is None:
        raise ValueError(f"no poem titled 《{key}》 in the course's poems")
    return "、".join(authors)
