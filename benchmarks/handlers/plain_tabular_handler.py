"""The fraud scorer's stages (examples/tabular_scorer/tabular_handler.py, beside this file
in the .mar) without any micro-batching: TorchServe's ``BaseHandler.handle`` runs
preprocess, inference and postprocess on the whole frontend batch, as the scorer's user
served it before ts_microbatch. The plain baseline of the latency study's ``tabular``
workload (benchmarks/latency_load.py) and of ``benchmark-ab.py --baseline-handler``.

Not the mixin with ``enabled: false``: this class has no ts_microbatch code in its path at
all. A bad body here fails its whole batch (BaseHandler's behaviour); the benchmarks send
good bodies only.
"""

from tabular_handler import TabularScorerHandler  # the example's handler, in the same .mar
from ts.torch_handler.base_handler import BaseHandler


class PlainTabularHandler(BaseHandler):
    # The example's own stage functions, bound to this class: the same code, no pipeline.
    preprocess = TabularScorerHandler.preprocess
    inference = TabularScorerHandler.inference
    postprocess = TabularScorerHandler.postprocess
