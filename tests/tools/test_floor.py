"""The oldest stack the package claims: the official TorchServe 0.12.0 image's Python 3.9
with torch 2.4.0 (issue 48). ``make test`` runs the suite on today's stack and the part of
it the Makefile's FLOOR_TESTS declares on that one, this module included.

The defect this pins: on Python 3.9 ``import ts_microbatch`` failed (``typing.Concatenate``,
then a ``str | None`` alias evaluated at import), so no handler that imports the package
could start a worker in the image, and nothing had ever run there. vermin finds syntax and
standard-library names newer than the floor; what it cannot see (an alias evaluated at
import, an attribute such as ``code.co_qualname``) is found by importing every module and
running the floor's tests on 3.9.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.helpers import ROOT

FLOOR_PYTHON = (3, 9)
# Everything of ours that a Python runs: the package, the handlers, the examples, the
# benchmarks, the deploy scripts and the tests themselves.
TREES = ("ts_microbatch", "handlers", "examples", "benchmarks", "deploy", "tests", "setup.py")


def makefile_pins(variable: str) -> dict[str, Version]:
    """The ``name==version`` pins of one Makefile variable (TORCH_PINS, FLOOR_TORCH_PINS)."""
    text = Path(ROOT, "Makefile").read_text()
    line = re.search(rf"^{variable} :?= (.+)$", text, flags=re.M)
    assert line, f"{variable} is not in the Makefile"
    pins = [Requirement(pin) for pin in line.group(1).split()]
    return {pin.name: Version(next(iter(pin.specifier)).version) for pin in pins}


def test_no_syntax_or_standard_library_name_is_newer_than_the_floor() -> None:
    vermin = shutil.which("vermin", path=str(Path(sys.executable).parent))
    assert vermin, "vermin is in the test extra: pip install -e '.[test]'"
    target = "{}.{}".format(*FLOOR_PYTHON)
    out = subprocess.run(
        [vermin, f"-t={target}-", "--violations", "--no-tips", *TREES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"Minimum required versions: {target}" in out.stdout, out.stdout


def test_every_module_of_the_package_imports_on_this_stack() -> None:
    # In a fresh interpreter, each module on its own: an alias or a default evaluated at
    # import fails here, whichever module imports it first in a worker.
    script = (
        "import importlib, pkgutil, ts_microbatch\n"
        "failed = []\n"
        "for info in pkgutil.walk_packages(ts_microbatch.__path__, 'ts_microbatch.'):\n"
        "    if info.name.endswith('.__main__'):\n"
        "        continue\n"
        "    try:\n"
        "        importlib.import_module(info.name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{info.name}: {exc!r}')\n"
        "print('\\n'.join(failed) or 'ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert out.stdout.strip() == "ok", out.stdout + out.stderr


def test_the_package_claims_the_two_stacks_ci_tests_and_no_more() -> None:
    # python_requires and install_requires state what is tested: the floor's Python and
    # torch are their lower ends, today's stack lies inside, nothing past it is claimed.
    meta = metadata.metadata("ts_microbatch")
    python = meta["Requires-Python"]
    assert python is not None
    requires = {r.name: r for r in map(Requirement, metadata.requires("ts_microbatch") or [])}
    floor, today = makefile_pins("FLOOR_TORCH_PINS"), makefile_pins("TORCH_PINS")
    assert Requirement(f"x{python}").specifier == Requirement("x>=3.9,<3.12").specifier
    for name in ("torch", "torchvision"):
        specifier = requires[name].specifier
        assert floor[name] in specifier and today[name] in specifier, (name, specifier)
        lower = [s for s in specifier if s.operator == ">="]
        assert [Version(s.version) for s in lower] == [floor[name]], (name, specifier)
        upper = Version(f"{today[name].major}.{today[name].minor + 1}")
        assert upper not in specifier, (name, specifier)


def test_this_stack_is_one_the_package_claims() -> None:
    import torch

    meta = metadata.metadata("ts_microbatch")
    requires = {r.name: r for r in map(Requirement, metadata.requires("ts_microbatch") or [])}
    here = ".".join(map(str, sys.version_info[:3]))
    assert Version(here) in Requirement(f"x{meta['Requires-Python']}").specifier
    assert Version(torch.__version__.split("+")[0]) in requires["torch"].specifier


@pytest.mark.skipif(sys.version_info[:2] != FLOOR_PYTHON, reason="runs on the floor's stack")
def test_the_floor_runs_the_official_images_torch() -> None:
    import torch
    import torchvision

    floor = makefile_pins("FLOOR_TORCH_PINS")
    assert Version(torch.__version__.split("+")[0]) == floor["torch"]
    assert Version(torchvision.__version__.split("+")[0]) == floor["torchvision"]
