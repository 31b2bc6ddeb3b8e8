"""The breakers judge the model, not the inputs on trial (``ts_microbatch.core.breaker``):
a stage is judged broken only when an input it once served fails there alone.

Through the pipeline's public API, with fake stages whose answer depends on the item
alone (``Model``, ``Lookup``). The first two defects named here were reproduced on
81bb3fd, the replayed request's two on 2a9309d; each test fails there.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.core.fakes import cause
from ts_microbatch import Pipeline
from ts_microbatch.core.errors import SharedFailureError
from ts_microbatch.core.micro_batch import current_micro_batch

pytestmark = pytest.mark.generative

WAIT_S = 60
# The model's errors (none of them means bad input): an over-long text past BERT's 512
# positions, a feature store refusing or timing out, anything else.
ERRORS: tuple[type[Exception], ...] = (
    IndexError,
    ConnectionRefusedError,
    TimeoutError,
    RuntimeError,
)
STAGES = ("preprocess", "inference", "postprocess")


def bad(stage: int, error: int, n: int) -> str:
    """A bad request: it fails in ``STAGES[stage]`` with ``ERRORS[error]`` (in any call
    that holds it, as an over-long text fails BERT's whole call)."""
    return f"bad:{stage}:{error}:{n}"


class Model:
    """preprocess, inference and postprocess over texts; a call holding a bad text fails
    where the text says. ``failing`` makes every call of a stage fail, with its errors in
    turn (call by call), as a model that is broken."""

    def __init__(self) -> None:
        self.calls: dict[str, list[list[str]]] = {stage: [] for stage in STAGES}
        self.failing: dict[str, tuple[type[Exception], ...]] = {}
        self._lock = threading.Lock()

    def stages(self) -> dict[str, Any]:
        return {stage: self._stage(index) for index, stage in enumerate(STAGES)}

    def _stage(self, index: int) -> Any:
        name = STAGES[index]

        def call(rows: list[str]) -> list[str]:
            with self._lock:
                self.calls[name].append(list(rows))
                count = len(self.calls[name])
            errors = self.failing.get(name)
            if errors:
                raise errors[count % len(errors)](f"{name} is down")
            for row in rows:
                if row.startswith("bad:") and int(row.split(":")[1]) == index:
                    raise ERRORS[int(row.split(":")[2])](f"{name} cannot take {row}")
            return list(rows)

        return call

    def calls_in(self, stage: str) -> int:
        with self._lock:
            return len(self.calls[stage])


def answers(pipeline: Pipeline, items: list[str]) -> list[Any]:
    batch = pipeline.submit_batch(items)
    assert batch.wait(WAIT_S)
    return [batch.outcome(i).error or batch.outcome(i).value for i in range(len(items))]  # type: ignore[union-attr]


# -- the reproduced defects ----------------------------------------------------------------


def test_defect_a_burst_of_bad_inputs_opened_a_healthy_model_s_breaker() -> None:
    # A model that has served; one batch of five over-long texts (inference raises
    # IndexError, as BERT's position embeddings do past 512), nothing served: the breaker
    # opened, and in every later batch [over-long, short] at micro-batch 2 its probe was
    # the over-long text, so the short one, served alone, got 500 in 5/5 batches.
    model = Model()
    long = [bad(1, 0, n) for n in range(5)]
    with Pipeline(model.stages(), micro_batch_size=2) as pipeline:
        assert answers(pipeline, ["served"]) == ["served"]
        burst = answers(pipeline, long)
        assert all(isinstance(r, IndexError) for r in burst)  # the scenario: nothing served
        for n in range(5):
            calls = model.calls_in("inference")
            got = answers(pipeline, [bad(1, 0, 10 + n), f"short {n}"])
            assert [bad(1, 0, 10 + n), f"short {n}"] in model.calls["inference"][calls:]
            assert isinstance(got[0], IndexError)
            assert got[1] == f"short {n}"  # what it gets alone
        assert pipeline.stats().broken_stages == ()


def test_defect_two_exception_types_kept_a_broken_model_from_being_judged() -> None:
    # A feature store that is down, refusing some calls and timing out on others: the
    # streak was kept per exception type, so it never reached five, and every batch of 32
    # at micro-batch 4 cost 56 inference calls where 8 + 1 are promised.
    model = Model()
    model.failing["inference"] = (ConnectionRefusedError, TimeoutError)
    with Pipeline(model.stages(), micro_batch_size=4) as pipeline:
        first = answers(pipeline, [f"r{n}" for n in range(32)])
        assert {type(r) for r in first} == {ConnectionRefusedError, TimeoutError}  # both
        assert pipeline.stats().broken_stages == ("inference",)
        for _ in range(3):
            calls = model.calls_in("inference")
            later = answers(pipeline, [f"r{n}" for n in range(32)])
            assert all(isinstance(cause(r), (ConnectionRefusedError, TimeoutError)) for r in later)
            assert model.calls_in("inference") - calls == 8 + 1


# -- the rule, generatively ------------------------------------------------------------

bad_requests = st.tuples(st.integers(1, 2), st.integers(0, len(ERRORS) - 1))


@settings(max_examples=60, deadline=None)
@given(
    micro_batch_size=st.integers(1, 8),
    threads=st.integers(1, 2),
    warm_up=st.booleans(),
    bursts=st.lists(st.lists(bad_requests, max_size=32), min_size=1, max_size=3),
    mixed=st.lists(
        st.lists(st.none() | bad_requests, min_size=1, max_size=12), min_size=1, max_size=3
    ),
)
@example(  # the first defect, as drawn
    micro_batch_size=2, threads=1, warm_up=False, bursts=[[(1, 0)] * 5], mixed=[[(1, 0), None]]
)
def test_a_healthy_model_answers_every_good_request_after_any_burst_of_bad_ones(
    micro_batch_size: int,
    threads: int,
    warm_up: bool,
    bursts: list[list[tuple[int, int]]],
    mixed: list[list[tuple[int, int] | None]],
) -> None:
    # A healthy model that has a known-good input (a request served, or warm-up's sample),
    # then bursts of 0-32 bad requests of mixed error types in inference or postprocess,
    # then batches of good and bad ones: every good request gets its answer (the one it
    # gets alone), every bad one its own error, failed alone; no stage is ever judged.
    model = Model()
    parallelism = {stage: threads for stage in STAGES}
    with Pipeline(
        model.stages(), micro_batch_size=micro_batch_size, parallelism=parallelism
    ) as pipeline:
        warm = pipeline.submit_batch(["served"], quiet=warm_up)
        assert warm.wait(WAIT_S) and warm.succeeded()
        for n, batch in enumerate([*bursts, *mixed]):
            items = [
                f"good {n}.{i}" if kind is None else bad(*kind, n=1000 * n + i)
                for i, kind in enumerate(batch)
            ]
            submitted = pipeline.submit_batch(items)
            assert submitted.wait(WAIT_S)
            for i, (item, kind) in enumerate(zip(items, batch)):
                outcome = submitted.outcome(i)
                assert outcome is not None
                if kind is None:
                    assert (outcome.value, outcome.error) == (item, None), item
                else:
                    assert isinstance(outcome.error, ERRORS[kind[1]]), (item, outcome)
                    failure = submitted.failure(i)
                    assert failure is not None and failure.isolated, (item, failure)
            assert pipeline.stats().broken_stages == ()


@settings(max_examples=40, deadline=None)
@given(
    requests=st.integers(1, 32),
    micro_batch_size=st.integers(1, 8),
    threads=st.integers(1, 2),
    errors=st.lists(st.sampled_from(ERRORS), min_size=1, max_size=3, unique=True),
    stage=st.sampled_from(STAGES[1:]),
    served=st.booleans(),
)
@example(  # the second defect, as drawn
    requests=32,
    micro_batch_size=4,
    threads=1,
    errors=[ConnectionRefusedError, TimeoutError],
    stage="inference",
    served=False,
)
def test_a_model_failing_every_call_costs_a_call_per_micro_batch_and_a_probe(
    requests: int,
    micro_batch_size: int,
    threads: int,
    errors: list[type[Exception]],
    stage: str,
    served: bool,
) -> None:
    # A model failing every call of a stage with 1-3 exception types in turn, that served
    # one request before (a known-good input: on trial, then, as no verdict rests on one
    # replayed request, judged as a model that never served) or never did: once judged,
    # each batch costs at most one call per micro-batch and one probe in that stage
    # (within the number of micro-batches + 2).
    model = Model()
    micro_batches = math.ceil(requests / micro_batch_size)
    parallelism = {name: threads for name in STAGES}
    with Pipeline(
        model.stages(), micro_batch_size=micro_batch_size, parallelism=parallelism
    ) as pipeline:
        if served:
            assert answers(pipeline, ["served"]) == ["served"]
        model.failing[stage] = tuple(errors)
        # Batches that fail five requests alone; then, having served one request only, one
        # more: its lone known-good input failing is no verdict (one replayed request may
        # fail for a reason of its own), so that batch is isolated and the input retired.
        to_judge = math.ceil(5 / requests) + served
        costs = []
        for _ in range(to_judge + 3):
            calls = model.calls_in(stage)
            got = answers(pipeline, [f"r{n}" for n in range(requests)])
            assert all(isinstance(cause(r), tuple(errors)) for r in got), got
            costs.append(model.calls_in(stage) - calls)
        assert all(cost <= micro_batches + 2 for cost in costs[to_judge:]), costs
        if requests >= 2 and micro_batch_size >= 2:
            # Judged (a batch of one request, or of runs of one item, never needs it).
            assert pipeline.stats().broken_stages == (stage,)


# -- the known-good input is a replayed request: a reviewer's repros -----------------------


class Lookup:
    """Inference looks each row's id up in a store, as a feature store does: a row whose
    entity is missing fails with KeyError, the rest are served; ``bad:`` rows fail with
    IndexError. What a stage reads of its call's context, and writes there, is recorded."""

    def __init__(self, store: set[str]) -> None:
        self.store = store
        self.calls: list[list[str]] = []
        self.contexts: list[Any] = []

    def stages(self) -> dict[str, Any]:
        def inference(rows: list[str]) -> list[str]:
            info = current_micro_batch()
            assert info is not None
            self.calls.append(list(rows))
            self.contexts.append(info.context)
            if info.context is not None:
                info.context.writes.append(list(rows))  # as set_response_status would
            for row in rows:
                if row.startswith("bad:"):
                    raise IndexError(f"cannot take {row}")
                if row not in self.store:
                    raise KeyError(row)
            return list(rows)

        return {"preprocess": list, "inference": inference}


class Rows:
    """A batch's context, as the adapter's ``BatchContext``: ``private_row`` gives a
    request's own row, and writes are recorded."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.writes: list[list[str]] = []

    def private_row(self, request: int) -> Rows:
        return Rows(f"{self.name}[{request}] alone")


def _on_trial(pipeline: Pipeline, model: Lookup, context: Any = None) -> None:
    burst = pipeline.submit_batch([f"bad:{n}" for n in range(5)], context)
    assert burst.wait(WAIT_S)
    assert all(isinstance(burst.outcome(n).error, IndexError) for n in range(5))  # type: ignore[union-attr]


def test_defect_a_replayed_request_whose_row_was_deleted_judged_a_healthy_model_broken() -> None:
    # The known-good input was the last item served, a user request: its entity deleted
    # since, its probe failed (KeyError), the stage was judged broken and the good request
    # held behind it failed whole (500) although it passes alone.
    model = Lookup({"A", "B", "good"})
    with Pipeline(model.stages(), micro_batch_size=2) as pipeline:
        assert answers(pipeline, ["B"]) == ["B"]
        assert answers(pipeline, ["A"]) == ["A"]  # the last served
        model.store.discard("A")  # its entity deleted
        _on_trial(pipeline, model)
        calls = len(model.calls)
        batch = pipeline.submit_batch(["bad:x", "good"])
        assert batch.wait(WAIT_S)
        ran = model.calls[calls:]
        assert ran[:2] == [["bad:x", "good"], ["A"]]  # the scenario: it failed, A replayed
        assert batch.outcome(1).value == "good"  # type: ignore[union-attr]  (what it gets alone)
        assert isinstance(batch.outcome(0).error, IndexError)  # type: ignore[union-attr]
        assert pipeline.stats().broken_stages == ()


def test_defect_a_known_good_probe_wrote_into_the_context_of_the_batch_it_came_from() -> None:
    # The probe ran with its batch's whole context: a stage's set_response_status or
    # header reached the RequestProcessors of a batch that may still be in flight.
    model = Lookup({"served", "good"})
    served = Rows("served")
    with Pipeline(model.stages(), micro_batch_size=2) as pipeline:
        first = pipeline.submit_batch(["served"], served)
        assert first.wait(WAIT_S) and first.succeeded()
        assert served.writes == [["served"]]
        _on_trial(pipeline, model, Rows("burst"))
        calls = len(model.calls)
        answers(pipeline, ["bad:x", "good"])
        assert model.calls[calls + 1] == ["served"]  # the scenario: the probe ran
        probe_context = model.contexts[calls + 1]
        assert probe_context is not served and probe_context.name == "served[0] alone"
        assert served.writes == [["served"]]  # nothing more written there


def test_defect_a_replayed_request_that_passed_became_warm_up_s_sample() -> None:
    # A replayed request runs in a private, quiet batch; when it passed it was kept as if
    # warm-up had served it, so it became the only witness: once its entity was deleted,
    # its failure alone judged a healthy model broken (found in review on 57f649c).
    model = Lookup({"A", "B", "good", "good2"})
    with Pipeline(model.stages(), micro_batch_size=2) as pipeline:
        assert answers(pipeline, ["B"]) == ["B"]
        assert answers(pipeline, ["A"]) == ["A"]
        _on_trial(pipeline, model)
        calls = len(model.calls)
        assert answers(pipeline, ["bad:x", "good"])[1] == "good"
        assert model.calls[calls + 1] == ["A"]  # the scenario: A replayed, and it passed
        model.store.discard("A")  # its entity deleted since
        _on_trial(pipeline, model)
        calls = len(model.calls)
        got = answers(pipeline, ["bad:y", "good2"])
        # the witnesses are the last two served ("good" since), not A as warm-up's sample
        assert model.calls[calls + 1] == ["good"]
        assert got[1] == "good2"
        assert pipeline.stats().broken_stages == ()


class ThreeStages:
    """Inference looks ids up in ``store`` (KeyError when missing; ``bad1:`` rows fail with
    IndexError); postprocess fails ``bad2:`` rows with IndexError."""

    def __init__(self, store: set[str]) -> None:
        self.store = store
        self.calls: list[tuple[str, list[str]]] = []

    def stages(self) -> dict[str, Any]:
        def inference(rows: list[str]) -> list[str]:
            self.calls.append(("inference", list(rows)))
            for row in rows:
                if row.startswith("bad1:"):
                    raise IndexError(row)
                if not row.startswith("bad2:") and row not in self.store:
                    raise KeyError(row)
            return list(rows)

        def postprocess(rows: list[str]) -> list[str]:
            self.calls.append(("postprocess", list(rows)))
            if any(row.startswith("bad2:") for row in rows):
                raise IndexError(rows)
            return list(rows)

        return {"preprocess": list, "inference": inference, "postprocess": postprocess}


def test_defect_a_replay_for_a_later_stage_became_an_earlier_stage_s_warm_up_sample() -> None:
    # Postprocess on trial replays A from the first stage; in inference, which A passed on
    # its way, the private quiet batch made A warm-up's sample, inference's only witness:
    # A deleted since, its one failure judged inference broken and good2 failed whole
    # (found in review of the fix above).
    model = ThreeStages({"A", "B", "good", "good2"})
    with Pipeline(model.stages(), micro_batch_size=2) as pipeline:
        assert answers(pipeline, ["B"]) == ["B"]
        assert answers(pipeline, ["A"]) == ["A"]
        burst = answers(pipeline, [f"bad2:{n}" for n in range(5)])
        assert all(isinstance(r, IndexError) for r in burst)  # postprocess on trial
        calls = len(model.calls)
        assert answers(pipeline, ["bad2:x", "good"])[1] == "good"
        assert ("inference", ["A"]) in model.calls[calls:]  # the scenario: A replayed
        model.store.discard("A")  # its entity deleted since
        burst = answers(pipeline, [f"bad1:{n}" for n in range(5)])
        assert all(isinstance(r, IndexError) for r in burst)  # inference on trial
        got = answers(pipeline, ["bad1:y", "good2"])
        assert got[1] == "good2"  # what it gets alone
        assert pipeline.stats().broken_stages == ()


def test_two_inputs_served_to_two_requests_failing_alone_judge_the_model_broken() -> None:
    # The verdict rests on two replayed requests: both fail, the stage is judged broken.
    model = Lookup({"A", "B"})
    with Pipeline(model.stages(), micro_batch_size=2) as pipeline:
        assert answers(pipeline, ["B"]) == ["B"]
        assert answers(pipeline, ["A"]) == ["A"]
        model.store.clear()  # the store is down: every lookup fails
        _on_trial(pipeline, model)
        calls = len(model.calls)
        got = answers(pipeline, ["C", "D"])
        assert model.calls[calls:] == [["C", "D"], ["A"], ["B"]]  # both witnesses ran
        assert all(isinstance(cause(r), KeyError) for r in got)
        assert pipeline.stats().broken_stages == ("inference",)


def test_defect_a_stale_warm_up_sample_failed_good_requests_with_another_s_error() -> None:
    # Issue 49: warm-up's sample was the only witness while there was one. Its row deleted
    # since, its probe failed and judged a healthy model broken: the good request sharing a
    # micro-batch with a bad one got 500 with the bad one's error ("cannot take bad:x"), in
    # every round, while it passes alone. The served witnesses, which pass, were never run.
    model = Lookup({"warm", "A", "B", "good"})
    with Pipeline(model.stages(), micro_batch_size=2) as pipeline:
        warm = pipeline.submit_batch(["warm"], quiet=True)
        assert warm.wait(WAIT_S) and warm.succeeded()
        assert answers(pipeline, ["B"]) == ["B"]
        assert answers(pipeline, ["A"]) == ["A"]
        model.store.discard("warm")  # the sample's entity deleted
        for round_ in range(3):
            _on_trial(pipeline, model)
            calls = len(model.calls)
            got = answers(pipeline, [f"bad:x{round_}", "good"])
            if round_ == 0:  # the scenario: the sample ran first and failed, A then passed
                assert model.calls[calls:][:3] == [[f"bad:x{round_}", "good"], ["warm"], ["A"]]
            else:  # the stale sample retired: the served ones are the witnesses
                assert ["warm"] not in model.calls[calls:]
            assert got[1] == "good"  # what it gets alone
            assert isinstance(got[0], IndexError) and f"x{round_}" in str(got[0])
            assert pipeline.stats().broken_stages == ()


def test_a_failure_shared_by_requests_carries_none_of_their_words() -> None:
    # Judged broken (every witness fails), a micro-batch of a bad request and a good one
    # fails whole: neither answer holds the other's exception text, type or content; each
    # names the stage, and the stage's exception is the error's cause, for the log.
    model = Lookup({"A", "B"})
    with Pipeline(model.stages(), micro_batch_size=2) as pipeline:
        assert answers(pipeline, ["B"]) == ["B"]
        assert answers(pipeline, ["A"]) == ["A"]
        model.store.clear()  # the store is down: every lookup fails
        _on_trial(pipeline, model)
        token = "bad:tok3n-7f1c"
        got = answers(pipeline, [token, "good"])
        assert pipeline.stats().broken_stages == ("inference",)  # the scenario: judged
        for result in got:
            assert isinstance(result, SharedFailureError), result
            assert "inference" in str(result) and "known to be good" in str(result)
            assert "tok3n" not in str(result) and "IndexError" not in str(result)
        assert "tok3n" in str(got[1].__cause__)  # the stage raised it: the log has it


def test_a_stand_in_item_s_error_stays_out_of_the_answer_of_what_waited_for_it() -> None:
    # Broken from load (no known-good input): the failing micro-batch's first item stands
    # in, and the rest waits with the error of the call they shared, which here names the
    # first item's input; judged broken, the rest got that error as it was (found in review).
    model = Lookup(set())  # the store never had anything: every lookup fails
    with Pipeline(model.stages(), micro_batch_size=2) as pipeline:
        _on_trial(pipeline, model)
        assert pipeline.stats().broken_stages == ("inference",)  # opened: never served
        calls = len(model.calls)
        got = answers(pipeline, ["tok3n-a41", "B"])
        assert model.calls[calls:] == [["tok3n-a41", "B"], ["tok3n-a41"]]  # the stand-in ran
        assert isinstance(got[0], KeyError)  # its own failure, alone
        assert isinstance(got[1], SharedFailureError) and "tok3n" not in str(got[1])


def test_warm_up_s_sample_stays_the_known_good_input_whatever_is_served_after() -> None:
    model = Lookup({"warm", "A", "good"})
    with Pipeline(model.stages(), micro_batch_size=2) as pipeline:
        warm = pipeline.submit_batch(["warm"], quiet=True)
        assert warm.wait(WAIT_S) and warm.succeeded()
        assert answers(pipeline, ["A"]) == ["A"]
        _on_trial(pipeline, model)
        calls = len(model.calls)
        assert answers(pipeline, ["bad:x", "good"])[1] == "good"
        assert model.calls[calls + 1] == ["warm"]  # the probe: warm-up's sample, not A
