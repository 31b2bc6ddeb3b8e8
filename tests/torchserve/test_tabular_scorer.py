"""The fraud scorer example (examples/tabular_scorer) through TorchServe's loader and
``Service.predict``: each good body scored as the model scores its row alone, each bad body
a 400 of its own inside a batch of good ones, KServe v1 bodies; and the benchmarks' plain
and upstream variants of the same stages.

Scores are compared within 1e-6: the model is the same, but a matrix product over a
micro-batch of rows may sum in another order than over one row (float32).
"""

from __future__ import annotations

import json
import math
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import ROOT, load_module
from tests.torchserve.ts_machinery import decode, load_service, request
from ts_microbatch.tools.mar import PLAIN_OVERRIDE, override_mar

build = load_module("examples/tabular_scorer/build_mar.py", "ts_microbatch_tabular_build_mar")
prepare = build.prepare
TOLERANCE = 1e-6
JSON, OCTETS = "application/json", "application/octet-stream"
ROWS = [prepare.make_features(500 + i) for i in range(12)]


def extract(mar: Path, directory: Path) -> Path:
    with zipfile.ZipFile(mar) as archive:
        archive.extractall(directory)
    return directory


def start(directory: Path, handler: str = "tabular_handler.py") -> Any:
    return load_service(directory, model_name="tabular_mb", handler=handler, batch_size=32)


def handler_of(service: Any) -> Any:
    """The handler: the entry point's object (upstream's entry point is its MicroBatching,
    whose ``handler`` it is)."""
    entry = service._entry_point
    return entry.__self__ if hasattr(entry, "__self__") else entry.handler


def stop(service: Any) -> None:
    handler = handler_of(service)
    if getattr(handler, "micro_batching", None) is not None:
        handler.micro_batching.shutdown()


def predict(service: Any, bodies: list[tuple[Any, str]]) -> list[tuple[int, Any]]:
    batch = [request(i, body, content_type) for i, (body, content_type) in enumerate(bodies)]
    code, answers = decode(service.predict(batch))
    assert code == 200
    return [(status, json.loads(body)) for _, status, body in answers]


def as_sent(row: list[float], i: int) -> tuple[Any, str]:
    """Half the bodies as TorchServe hands over application/json (parsed), half as raw
    bytes (the body of ``serve start --input``, of curl without a content type)."""
    body = {"features": row}
    return (body, JSON) if i % 2 == 0 else (json.dumps(body).encode(), OCTETS)


@pytest.fixture(scope="module")
def mar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("tabular")
    return build.build_mar(tmp / "store", work_dir=tmp / "work")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def alone(mar: Path, tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """Each row's score from the packed weights, the model run on that row alone."""
    model = prepare.model_class()()
    directory = extract(mar, tmp_path_factory.mktemp("weights"))
    model.load_state_dict(torch.load(directory / prepare.WEIGHTS_FILE, weights_only=True))
    with torch.inference_mode():
        return [float(model(torch.tensor([row]))[0]) for row in ROWS]


@pytest.fixture(scope="module")
def service(mar: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    served = start(extract(mar, tmp_path_factory.mktemp("model")))
    yield served
    stop(served)


def record_preprocess(service: Any) -> list[tuple[int, bool]]:
    """Wraps the handler's preprocess: each call's row count and whether it raised."""
    handler = handler_of(service)
    preprocess, calls = type(handler).preprocess, []

    def recording(data: list[Any]) -> Any:
        try:
            rows = preprocess(handler, data)
        except Exception:
            calls.append((len(data), True))
            raise
        calls.append((len(data), False))
        return rows

    handler.preprocess = recording
    return calls


def scores_close(got: list[tuple[int, Any]], want: list[float]) -> bool:
    return len(got) == len(want) and all(
        status == 200 and abs(body["score"] - w) <= TOLERANCE
        for (status, body), w in zip(got, want)
    )


def test_good_bodies_are_each_scored_as_the_model_scores_them_alone(
    service: Any, alone: list[float]
) -> None:
    calls = record_preprocess(service)
    got = predict(service, [as_sent(row, i) for i, row in enumerate(ROWS)])
    assert [rows for rows, _ in calls] == [8, 4]  # the scenario: micro-batches of 8 and 4
    assert len({round(score, 4) for score in alone}) > 1  # the scores tell rows apart
    assert scores_close(got, alone), (got, alone)


NAN_TEXT = json.dumps({"features": [0.5] * 127 + [float("nan")]}).encode()  # "NaN" literal
BAD_BODIES = [
    ({"features": [0.5] * 127}, JSON, '"features" has 127 values; the model takes 128'),
    ({"features": [0.5] * 129}, JSON, '"features" has 129 values; the model takes 128'),
    ({"features": [0.5] * 5 + ["1.5"] + [0.5] * 122}, JSON, 'features[5] is the string "1.5"'),
    ({"features": [None] + [0.5] * 127}, JSON, "features[0] is null, not a number"),
    ({"features": [0.5] * 127 + [True]}, JSON, "features[127] is true, not a number"),
    ({"features": [[0.5]] * 128}, JSON, "features[0] is a list, not a number"),
    ({"features": [float("nan")] + [0.5] * 127}, JSON, "features[0] is nan: send finite"),
    (NAN_TEXT, OCTETS, "features[127] is nan: send finite"),
    (b'{"features": [Infinity' + b", 0.5" * 127 + b"]}", OCTETS, "features[0] is inf"),
    ({"features": [0.5, 1e39] + [0.5] * 126}, JSON, "features[1] is 1e+39: send finite"),
    ({"features": [10**40] + [0.5] * 127}, JSON, "features[0] is an integer that large"),
    (b'{"features": [0.5, 0.5', OCTETS, "the request body is not JSON"),
    (b"\xff\xfe{}", OCTETS, "the request body is not UTF-8 JSON"),
    ({"feature": [0.5] * 128}, JSON, 'send a JSON object {"features": [128 numbers]}'),
    ({"features": "0.5, 0.5"}, JSON, '"features" must be a list of 128 numbers; got str'),
]


@pytest.mark.parametrize(("body", "content_type", "message"), BAD_BODIES)
def test_a_bad_body_gets_its_own_400_among_good_ones(
    service: Any, alone: list[float], body: Any, content_type: str, message: str
) -> None:
    calls = record_preprocess(service)
    bodies = [as_sent(row, i) for i, row in enumerate(ROWS[:6])]
    bodies.insert(3, (body, content_type))
    got = predict(service, bodies)
    # The scenario: the bad body went into a micro-batch with good ones, which failed.
    assert calls[0] == (7, True), calls
    assert [status for status, _ in got] == [200, 200, 200, 400, 200, 200, 200]
    assert got[3][1]["type"] == "InvalidInputError"
    assert got[3][1]["message"].startswith(message), got[3][1]
    assert scores_close(got[:3] + got[4:], alone[:6])


def test_kserve_v1_instances_are_scored_each_as_alone(service: Any, alone: list[float]) -> None:
    # An instance is {"features": [...]} or the bare list of 128 numbers.
    instances = [{"features": ROWS[0]}, ROWS[1], {"features": ROWS[2], "id": "tx-2"}]
    got = predict(service, [({"instances": instances}, JSON), as_sent(ROWS[3], 1)])
    assert [status for status, _ in got] == [200, 200]
    predictions = got[0][1]["predictions"]
    assert scores_close([(200, p) for p in predictions], alone[:3]), predictions
    assert scores_close(got[1:], alone[3:4])


def test_a_kserve_v2_fp32_input_of_n_rows_is_scored_row_by_row(
    service: Any, alone: list[float]
) -> None:
    flat = [value for row in ROWS[:3] for value in row]
    tensor = {"name": "features", "shape": [3, 128], "datatype": "FP32", "data": flat}
    ((status, answer),) = predict(service, [({"inputs": [tensor]}, JSON)])
    assert status == 200, answer
    (output,) = answer["outputs"]
    assert output["shape"][0] == 3
    assert scores_close([(200, json.loads(d)) for d in output["data"]], alone[:3]), output


def test_a_kserve_v1_body_with_a_bad_instance_gets_400_and_the_others_their_scores(
    service: Any, alone: list[float]
) -> None:
    bad = {"instances": [ROWS[0], [0.5] * 3]}
    got = predict(service, [as_sent(ROWS[1], 0), (bad, JSON), as_sent(ROWS[2], 1)])
    assert [status for status, _ in got] == [200, 400, 200]
    assert got[1][1] == {"error": 'instance 1: "features" has 3 values; the model takes 128'}
    assert scores_close([got[0], got[2]], alone[1:3])


@pytest.mark.parametrize(
    ("variant", "override"),
    [
        ("plain_tabular_handler.py", PLAIN_OVERRIDE),
        ("upstream_tabular_handler.py", {"enabled": False, "micro_batch_size": 4}),
    ],
)
def test_the_benchmark_variants_run_the_same_stages(
    mar: Path, tmp_path: Path, alone: list[float], variant: str, override: dict[str, Any]
) -> None:
    # benchmarks/latency_load.py's tabular workload swaps these handlers in this way.
    swapped = tmp_path / "variant.mar"
    override_mar(mar, swapped, override, None, Path(ROOT, "benchmarks/handlers", variant))
    served = start(extract(swapped, tmp_path / "model"), handler=variant)
    try:
        handler = handler_of(served)
        assert getattr(handler, "micro_batching", None) is None  # no pipeline of ours
        if variant.startswith("upstream"):
            assert type(handler.handle).__module__ == "ts.handler_utils.micro_batching"
            assert handler.handle.micro_batch_size == 4
        got = predict(served, [as_sent(row, i) for i, row in enumerate(ROWS)])
    finally:
        stop(served)
        if variant.startswith("upstream"):
            handler_of(served).handle.shutdown()
    assert scores_close(got, alone), got
    assert all(math.isfinite(body["score"]) for _, body in got)
