"""Shared fixtures; the path-based markers follow LitServe's layout."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_module(relative_path: str, name: str) -> ModuleType:
    """Imports a file of the repository that is not in a package (handlers, examples)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, relative_path))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = str(item.path)
        if f"{os.sep}integration{os.sep}" in path:
            item.add_marker(pytest.mark.integration)
        elif f"{os.sep}handlers{os.sep}" in path:
            item.add_marker(pytest.mark.handlers)
