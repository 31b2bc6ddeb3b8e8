"""A model directory loaded in this process as TorchServe's backend worker loads it: for
worker_ab.py and pipeline_overhead.py, which time ``Service.predict`` with no frontend."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def load_worker_service(directory: Path, model_name: str, handler: str, batch_size: int) -> Any:
    """A model directory loaded as TorchServe's backend worker loads it (its metrics cache,
    its model loader), in this process, from that directory; returns the ``Service``."""
    import os

    import ts
    from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
    from ts.model_loader import TsModelLoader

    metrics = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
    metrics.initialize_cache()
    sys.path.insert(0, str(directory))
    os.chdir(directory)
    service = TsModelLoader().load(
        model_name, str(directory), handler, None, batch_size, None, metrics_cache=metrics
    )
    service.set_cl_socket(None)
    return service
