"""The BERT example's handler with its padded tokens counted, for the plain-handler
baseline of the text benchmark (benchmark-ab.py ``--baseline-handler``).

With ``enabled: false`` the example runs BaseHandler.handle: its preprocess pads the whole
frontend batch to its longest text. ts_microbatch's pipeline counts tokens only for the
micro-batches it cuts, so here preprocess counts them itself (when no micro-batch of the
pipeline is running) into the same MicroBatchTokens / MicroBatchPaddedTokens counters: the
scrape summary's useful_token_share then says how much of the plain handler's work is
padding. Counting is one sum over the attention mask per batch.
"""

from typing import Any

import torch
from bert_handler import BertClassifierHandler  # the example's handler, in the same .mar

from ts_microbatch.torchserve.metrics import TorchServeMetricsObserver


class PlainCountedBertHandler(BertClassifierHandler):
    _tokens = None

    def initialize(self, context: Any) -> None:
        super().initialize(context)
        self._tokens = TorchServeMetricsObserver(context.metrics)

    def preprocess(self, data: list[Any]) -> dict[str, torch.Tensor]:
        tensors = super().preprocess(data)
        counted_by_pipeline = self.micro_batching is not None and (
            self.micro_batching.current_micro_batch() is not None
        )
        if self._tokens is not None and not counted_by_pipeline:
            mask = tensors["attention_mask"]
            self._tokens.on_tokens(int(mask.sum()), mask.numel())
        return tensors
