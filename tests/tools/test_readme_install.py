"""The README's section on using it in a handler says how to install it for your own model,
and what it says matches setup.py: the extras it names exist, the wheel is named after the
package's name and version, the commands it lists are the tools extra's entry points.
Before, the install line was only in docs/benchmarks.md, benchmarks/README.md and
docs/layout.md."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def section(title: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def setup_keywords() -> dict[str, Any]:
    """The keyword arguments of setup.py's setup() call, as literals where they are."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    call = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup"
    )
    found = {}
    for keyword in call.keywords:
        try:
            found[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            continue  # computed (long_description, packages)
    return found


def test_the_handler_section_says_how_to_install_for_your_own_model() -> None:
    text = section("Using it in a handler")
    setup = setup_keywords()
    commands = re.findall(r"^pip (?:install|wheel) .*$", text, flags=re.M)
    assert any("[tools]" in c and "install" in c for c in commands), commands
    for extra in re.findall(r"\[(\w+)\]", " ".join(commands)):
        assert extra in setup["extras_require"], extra
    wheel = f"{setup['name']}-{setup['version']}-py3-none-any.whl"
    assert wheel in text
    scripts = [entry.split(" = ")[0] for entry in setup["entry_points"]["console_scripts"]]
    prefix = "ts-microbatch-"
    named = {prefix + n for n in re.findall(r"`(?:ts-microbatch)?-(\w+)`", text)}
    assert named == set(scripts)
    assert "safe beside one you run" in text
