"""TorchServe's own ImageClassifier, untouched, with ts_microbatch's pipeline in front: the
exact stages upstream's example handler (upstream_mb_handler.py) runs, so that a comparison of
the two measures the pipelines and nothing else (benchmarks/dev/worker_ab.py; compare.py
writes the same handler into its models)."""

from ts.torch_handler.image_classifier import ImageClassifier

from ts_microbatch import MicroBatchingMixin


class MixinImageClassifier(MicroBatchingMixin, ImageClassifier):  # type: ignore[misc]
    pass
