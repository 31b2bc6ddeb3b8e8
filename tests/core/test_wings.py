"""The floor plan: the core knows no TorchServe, and no wing reaches into tools/."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import ts_microbatch

PACKAGE = Path(ts_microbatch.__file__).resolve().parent


def imports(path: Path) -> set[str]:
    """The modules ``path`` imports, relative ones resolved against the package."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = parts[: len(parts) - node.level] if node.level else ()
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            found.add(module)
    return found


def test_core_imports_neither_torchserve_nor_the_other_wings() -> None:
    for path in sorted((PACKAGE / "core").glob("*.py")):
        bad = {
            m
            for m in imports(path)
            if m == "ts"
            or m.startswith("ts.")
            or m.startswith("ts_microbatch.torchserve")
            or m.startswith("ts_microbatch.tools")
        }
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_worker_wings_never_import_tools() -> None:
    for wing in ("core", "torchserve"):
        for path in sorted((PACKAGE / wing).glob("*.py")):
            bad = {m for m in imports(path) if m.startswith("ts_microbatch.tools")}
            assert not bad, f"{wing}/{path.name} imports {sorted(bad)}"


def test_importing_the_core_leaves_ts_unimported() -> None:
    code = (
        "import sys, importlib, pkgutil, ts_microbatch.core as core;"
        "[importlib.import_module(f'ts_microbatch.core.{m.name}')"
        " for m in pkgutil.iter_modules(core.__path__)];"
        "assert 'ts' not in sys.modules, 'ts imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports() -> dict[str, set[str]]:
    """Each package module and the package modules it imports (``from . import x`` counts
    as importing the submodule x), type-only and function-local imports included."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        parts = tuple(name.split(".")) + (("__init__",) if is_package else ())
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = parts[: len(parts) - node.level] if node.level else ()
                module = ".".join([*base, *(node.module.split(".") if node.module else [])])
                for alias in node.names:
                    child = f"{module}.{alias.name}"
                    found.add(child if child in modules else module)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def test_no_import_loop_anywhere_in_the_package() -> None:
    """A module importing one that imports it back (even for a type only) reads as one
    module split in two; the package's __init__ re-exports, so imports of it are left out."""
    graph = {
        module: {m for m in imported if m != "ts_microbatch"}
        for module, imported in package_imports().items()
        if module != "ts_microbatch"
    }
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError(" -> ".join(path[path.index(module) :] + [module]))
        if module in done:
            return
        for imported in sorted(graph.get(module, ())):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
