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
