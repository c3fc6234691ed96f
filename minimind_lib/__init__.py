"""minimind_lib: the finished code of the *MiniMind from Scratch* course.

Each module holds one concept built in a notebook: ``tokenizer`` (01), ``model`` (02-03),
``train`` (04), ``data`` (00, 04-06), ``sft`` (05), ``dpo`` (06), ``quantize`` (07),
``inference`` and ``serve`` (08). The stage layer above them (``stages``, ``pipeline``) runs the
course end to end. ``minimind_lib/README.md`` draws the layers and says where new code goes.
Import the module you need::

    from minimind_lib.course.profiles import get_profile
    profile = get_profile("smoke")
"""

from pathlib import Path

__version__ = "0.1.0"

#: The repository root (the package is installed editable from a clone).
REPO_ROOT = Path(__file__).resolve().parents[1]
#: Bundled sample data, built by ``scripts/build_data.py``.
DATA_DIR = REPO_ROOT / "data"
