"""The README's section on using it in a handler says how to install it for your own model,
and what it says matches setup.py: the extras it names exist, the wheel is named after the
package's name and version, the commands it lists are the tools extra's entry points.
Before, the install line was only in docs/benchmarks.md, benchmarks/README.md and
docs/layout.md."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
IMAGE_ONLY = {"torchvision", "pillow"}
IMAGE_EXAMPLES = ("image_classifier", "object_detector", "image_segmenter")


def section(title: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def setup_keywords() -> dict[str, Any]:
    """The keyword arguments of setup.py's setup() call that are literals, or lists of
    setup.py's own module-level constants (its extras are built from ``IMAGES``, ...)."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    constants: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                constants[target.id] = ast.literal_eval(node.value)
    call = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup"
    )
    found = {}
    for keyword in call.keywords:
        expression = ast.Expression(keyword.value)
        try:
            found[keyword.arg] = eval(compile(expression, "setup.py", "eval"), {}, constants)
        except NameError:
            continue  # computed from imports (long_description, packages)
    return found


def test_the_handler_section_says_how_to_install_for_your_own_model() -> None:
    text = section("Using it in a handler")
    setup = setup_keywords()
    commands = re.findall(r"^pip (?:install|wheel) .*$", text, flags=re.M)
    assert any("[tools]" in c and "install" in c for c in commands), commands
    extras = {
        e for group in re.findall(r"\[([\w,]+)\]", " ".join(commands)) for e in group.split(",")
    }
    assert {"tools", "images"} <= extras, commands
    for extra in extras:
        assert extra in setup["extras_require"], extra
    wheel = f"{setup['name']}-{setup['version']}-py3-none-any.whl"
    assert wheel in text
    scripts = [entry.split(" = ")[0] for entry in setup["entry_points"]["console_scripts"]]
    prefix = "ts-microbatch-"
    named = {prefix + n for n in re.findall(r"`(?:ts-microbatch)?-(\w+)`", text)}
    assert named == set(scripts)
    assert "safe beside one you run" in text


def names(requirements: list[str]) -> set[str]:
    """``torchvision>=0.16`` -> ``torchvision``."""
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_install_requires_leaves_torchvision_and_pillow_to_the_images_extra() -> None:
    """A tabular or text model's server installed torchvision (issue 42, item 6): what
    every handler needs is required, what image models need is the ``images`` extra."""
    setup = setup_keywords()
    required = names(setup["install_requires"])
    assert {"torch", "torchserve", "torch-model-archiver", "pyyaml", "captum"} <= required
    assert not required & IMAGE_ONLY, required
    assert names(setup["extras_require"]["images"]) == IMAGE_ONLY
    # the suite runs the image examples: `pip install .[test]` alone must be enough
    assert names(setup["extras_require"]["test"]) >= IMAGE_ONLY


def test_the_package_imports_neither_torchvision_nor_pillow() -> None:
    """What lets them leave install_requires: importing the package and its TorchServe
    adapter (what a worker imports) loads neither. Run in a fresh interpreter that first
    finds both, so that their absence after the imports is the package's doing."""
    script = (
        "import importlib.util, sys\n"
        "assert importlib.util.find_spec('torchvision') and importlib.util.find_spec('PIL')\n"
        "import ts_microbatch.torchserve.micro_batching, ts_microbatch.torchserve.mixin\n"
        "print('imported', ts_microbatch.__file__)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torchvision', 'PIL'}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    *_, imported, loaded = proc.stdout.strip().splitlines()
    assert imported == f"imported {ROOT / 'ts_microbatch' / '__init__.py'}"
    assert loaded == "[]", proc.stdout


def test_the_image_examples_and_the_venv_name_the_images_extra() -> None:
    for example in IMAGE_EXAMPLES:
        readme = (ROOT / "examples" / example / "README.md").read_text(encoding="utf-8")
        assert "ts_microbatch[images]" in readme, example
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    venvs = re.findall(
        r"pip\S* install --quiet -e '\.\[([\w,]+)\]'", makefile.replace("$(PIP)", "pip")
    )
    assert len(venvs) == 2, venvs  # today's stack and the floor's
    for venv in venvs:
        assert {"tools", "images", "test"} <= set(venv.split(",")), venv
