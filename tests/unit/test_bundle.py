"""The KServe bundle: what the .mar carries, what config.properties says."""

from __future__ import annotations

import json

from ts_microbatch.bundle import TOOLING, kserve_properties, worker_modules


def test_the_mar_carries_worker_modules_and_no_tooling() -> None:
    modules = worker_modules()
    assert {"__init__", "pipeline", "micro_batching", "mixin", "protocols"} <= set(modules)
    assert not set(modules) & set(TOOLING)  # tooling imported by the worker would break it


def test_config_properties_as_kserve_runs_them() -> None:
    text = kserve_properties("m.mar", "m", batch_size=32, max_batch_delay_ms=50)
    props = dict(line.split("=", 1) for line in text.splitlines())
    assert props["inference_address"] == "http://0.0.0.0:8085"
    assert props["enable_envvars_config"] == "false"  # TS_SERVICE_ENVELOPE stays unread
    assert props["metrics_mode"] == "prometheus"
    model = json.loads(props["model_snapshot"])["models"]["m"]["1.0"]
    assert model["batchSize"] == 32 and model["maxBatchDelay"] == 50
    assert model["marName"] == "m.mar" and model["minWorkers"] == 1
