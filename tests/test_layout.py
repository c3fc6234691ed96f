"""The library's shape: concepts below, stages above, no import cycle, short functions, and
one home for each special-token string (minimind_lib/README.md draws the layers).

Run as a script to print the import floors: ``python tests/test_layout.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import minimind_lib
from minimind_lib.tokenizer import SPECIAL_TOKENS

PACKAGE = Path(minimind_lib.__file__).parent
MODULES = {p.stem: p for p in sorted(PACKAGE.glob("*.py"))}
#: the stage layer and what sits above it; every other module is a concept (or a helper of one)
UPPER = {"profiles", "plan", "stages", "pipeline", "report", "exercises", "__main__"}
MAX_FUNCTION_LINES = 80


def _tree(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(encoding="utf-8"))


def imports(name: str) -> set[str]:
    """The minimind_lib modules ``name`` imports anywhere: top level, inside functions, or
    under ``TYPE_CHECKING`` (each counts: a function-level import still ties the two)."""
    found = set()
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "minimind_lib":
                found |= {a.name for a in node.names if a.name in MODULES}
            elif node.module.startswith("minimind_lib."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names
                      if a.name.startswith("minimind_lib.")}
    return found - {name, "__init__"}


def import_floors() -> dict[str, int]:
    """Floor 0 imports no library module; floor k imports only floors below k. A module on a
    cycle never gets a floor (it is missing from the result)."""
    graph = {name: imports(name) for name in MODULES}
    floors: dict[str, int] = {}
    while True:
        ready = {n: 1 + max((floors[d] for d in deps), default=-1) for n, deps in graph.items()
                 if n not in floors and all(d in floors for d in deps)}
        if not ready:
            return floors
        floors.update(ready)


def test_no_import_cycle():
    floors = import_floors()
    assert set(floors) == set(MODULES), f"on an import cycle: {sorted(set(MODULES) - set(floors))}"


def test_concepts_never_import_the_stage_layer():
    for name in set(MODULES) - UPPER:
        wrong = imports(name) & UPPER
        assert not wrong, f"concept module {name} imports {sorted(wrong)} (the stage layer)"


def test_no_function_over_80_lines():
    long = []
    for name in MODULES:
        for node in ast.walk(_tree(name)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert not long, long


def _code_strings(tree: ast.Module) -> list[str]:
    """String constants in code, docstrings left out (examples may show special tokens)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and id(n) not in docstrings]


def test_special_token_strings_live_in_the_tokenizer_only():
    holders = {name for name in MODULES
               if any(tok in s for s in _code_strings(_tree(name)) for tok in SPECIAL_TOKENS)}
    assert holders == {"tokenizer"}, holders


def test_the_layout_check_sees_a_cycle(tmp_path, monkeypatch):
    """The checks above can fail: two modules importing each other have no floor."""
    (tmp_path / "a.py").write_text("from minimind_lib import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from minimind_lib.a import x\n")
    monkeypatch.setattr(__import__(__name__), "MODULES",
                        {**MODULES, "a": tmp_path / "a.py", "b": tmp_path / "b.py"})
    floors = import_floors()
    assert "a" not in floors and "b" not in floors and floors["model"] == 0


if __name__ == "__main__":
    by_floor: dict[int, list[str]] = {}
    for module, floor in import_floors().items():
        by_floor.setdefault(floor, []).append(module)
    for floor in sorted(by_floor):
        print(f"floor {floor}: {', '.join(sorted(by_floor[floor]))}")
    for name, path in MODULES.items():
        print(f"{name:12s} {len(path.read_text(encoding='utf-8').splitlines()):5d} lines")
