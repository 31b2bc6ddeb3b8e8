"""The fraud scorer's stages (examples/tabular_scorer/tabular_handler.py, beside this file
in the .mar) under upstream's MicroBatching (TorchServe 0.12.0) instead of ours, for the
latency study's ``tabular`` workload (benchmarks/latency_load.py) and ``benchmark-ab.py
--handler-variant upstream=benchmarks/handlers/upstream_tabular_handler.py``.

``handle`` is upstream's ``ts.handler_utils.micro_batching.MicroBatching``: it cuts a
frontend batch into micro-batches of ``micro_batch_size`` in arrival order, on the threads
of ``parallelism``. Both are read as upstream's example reads them, from the
``micro_batching`` settings: the example packs them in micro_batching.json, so that file is
read first and a ``micro_batching:`` section of model-config.yaml over it (where
ts_microbatch.tools.mar puts an override). No ts_microbatch code runs.
"""

import json
import os

from tabular_handler import TabularScorerHandler  # the example's handler, in the same .mar
from ts.handler_utils.micro_batching import MicroBatching
from ts.torch_handler.base_handler import BaseHandler


class UpstreamTabularHandler(BaseHandler):
    preprocess = TabularScorerHandler.preprocess
    inference = TabularScorerHandler.inference
    postprocess = TabularScorerHandler.postprocess

    def __init__(self):
        super().__init__()
        self.handle = MicroBatching(self)  # TorchServe takes handle as the entry point

    def initialize(self, context):
        super().initialize(context)
        section = {}
        path = os.path.join(context.system_properties["model_dir"], "micro_batching.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                section.update(json.load(f))
        section.update((context.model_yaml_config or {}).get("micro_batching") or {})
        if section.get("parallelism"):
            self.handle.parallelism = section["parallelism"]
        self.handle.micro_batch_size = section.get("micro_batch_size", 1)
