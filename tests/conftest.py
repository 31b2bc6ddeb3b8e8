"""Hypothesis profiles and the path-based markers (LitServe's layout); shared helpers are
in tests/helpers.py."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

# Generative tests: CI runs a bounded, deterministic profile; `make fuzz` a long random one
# (HYPOTHESIS_PROFILE=fuzz). A failure found by either is kept as an explicit @example.
settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "3000")),
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The test folders mirror the package's wings; each test is marked by its folder.
WINGS = ("core", "torchserve", "tools", "integration")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.parts
        for wing in WINGS:
            if wing in parts:
                item.add_marker(getattr(pytest.mark, wing))


@pytest.fixture(autouse=True)
def _no_gc_freeze_in_the_test_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler started in-process would freeze pytest's own objects (and spend a full
    collection on each start): tests/torchserve/test_gc_freeze.py runs the real one, and
    every TorchServe a test starts freezes its worker as production does. Only where the
    adapter is imported already: the others never start a handler here."""
    mixin = sys.modules.get("ts_microbatch.torchserve.mixin")
    if mixin is not None:
        monkeypatch.setattr(mixin, "freeze_loaded", lambda: 0)
