"""The package, once installed from a wheel, has no repository around it: nothing in it may
reach into benchmarks/ or tests/, nor climb from its own files above ts_microbatch/.

The defect this pins: tune --confirm ran ``Path(__file__).resolve().parents[1] /
"benchmarks" / "benchmark-ab.py"``, which an installed package does not have (and which,
after the split into wings, pointed inside the package). What the tuner and the benchmarks
share now lives in ts_microbatch.tools (measure.py, drive.py).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT
from ts_microbatch.tools import METRICS_YAML

PACKAGE = Path(ROOT) / "ts_microbatch"
REPOSITORY_ONLY = ("benchmarks", "tests", "bench_lib", "bench_packaging", "conftest")
SOURCES = sorted(PACKAGE.rglob("*.py"))


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string nodes that are docstrings: prose may name the repository."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def repository_references(source: str) -> list[str]:
    """Imports of repository-only modules and strings (not docstrings) naming its folders."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            names = [p.removesuffix(".py") for p in node.value.replace("\\", "/").split("/")]
        else:
            continue
        found += [
            f"line {node.lineno}: {name!r}"
            for name in names
            if name.split(".")[0] in REPOSITORY_ONLY or name == "benchmark-ab"
        ]
    return found


def climbs(source: str, depth: int) -> list[str]:
    """``.parents[k]`` and ``.parent`` chains that leave a file ``depth`` folders below the
    package's own folder (ts_microbatch/ is depth 0) and go above ts_microbatch/."""
    tree = ast.parse(source)
    nested = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "parent"
    }
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "parents"
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, int)
            and node.slice.value > depth
        ):
            found.append(f"line {node.lineno}: parents[{node.slice.value}]")
        if isinstance(node, ast.Attribute) and node.attr == "parent" and id(node) not in nested:
            chain, inner = 1, node.value
            while isinstance(inner, ast.Attribute) and inner.attr == "parent":
                chain, inner = chain + 1, inner.value
            if chain > depth + 1:
                found.append(f"line {node.lineno}: .parent x {chain}")
    return sorted(found)


def test_the_checks_catch_the_defect_as_it_was() -> None:
    """What tune.py had (at ts_microbatch/tune.py, depth 0) before the shared code moved
    into the package, and the same climbs from a wing (depth 1)."""
    old = (
        "from pathlib import Path\n"
        'BENCHMARK_TOOL = Path(__file__).resolve().parents[1] / "benchmarks" / "benchmark-ab.py"\n'
        "import bench_lib\n"
        "from tests.helpers import ROOT\n"
        "ROOT = Path(__file__).parent.parent.parent\n"
    )
    assert len(repository_references(old)) == 4  # "benchmarks", "benchmark-ab.py", 2 imports
    assert climbs(old, depth=0) == ["line 2: parents[1]", "line 5: .parent x 3"]
    assert climbs(old, depth=1) == ["line 5: .parent x 3"]  # parents[1] is ts_microbatch/
    assert climbs(old, depth=2) == []
    assert repository_references('"""See benchmarks/benchmark-ab.py."""\n') == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_defect_package_reaches_into_the_repository(path: Path) -> None:
    source = path.read_text()
    depth = len(path.relative_to(PACKAGE).parts) - 1
    assert repository_references(source) == [], f"{path} names repository-only code"
    assert climbs(source, depth) == [], f"{path} climbs above ts_microbatch/"


def test_the_checks_see_every_wing() -> None:
    wings = {p.relative_to(PACKAGE).parts[0] for p in SOURCES if len(p.parts) > 1}
    assert {"core", "torchserve", "tools"} <= wings
    assert PACKAGE / "tools" / "tune.py" in SOURCES


def test_the_wheel_carries_the_metrics_config(tmp_path: Path) -> None:
    """A pip-installed ts-microbatch-benchmark or -bundle declares the pipeline's metrics
    from the package's own file: the wheel must carry it (and configs/metrics.yaml in a
    checkout is that file). Built from a copy, so no build/ is left in the checkout."""
    source = tmp_path / "source"
    shutil.copytree(PACKAGE, source / "ts_microbatch", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "README.md"):
        shutil.copy2(Path(ROOT) / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("ts_microbatch-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = archive.read("ts_microbatch/tools/metrics.yaml")
    assert shipped == METRICS_YAML.read_bytes()
    assert b"MicroBatchStageSeconds" in shipped and b"MicroBatchPaddedTokens" in shipped
    assert (Path(ROOT) / "configs" / "metrics.yaml").resolve() == METRICS_YAML.resolve()
