"""An experiment, not a feature: the fraud scorer's handler with the pipeline patched so that a
stage thread runs the next stage itself when that stage's queue is empty, one thread hand-off
a batch of one instead of three. It asks whether the hand-offs set ours' tail near three
quarters of capacity (benchmarks/dev/results/tabular_floor/README.md, ``fused-1600/``):

    ts-microbatch-benchmark --mar model_store/tabular_mb.mar \\
      --corpus build/tabular_mb/corpus.jsonl \\
      --handler-variant fused=benchmarks/dev/handlers/fused_stages_handler.py ...

The patched method is ``Pipeline._process`` as of dd13ebb, with the last two lines made a
loop; it must be kept in step with it by hand, so it lives here and nowhere else."""

import time

from tabular_handler import TabularScorerHandler

from ts_microbatch.core import pipeline as _pipeline


def _process(self, stage, mb):  # type: ignore[no-untyped-def]
    while True:
        if mb.answered():
            self._outcomes.dropped(mb)
            return
        name = self._names[stage]
        last = stage == len(self._names) - 1
        observer = _pipeline._QUIET if mb.batch.quiet else self._observer
        started = time.monotonic()
        try:
            output, size, run_s = self._calls.timed(stage, mb, self._workers, observer)
        except BaseException as exc:
            self._outcomes.stage_failed(stage, mb, exc, time.monotonic() - started)
            return
        auto, budget = self._auto, self.token_budget
        if auto is not None and not mb.batch.quiet:
            auto.observe(name, size, run_s)
        if budget is not None and not mb.batch.quiet and mb.padded_length is not None:
            budget.observe(name, size, mb.padded_length, run_s)
        self._outcomes.passed(mb, stage, run_s)
        if last:
            self._outcomes.finish(mb.batch, mb.indices, outputs=output)
            return
        mb.payload = output
        if len(self._queues[stage + 1]):  # the next stage is busy: hand it over as usual
            self._enqueue(stage + 1, mb)
            return
        mb.enqueued_at = time.monotonic()
        stage += 1


_pipeline.Pipeline._process = _process


class FusedStagesHandler(TabularScorerHandler):  # type: ignore[misc]
    """The example's handler; the patch above is what differs."""
