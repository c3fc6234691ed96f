"""Run every docstring example in minimind_lib, so the examples students read stay true."""

import doctest
import importlib
import pkgutil

import pytest

import minimind_lib

MODULES = sorted(
    m.name for m in pkgutil.iter_modules(minimind_lib.__path__, "minimind_lib.")
    if not m.name.endswith("__main__")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
