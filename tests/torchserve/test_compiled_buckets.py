"""Sequence-length buckets for a compiled token model (#19): warm-up compiles the grid of
allowed sizes x allowed lengths, then a random mix of texts is served without a compile,
each answer what the text gets alone; a text longer than the largest bucket gets 413 alone,
or with ``truncate`` is cut to it by the handler; without buckets the same mix recompiles.

TinySeqNet is loaded by TorchServe's own loader (its ``pt2:`` section compiles it) and driven
by ``Service.predict``. One load serves the bucket tests (a load compiles 9 graphs);
Dynamo's caches are per process and per code object, so the module starts and ends with
``torch._dynamo.reset()``, and the test without buckets, which loads its own model, resets
first (after it, the module's model would compile again).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

from tests.compiled_model import build
from tests.torchserve.test_metrics import metric_lines
from tests.torchserve.ts_machinery import decode, load_service, request
from ts_microbatch.torchserve.compiled import compile_count
from ts_microbatch.torchserve.metrics import RECOMPILES

SIZES = [1, 2, 4]
BUCKETS = [8, 16, 32]
BUCKETED = {
    "micro_batch_size": 4,
    "allowed_micro_batch_sizes": SIZES,
    "allowed_sequence_lengths": BUCKETS,  # no max_tokens: the largest bucket is the limit
    "order": "length",
    "warmup": {},
    "on_recompile": "error",
    "metrics_interval_s": 0,  # a line per report: the mix's lines are read as they come
}
UNBUCKETED = {k: v for k, v in BUCKETED.items() if k != "allowed_sequence_lengths"}
# Frontend batches of 1 to 8 texts of 1 to 32 tokens, half JSON lists, half plain text.
_rng = random.Random(19)
MIX = [
    [[_rng.randrange(1000) for _ in range(_rng.randint(1, 32))] for _ in range(_rng.randint(1, 8))]
    for _ in range(6)
]
TOLERANCE = 1e-4  # inductor may order float sums differently at another shape
COMPILED_LOG = "ts_microbatch.torchserve.compiled"


def body(i: int, tokens: list[int]) -> dict[str, Any]:
    if i % 2:
        return request(i, " ".join(map(str, tokens)).encode(), "text/plain")
    return request(i, json.dumps(tokens).encode(), "application/json")


def predict(service: Any, texts: list[Any]) -> list[tuple[int, Any]]:
    """Each text's (status, answer) for one frontend batch of ``texts`` (token lists, or
    raw bodies)."""
    batch = [
        body(i, t) if isinstance(t, list) else request(i, t, "text/plain")
        for i, t in enumerate(texts)
    ]
    code, answers = decode(service.predict(batch))
    assert code == 200 and len(answers) == len(texts)
    return [(status, json.loads(text)) for _, status, text in answers]


def load(directory: Path, micro_batching: dict[str, Any]) -> tuple[Any, Any]:
    config = build.model_config(micro_batching)
    model_dir = build.model_dir(directory, config, "tiny_seq")
    service = load_service(model_dir, model_name="tiny_seq", handler="tiny_seq_handler.py")
    return service, service._entry_point.__self__


def eager_answers(texts: list[list[int]]) -> torch.Tensor:
    """The eager model's answer for each text alone, unpadded."""
    model = build.eager_model("tiny_seq")
    with torch.inference_mode():
        return torch.cat(
            [model(torch.tensor([t]), torch.ones(1, len(t), dtype=torch.bool)) for t in texts]
        )


def close(a: Any, b: Any) -> bool:
    return torch.allclose(torch.tensor(a), torch.as_tensor(b), atol=TOLERANCE, rtol=0)


@pytest.fixture(scope="module")
def bucketed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    torch._dynamo.reset()
    graphs, compiles = counters["stats"]["unique_graphs"], compile_count()
    service, handler = load(tmp_path_factory.mktemp("buckets") / "seq", BUCKETED)
    loaded = SimpleNamespace(
        service=service,
        handler=handler,
        compiled=handler.micro_batching.compiled,
        graphs=counters["stats"]["unique_graphs"] - graphs,
        compiles=compile_count() - compiles,
        warmup_shapes=list(handler.shapes),
        warmup_seen=list(handler.seen),
    )
    try:
        yield loaded
    finally:
        handler.micro_batching.shutdown()
        torch._dynamo.reset()


def test_warmup_compiles_every_size_at_every_bucket(bucketed: SimpleNamespace) -> None:
    grid = {(n, length) for n in SIZES for length in BUCKETS}
    # Every (size, bucket) shape reached the model at load, each bucket from a warm-up
    # body of exactly that many tokens; the padding check (3 padded to 4) adds no shape.
    assert set(bucketed.warmup_shapes) == grid
    assert set(bucketed.warmup_seen) == {(n, n) for n in BUCKETS}
    # One real graph per shape, on the inference thread; none given up on at Dynamo's
    # recompile limit (8 by default: raised to the grid's 9 on that thread).
    assert bucketed.graphs == bucketed.compiles == bucketed.compiled.compiles == len(grid)
    assert bucketed.compiled.recompile_limit == len(grid)
    assert bucketed.compiled.compiled_on == {"ts-microbatch-inference-0"}
    assert bucketed.compiled.recompiles == 0


def test_a_random_mix_is_served_without_a_compile(
    bucketed: SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    handler, service = bucketed.handler, bucketed.service
    handler.shapes.clear()
    handler.seen.clear()
    before = compile_count()
    with caplog.at_level(logging.INFO):
        answers = [predict(service, texts) for texts in MIX]
        assert handler.micro_batching.flush_metrics()  # the reporter writes on its thread
    assert compile_count() == before and bucketed.compiled.recompiles == 0
    assert not [r for r in caplog.records if r.name == COMPILED_LOG]
    lines = metric_lines(caplog)
    assert lines and not [line for line in lines if line.startswith(RECOMPILES)]
    # The scenario: lengths between buckets padded up to them, micro-batches of 3 padded
    # to 4, and every shape the model saw one warm-up compiled.
    assert {padded for _, padded in handler.seen} <= set(BUCKETS)
    assert any(n not in BUCKETS for n, _ in handler.seen)
    assert 3 in {len(texts) % 4 for texts in MIX}
    assert set(handler.shapes) <= {(n, length) for n in SIZES for length in BUCKETS}
    assert len(set(handler.shapes)) > 3
    texts = [t for batch in MIX for t in batch]
    got = [answer for batch in answers for answer in batch]
    assert [status for status, _ in got] == [200] * len(texts)
    alone = [predict(service, [t])[0] for t in texts]
    assert compile_count() == before
    for (_, together), (status, single) in zip(got, alone):
        assert status == 200 and close(together, single)
    assert close([answer for _, answer in got], eager_answers(texts))


def test_a_text_over_the_largest_bucket_gets_413_alone_before_preprocess(
    bucketed: SimpleNamespace,
) -> None:
    handler = bucketed.handler
    handler.seen.clear()
    texts = [[3] * 5, list(range(40)), [7] * 12]
    answers = predict(bucketed.service, texts)
    assert [status for status, _ in answers] == [200, 413, 200]
    refused = answers[1][1]
    assert refused["type"] == "PayloadTooLargeError"
    assert "40 tokens long" in refused["message"]
    assert "the largest of micro_batching.allowed_sequence_lengths" in refused["message"]
    assert sorted(n for n, _ in handler.seen) == [5, 12]  # the 40 never reached preprocess
    assert close([answers[0][1], answers[2][1]], eager_answers([texts[0], texts[2]]))


def test_a_malformed_body_gets_400_alone(bucketed: SimpleNamespace) -> None:
    answers = predict(bucketed.service, [[1, 2, 3], b"one two", b"[5, 1000]", b"", [4] * 9])
    assert [status for status, _ in answers] == [200, 400, 400, 400, 200]
    assert {body["type"] for _, body in answers[1:4]} == {"InvalidInputError"}


def test_truncate_cuts_a_long_text_to_the_largest_bucket(bucketed: SimpleNamespace) -> None:
    handler, pipeline = bucketed.handler, bucketed.handler.micro_batching
    config = pipeline.config
    # The same compiled model, its pipeline rebuilt with truncate: true.
    pipeline.configure(replace(config, truncate=True))
    handler.seen.clear()
    before = compile_count()
    long_text = [(11 * i) % 1000 for i in range(40)]
    try:
        answers = predict(bucketed.service, [[2] * 6, long_text])
    finally:
        pipeline.configure(config)
    assert [status for status, _ in answers] == [200, 200]
    # The handler got all 40 tokens and cut them to the largest bucket.
    assert sorted(handler.seen) == [(6, 32), (40, 32)]
    assert compile_count() == before
    assert close(answers[1][1], eager_answers([long_text[:32]])[0])


def test_without_buckets_the_same_mix_recompiles(
    bucketed: SimpleNamespace, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Padding to the longest item: one batch of the mix (13, 21 and 26 tokens, padded to 4
    # rows of 26) meets a shape warm-up did not compile.
    torch._dynamo.reset()  # the module's model is done: its graphs must not count here
    service, handler = load(tmp_path / "seq", UNBUCKETED)
    try:
        compiled = handler.micro_batching.compiled
        assert compiled.compiles == len(SIZES)  # warm-up: each size at the 8-token input
        handler.shapes.clear()
        with caplog.at_level(logging.ERROR, logger=COMPILED_LOG):
            answers = predict(service, MIX[4])
    finally:
        handler.micro_batching.shutdown()
    assert handler.shapes == [(4, 26)]
    assert compiled.recompiles == 1
    ours = [r for r in caplog.records if r.name == COMPILED_LOG]
    assert ours and all("recompiled" in r.getMessage() for r in ours)
    assert [status for status, _ in answers] == [200] * len(MIX[4])
    assert close([answer for _, answer in answers], eager_answers(MIX[4]))


def test_defect_warmup_sample_warmed_one_bucket_silently(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # With warmup.sample, warm-up runs that one body: its bucket only. A compiled model then
    # compiled the other buckets on the request path, and nothing at load said so.
    config = build.model_config({**BUCKETED, "warmup": {"sample": "sample.txt"}}, compiled=False)
    directory = build.model_dir(tmp_path / "seq", config, "tiny_seq")
    (directory / "sample.txt").write_text("1 2 3 4 5 6 7 8 9 10")
    with caplog.at_level(logging.WARNING, logger="ts_microbatch.torchserve.mixin"):
        service = load_service(directory, model_name="tiny_seq", handler="tiny_seq_handler.py")
    handler = service._entry_point.__self__
    handler.micro_batching.shutdown()
    assert {padded for _, padded in handler.seen} == {16}  # the scenario: one bucket ran
    assert any(
        "only its bucket is warmed up" in r.getMessage()
        and "warmup_input(self, length)" in r.getMessage()
        for r in caplog.records
    )


def test_a_warmup_input_outside_its_bucket_is_named_at_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A tokenizer adding [CLS] and [SEP] would give length + 2: that bucket then compiles on
    # the request path. Uncompiled here: the check is about lengths, not graphs.
    config = build.model_config({**BUCKETED, "allowed_sequence_lengths": [8, 16, 40]}, False)
    model_dir = build.model_dir(tmp_path, config, "tiny_seq")
    # A module name of its own: the loader imports a handler by name, and this module's
    # other tests imported the unchanged one.
    source = (model_dir / "tiny_seq_handler.py").read_text()
    exact = "count = WARMUP_LENGTH if length is None else length"
    assert exact in source
    changed = source.replace(exact, exact + " + 2 * ((length or 40) < 40)")
    (model_dir / "tiny_seq_handler_plus_two.py").write_text(changed)
    with caplog.at_level(logging.WARNING, logger="ts_microbatch.torchserve.mixin"):
        service = load_service(
            model_dir, model_name="tiny_seq", handler="tiny_seq_handler_plus_two.py"
        )
    service._entry_point.__self__.micro_batching.shutdown()
    named = [r.getMessage() for r in caplog.records if "outside that bucket" in r.getMessage()]
    # 8 + 2 lands in 16, 16 + 2 in 40: both named; 40 stays 40.
    assert [m.split("(length=")[1].split(")")[0] for m in named] == ["8", "16"]
