"""The library's shape: packages in layers, no import cycle (module or package), short modules
and functions, and one home for each special-token string (docs/architecture.md draws it).

Run as a script to print the layers, the package arrows and the module sizes:
``python tests/test_layout.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

#: read from the source, not imported, so the checks run even when an import would fail
PACKAGE = Path(__file__).resolve().parents[1] / "minimind_lib"
#: the layers, bottom first: a module imports only from its own layer and the ones below it
LAYERS = ("core", "tokenizer", "model", "data", "tools", "evaluation", "training", "vision",
          "inference", "course", "__main__")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600
#: the exercise checks of all notebooks, one after another: long, but flat (no logic to split)
LONG_MODULES = {"course.exercises"}


def module_name(path: Path) -> str:
    """``model/decoder.py -> 'model.decoder'``, ``model/__init__.py -> 'model'``; the root
    ``__init__.py`` (REPO_ROOT, DATA_DIR) is ``''``."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
PACKAGES = {module_name(p) for p in PACKAGE.rglob("__init__.py")}


def layer(name: str) -> int:
    """The layer index of a module; the root package (``DATA_DIR``) sits with ``core``."""
    return LAYERS.index(name.split(".")[0]) if name else 0


def _tree(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(encoding="utf-8"))


def _target(module: str, name: str | None = None) -> str | None:
    """The library module ``from minimind_lib.<module> import <name>`` reads."""
    dotted = module.removeprefix("minimind_lib").removeprefix(".")
    if name and (f"{dotted}.{name}" if dotted else name) in MODULES:
        return f"{dotted}.{name}" if dotted else name
    return dotted if dotted in MODULES else None


def import_targets(name: str) -> list[tuple[str, int]]:
    """``(module, line)`` of each library import in ``name``: top level, inside functions, or
    under ``TYPE_CHECKING`` (each counts: a function-level import still ties the two)."""
    found = []
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "minimind_lib":
            found += [(t, node.lineno) for a in node.names
                      if (t := _target(node.module, a.name)) is not None]
        elif isinstance(node, ast.Import):
            found += [(t, node.lineno) for a in node.names
                      if a.name.startswith("minimind_lib.") and (t := _target(a.name))]
    return [(t, line) for t, line in found if t != name]


def imports(name: str) -> set[str]:
    """The modules ``name`` imports, plus the package ``__init__`` each of them runs first
    (not ``name``'s own packages, which are already running when ``name`` is imported)."""
    own = {".".join(name.split(".")[:k]) for k in range(len(name.split(".")))}
    found = set()
    for target, _ in import_targets(name):
        parts = target.split(".")
        found |= {".".join(parts[:k]) for k in range(1, len(parts) + 1)} - own
    return found - {name}


def import_floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Floor 0 imports nothing in ``graph``; floor k imports only floors below k. A node on a
    cycle never gets a floor (it is missing from the result)."""
    floors: dict[str, int] = {}
    while True:
        ready = {n: 1 + max((floors[d] for d in deps), default=-1) for n, deps in graph.items()
                 if n not in floors and all(d in floors for d in deps)}
        if not ready:
            return floors
        floors.update(ready)


def module_graph() -> dict[str, set[str]]:
    return {name: imports(name) & set(MODULES) for name in MODULES}


def package_graph() -> dict[str, set[str]]:
    """Top-level package -> the packages it imports (``inference.serve`` is ``inference``)."""
    graph: dict[str, set[str]] = {}
    for name, deps in module_graph().items():
        top = name.split(".")[0] or "core"
        graph.setdefault(top, set()).update(d.split(".")[0] or "core" for d in deps)
    return {p: deps - {p} for p, deps in graph.items()}


def test_no_import_cycle_between_modules():
    graph = module_graph()
    floors = import_floors(graph)
    assert set(floors) == set(graph), f"on an import cycle: {sorted(set(graph) - set(floors))}"


def test_no_import_cycle_between_packages():
    graph = package_graph()
    floors = import_floors(graph)
    assert set(floors) == set(graph), f"on an import cycle: {sorted(set(graph) - set(floors))}"


def test_no_module_imports_a_higher_layer():
    """Concepts (tokenizer, model, data) never know how they are trained, served or run by the
    course; only ``course`` and the CLI know about stages and profiles."""
    upward = [f"{name} ({MODULES[name].relative_to(PACKAGE)}:{line}) imports {target}"
              for name in MODULES for target, line in import_targets(name)
              if layer(target) > layer(name)]
    assert not upward, upward


def test_library_code_imports_from_the_defining_module():
    """A package ``__init__`` only re-exports names for students and tests; inside the library
    an import names the module that defines the thing (so ``__init__`` files add no arrows)."""
    through_init = [f"{name}:{line} imports from package {target}"
                    for name in MODULES if name not in PACKAGES
                    for target, line in import_targets(name) if target and target in PACKAGES]
    assert not through_init, through_init


def test_no_module_over_600_lines():
    long = {name: len(path.read_text(encoding="utf-8").splitlines())
            for name, path in MODULES.items() if name not in LONG_MODULES}
    assert max(long.values()) <= MAX_MODULE_LINES, {n: k for n, k in long.items()
                                                    if k > MAX_MODULE_LINES}


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
    """``tokenizer.special`` defines them, beside the chat template (Jinja text, which cannot
    name a Python constant) that spells them."""
    from minimind_lib.tokenizer import SPECIAL_TOKENS
    from minimind_lib.tokenizer.special import TOOL_AND_THINK_TOKENS

    markers = SPECIAL_TOKENS + TOOL_AND_THINK_TOKENS
    holders = {name for name in MODULES
               if any(tok in s for s in _code_strings(_tree(name)) for tok in markers)}
    assert holders == {"tokenizer.special"}, holders


def test_the_layout_check_sees_a_cycle_and_an_upward_import(tmp_path, monkeypatch):
    """The checks above can fail: two modules importing each other have no floor, and a model
    module importing the course is upward."""
    (tmp_path / "a.py").write_text("from minimind_lib.model.b import f\n")
    (tmp_path / "b.py").write_text("def f():\n    from minimind_lib.model.a import x\n"
                                   "    from minimind_lib.course import profiles\n")
    monkeypatch.setitem(MODULES, "model.a", tmp_path / "a.py")
    monkeypatch.setitem(MODULES, "model.b", tmp_path / "b.py")
    floors = import_floors(module_graph())
    assert "model.a" not in floors and "model.b" not in floors and floors["core.filenames"] == 0
    assert ("course.profiles", 3) in import_targets("model.b")
    assert layer("course.profiles") > layer("model.b")


if __name__ == "__main__":
    graph = package_graph()
    for package, floor in sorted(import_floors(graph).items(), key=lambda kv: (kv[1], kv[0])):
        print(f"floor {floor}: {package:10s} -> {', '.join(sorted(graph[package]))}")
    print(f"{sum(len(d) for d in graph.values())} package arrows; "
          f"{sum(len(d) for d in module_graph().values())} module arrows")
    for name, path in sorted(MODULES.items(), key=lambda kv: -len(kv[1].read_text().splitlines())):
        print(f"{name or '(root)':28s} "
              f"{len(path.read_text(encoding='utf-8').splitlines()):5d} lines")
