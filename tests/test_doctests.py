"""Run every docstring example in minimind_lib, so the examples students read stay true.

``pkgutil.walk_packages`` goes into every package (a flat ``iter_modules`` would see only the
package ``__init__`` files and silently check less); ``test_every_module_is_collected`` holds
the collected list to the files on disk.
"""

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import minimind_lib

PACKAGE = Path(minimind_lib.__file__).parent
MODULES = sorted(
    m.name for m in pkgutil.walk_packages(minimind_lib.__path__, "minimind_lib.")
    if not m.name.endswith("__main__")
)


def test_every_module_is_collected():
    on_disk = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if parts and parts[-1] != "__main__":
            on_disk.add(".".join(("minimind_lib", *parts)))
    assert on_disk == set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
