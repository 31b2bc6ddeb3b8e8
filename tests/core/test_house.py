"""The size of the house: limits a reader relies on, checked so that they stay.

A front page read in five minutes (README.md at most 200 lines), a benchmarks page at most
300, no package module over 400 lines, the tools wing at most 4,000, and the benchmark
scripts a user reads at most 3,500 (developers' diagnostics and studies run once live in
``benchmarks/dev/``); docs/layout.md names every module there is. The plain body's way
through the package is counted in ``tests/torchserve/test_body_way.py``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ts_microbatch

PACKAGE = Path(ts_microbatch.__file__).resolve().parent
ROOT = PACKAGE.parent


def lines(paths: list[Path]) -> int:
    return sum(len(path.read_text(encoding="utf-8").splitlines()) for path in paths)


@pytest.mark.parametrize(("page", "limit"), [("README.md", 200), ("docs/benchmarks.md", 300)])
def test_pages_stay_short(page: str, limit: int) -> None:
    assert lines([ROOT / page]) <= limit


def test_no_module_over_400_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): count
        for path in sorted(PACKAGE.rglob("*.py"))
        if (count := lines([path])) > 400
    }
    assert not long


@pytest.mark.xfail(
    strict=True,
    reason="issue 42: the tools wing is 5,098 lines; 4,000 needs a capability removed that "
    "users reach (the latency tuner, the open-loop curves, the benchmark); when it passes, "
    "this marker goes",
)
def test_the_tools_wing_stays_under_4000_lines() -> None:
    assert lines(sorted((PACKAGE / "tools").glob("*.py"))) <= 4000


def test_the_benchmark_scripts_a_user_reads_stay_under_3500_lines() -> None:
    bench = ROOT / "benchmarks"
    scripts = sorted([*bench.glob("*.py"), *bench.glob("*.sh")])
    assert scripts, bench
    assert lines(scripts) <= 3500


@pytest.mark.parametrize("wing", ["core", "torchserve", "tools"])
def test_the_layout_page_names_every_module_of_a_wing_and_no_other(wing: str) -> None:
    """docs/layout.md draws the house as it is: its row for a wing names each module there."""
    page = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    (row,) = [line for line in page.splitlines() if line.startswith(f"| `ts_microbatch/{wing}/`")]
    named = set(re.findall(r"`(\w+\.py)`", row))
    present = {path.name for path in (PACKAGE / wing).glob("*.py")} - {"__init__.py"}
    assert named == present, {"not on the page": present - named, "gone": named - present}
