"""``freeze_gc``: a worker's loaded model moved out of the garbage collector's way once it
is loaded and warmed, through TorchServe's own loader (ts_microbatch.torchserve._gc)."""

from __future__ import annotations

import gc
import logging
from pathlib import Path
from typing import Any

import pytest

from tests.compiled_model import build
from tests.torchserve.ts_machinery import load_service
from ts_microbatch import ConfigError
from ts_microbatch.torchserve import _gc, mixin


def load(tmp_path: Path, micro_batching: dict[str, Any]) -> Any:
    config = build.model_config(micro_batching, compiled=False)
    directory = build.model_dir(tmp_path / "tiny", config)
    service = load_service(directory, model_name="tiny", handler="tiny_handler.py")
    return service._entry_point.__self__


@pytest.fixture
def real_freeze(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The real freeze (conftest stubs it in the test process), undone after."""
    monkeypatch.setattr(mixin, "freeze_loaded", _gc.freeze_loaded)
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_loaded_worker_freezes_its_objects_once_warmed(
    tmp_path: Path, real_freeze: None, caplog: pytest.LogCaptureFixture
) -> None:
    assert gc.get_freeze_count() == 0  # the scenario starts unfrozen
    with caplog.at_level(logging.INFO, logger=_gc.__name__):
        handler = load(tmp_path, {"warmup": {"iterations": 1}})
    try:
        frozen = gc.get_freeze_count()
        # torch, TorchServe and the model: far more than a bare interpreter's few thousand.
        assert frozen > 50_000
        logged = [r.getMessage() for r in caplog.records if r.name == _gc.__name__]
        assert len(logged) == 1 and "objects moved out of the garbage collector's way" in logged[0]
        gc.collect()  # a full collection leaves them where they are
        assert gc.get_freeze_count() >= frozen - 100  # a few freed since by their refcount
    finally:
        handler.micro_batching.shutdown()


def test_freeze_gc_false_leaves_the_collector_as_it_was(tmp_path: Path, real_freeze: None) -> None:
    handler = load(tmp_path, {"freeze_gc": False})
    try:
        assert gc.get_freeze_count() == 0
    finally:
        handler.micro_batching.shutdown()


def test_a_freeze_gc_that_is_not_a_boolean_fails_the_load_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="micro_batching.freeze_gc: got 'yes'"):
        load(tmp_path, {"freeze_gc": "yes"})
