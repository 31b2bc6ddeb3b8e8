"""The BERT example's stages run by upstream's MicroBatching (TorchServe 0.12.0), for the
side-by-side text benchmark (docs/benchmarks.md, "Text of variable length").

benchmark-ab.py ``--handler-variant upstream=benchmarks/handlers/upstream_bert_handler.py``
puts this file beside the example's bert_handler.py in the .mar. The preprocess, inference
and postprocess are the example's own; only ``handle`` is upstream's
``ts.handler_utils.micro_batching.MicroBatching``, which cuts a frontend batch into
micro-batches of ``micro_batch_size`` in arrival order, with the threads of ``parallelism``,
both read from the ``micro_batching:`` section of model-config.yaml as upstream's example
does. The section should say ``enabled: false`` so ts_microbatch's own pipeline (which the
example's ``initialize`` configures) stays out of the way. Upstream knows no item lengths:
preprocess pads each micro-batch to its longest text, as a user's handler would.

Each preprocess counts its real and padded tokens into ts_microbatch's MicroBatchTokens and
MicroBatchPaddedTokens counters, so the scrape summary's useful_token_share is measured the
same way for every variant.
"""

from typing import Any

import torch
from bert_handler import BertClassifierHandler  # the example's handler, in the same .mar
from ts.handler_utils.micro_batching import MicroBatching

from ts_microbatch.torchserve.metrics import TorchServeMetricsObserver


class UpstreamBertHandler(BertClassifierHandler):
    def __init__(self) -> None:
        super().__init__()
        self.handle = MicroBatching(self)  # TorchServe takes handle as the entry point
        self._tokens = None

    def initialize(self, context: Any) -> None:
        super().initialize(context)
        section = (context.model_yaml_config or {}).get("micro_batching", {})
        if section.get("parallelism"):
            self.handle.parallelism = section["parallelism"]
        self.handle.micro_batch_size = section.get("micro_batch_size", 1)
        self._tokens = TorchServeMetricsObserver(context.metrics)

    def preprocess(self, data: list[Any]) -> dict[str, torch.Tensor]:
        tensors = super().preprocess(data)
        if self._tokens is not None:
            mask = tensors["attention_mask"]
            self._tokens.on_tokens(int(mask.sum()), mask.numel())
        return tensors
