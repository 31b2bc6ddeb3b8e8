"""The detection example's handler (examples/object_detector/detector_handler.py, beside
this file in the .mar) under upstream's MicroBatching (TorchServe 0.12.0) instead of ours:
the same list-returning preprocess, inference and postprocess, for benchmark-ab.py
``--handler-variant upstream=benchmarks/handlers/upstream_detector_handler.py``. Reads
micro_batch_size and parallelism from the micro_batching section, as upstream's example."""

from detector_handler import DetectorHandler
from ts.handler_utils.micro_batching import MicroBatching
from ts.torch_handler.object_detector import ObjectDetector


class UpstreamDetectorHandler(DetectorHandler):
    def __init__(self):
        super().__init__()
        self.handle = MicroBatching(self)

    def initialize(self, context):
        settings = (context.model_yaml_config or {}).get("handler") or {}
        self.threshold = float(settings.get("threshold", ObjectDetector.threshold))
        self.decimals = int(settings.get("decimals", self.decimals))
        ObjectDetector.initialize(self, context)  # not the mixin's: no pipeline of ours
        section = context.model_yaml_config.get("micro_batching", {})
        if section.get("parallelism"):
            self.handle.parallelism = section["parallelism"]
        self.handle.micro_batch_size = section.get("micro_batch_size", 1)
