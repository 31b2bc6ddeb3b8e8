"""Upstream's micro-batching example handler (TorchServe 0.12.0), for side-by-side benchmarks.

Reads micro_batch_size and parallelism from the `micro_batching:` section of
model-config.yaml, as upstream's example does.
"""

from ts.handler_utils.micro_batching import MicroBatching
from ts.torch_handler.image_classifier import ImageClassifier


class UpstreamMicroBatchingHandler(ImageClassifier):
    def __init__(self):
        self.handle = MicroBatching(self)

    def initialize(self, ctx):
        super().initialize(ctx)
        section = ctx.model_yaml_config.get("micro_batching", {})
        if section.get("parallelism"):
            self.handle.parallelism = section["parallelism"]
        self.handle.micro_batch_size = section.get("micro_batch_size", 1)
