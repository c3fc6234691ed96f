"""minimind_lib: the finished code of the *MiniMind from Scratch* course.

Each module holds one concept built in a notebook (see ``DESIGN.md`` / README):
``tokenizer`` (01), ``model`` (02-03), ``train`` (04), ``data`` (00, 04-06),
``dpo`` (06), ``quantize`` (07), ``serve`` (08).  Import the module you need::

    from minimind_lib.profiles import get_profile
    profile = get_profile("smoke")
"""

from pathlib import Path

__version__ = "0.1.0"

#: The repository root (the package is installed editable from a clone).
REPO_ROOT = Path(__file__).resolve().parents[1]
#: Bundled sample data, built by ``scripts/build_data.py``.
DATA_DIR = REPO_ROOT / "data"
