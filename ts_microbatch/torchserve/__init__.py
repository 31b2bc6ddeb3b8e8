"""The TorchServe adapter: what runs inside a TorchServe worker on top of the core
(``MicroBatching``, ``MicroBatchingMixin``, the per-batch context, answers and status codes,
KServe v1/v2 bodies, TorchServe metrics, compiled-model rules)."""
