"""A real TorchServe on free loopback ports, in a temp directory, always stopped."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.servers import (
    AUTO_CONFIG,
    AUTO_MODEL,
    BAD_CONFIG,
    BAD_MODEL,
    MODEL,
    build,
    local_server,
)
from ts_microbatch.tools.server import TorchServe, java_problem


@pytest.fixture(scope="session")
def model_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if java_problem():
        pytest.fail(java_problem() or "")
    store = tmp_path_factory.mktemp("model_store")
    work = tmp_path_factory.mktemp("build")
    build.build_mar(store, model_name=MODEL, work_dir=work / "good", archive_format="zip-store")
    no_mb_yaml = work / "model-config.yaml"
    # No micro_batching section: the YAML would otherwise win over the JSON's keys.
    no_mb_yaml.write_text("minWorkers: 1\nmaxWorkers: 1\nbatchSize: 8\nmaxBatchDelay: 50\n")
    for name, config in ((BAD_MODEL, BAD_CONFIG), (AUTO_MODEL, AUTO_CONFIG)):
        config_json = work / f"{name}.json"
        config_json.write_text(json.dumps(config))
        build.build_mar(
            store,
            model_name=name,
            work_dir=work / name,
            archive_format="zip-store",
            micro_batching_json=config_json,
            model_config=no_mb_yaml,
        )
    return store


@pytest.fixture(scope="module")
def server(model_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchServe]:
    with local_server(model_store, tmp_path_factory.mktemp("torchserve")) as ts:
        yield ts


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchServe]:
    """One TorchServe for the modules whose tests change nothing but their own model's
    traffic (the examples' servers): each builds its .mar into this server's store and
    registers it for its tests only (``servers.registered``). A start and a stop cost
    about 6 s of every such module otherwise."""
    if java_problem():
        pytest.fail(java_problem() or "")
    store = tmp_path_factory.mktemp("shared_store")
    with local_server(store, tmp_path_factory.mktemp("shared_torchserve")) as ts:
        yield ts
