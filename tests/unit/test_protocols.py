"""KServe v1 / OIP v2 bodies: unpacked into instances, answered per request in their shape."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.test_micro_batching import FakeContext, FakeTorchServeHandler
from ts_microbatch import MicroBatching
from ts_microbatch.protocols import PLAIN, V1, V2, ProtocolError, Request, regroup, unpack


def v1(*instances: Any) -> dict[str, Any]:
    return {"body": {"instances": list(instances)}}


def v2(datatype: str, shape: list[int], data: list[Any], **extra: Any) -> dict[str, Any]:
    tensor = {"name": "input-0", "shape": shape, "datatype": datatype, "data": data}
    return {"body": {"inputs": [tensor], **extra}}


def test_every_instance_of_every_request_is_one_item() -> None:
    rows = [
        {"body": b"\xff\xd8 a jpeg"},
        v1({"b64": "aGk="}, {"data": "aGk="}, [1, 2]),
        {"body": json.dumps({"instances": [3]}).encode()},  # JSON sent as bytes
        v2("FP32", [2, 3], [1, 2, 3, 4, 5, 6], id="r-7"),
        v2("BYTES", [2], ["aGk=", "aGk="]),
    ]
    requests, items = unpack(rows)
    assert [(r.protocol, r.start, r.count) for r in requests] == [
        (PLAIN, 0, 1),
        (V1, 1, 3),
        (V1, 4, 1),
        (V2, 5, 2),
        (V2, 7, 2),
    ]
    assert items[0] is rows[0]
    assert items[1:5] == [{"data": "aGk="}, {"data": "aGk="}, {"data": [1, 2]}, {"data": 3}]
    assert items[5:] == [
        {"data": [1.0, 2.0, 3.0]},
        {"data": [4.0, 5.0, 6.0]},
        {"data": "aGk="},
        {"data": "aGk="},
    ]
    assert requests[3].request_id == "r-7"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (v1(), '"instances" must be a non-empty list'),
        ({"body": {"instances": "x"}}, '"instances" must be a non-empty list'),
        (v2("FP33", [1], [1.0]), "unknown datatype 'FP33'"),
        (v2("FP32", [2, 2], [1.0, 2.0, 3.0]), "shape [2, 2] holds 4 values, data has 3"),
        (v2("BYTES", [3], ["a"]), "shape [3] does not match 1 BYTES elements"),
        (v2("INT64", [2], ["x", "y"]), "data is not INT64"),
        (v2("FP32", [-1], []), "shape must be a list of sizes"),
        ({"body": {"inputs": []}}, '"inputs" must be a list of one input'),
        ({"body": {"inputs": [{"name": "x"}]}}, "missing 'shape', 'datatype', 'data'"),
    ],
)
def test_malformed_bodies_fail_their_request_with_a_message(row: Any, message: str) -> None:
    requests, items = unpack([row, {"body": b"plain"}])
    assert requests[0].count == 0 and isinstance(requests[0].error, ProtocolError)
    assert message in str(requests[0].error)
    assert items == [{"body": b"plain"}]  # the other request is untouched
    answer = regroup(requests[0], [], [])
    assert answer.status == 400 and message in answer.body["error"]


def test_answers_in_each_protocols_shape() -> None:
    v1_request = Request(V1, 0, 2)
    assert regroup(v1_request, [{"cat": 0.9}, {"dog": 0.8}], [None, None]).body == {
        "predictions": [{"cat": 0.9}, {"dog": 0.8}]
    }
    v2_request = Request(V2, 0, 2, request_id="r-1")
    numeric = regroup(v2_request, [[1.0, 2.0], [3.0, 4.0]], [None, None], "m", "1.0").body
    assert numeric == {
        "model_name": "m",
        "id": "r-1",
        "model_version": "1.0",
        "outputs": [
            {"name": "predictions", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]}
        ],
    }
    texts = regroup(v2_request, [{"cat": 0.5}, "dog"], [None, None], "m").body["outputs"][0]
    assert texts == {
        "name": "predictions",
        "shape": [2],
        "datatype": "BYTES",
        "data": ['{"cat": 0.5}', "dog"],
    }
    failed = regroup(v1_request, [None, {"dog": 0.8}], [(400, "Bad Request", "not an image"), None])
    assert (failed.status, failed.body) == (400, {"error": "instance 0: not an image"})


class RowHandler(FakeTorchServeHandler):
    """The fake handler reading TorchServe-shaped rows ({"data": x} or {"body": x})."""

    def preprocess(self, data: list[Any]) -> list[int]:
        return super().preprocess([row.get("data", row.get("body")) for row in data])


def test_instances_of_different_requests_share_micro_batches() -> None:
    # Eight single-instance v1 requests at micro-batch 4: two preprocess calls of 4, not 8
    # of 1; a 6-instance request is cut into micro-batches of its own.
    handler = RowHandler()
    rows = [{"body": {"instances": [i]}} for i in range(8)]
    with MicroBatching(handler, micro_batch_size=4) as mb:
        out = mb(rows, FakeContext(8))
        assert out == [{"predictions": [{"item": i, "value": i * 10 + 1}]} for i in range(8)]
        assert sorted(len(c) for c in handler.calls["preprocess"]) == [4, 4]
        handler.calls["preprocess"].clear()
        out = mb([{"body": {"instances": list(range(6))}}], FakeContext(1))
    assert len(out[0]["predictions"]) == 6
    assert sorted(len(c) for c in handler.calls["preprocess"]) == [2, 4]


def test_a_batch_mixing_protocols_answers_each_request_alone() -> None:
    handler = RowHandler()
    handler.fail_on["preprocess"] = {13}
    rows = [
        {"body": 1},  # plain
        v1(2, 3),  # two instances
        v1(4, 13),  # a bad instance: this request alone fails
        v2("INT64", [2], [5, 6], id="req-v2"),
        v2("FP32", [2], [1.0]),  # malformed: shape and data disagree
        {"body": 7},
    ]
    context = FakeContext(len(rows))
    with MicroBatching(handler, micro_batch_size=3) as mb:
        out = mb(rows, context)
    assert out[0] == {"item": 1, "value": 11}
    assert out[1] == {"predictions": [{"item": 2, "value": 21}, {"item": 3, "value": 31}]}
    assert out[2] == {"error": "instance 1: preprocess rejects [13]"}
    assert out[3]["id"] == "req-v2" and out[3]["outputs"][0]["datatype"] == "BYTES"
    assert [json.loads(x)["item"] for x in out[3]["outputs"][0]["data"]] == [5, 6]
    assert "shape [2] holds 2 values, data has 1" in out[4]["error"]
    assert out[5] == {"item": 7, "value": 71}
    assert {i: code for i, (code, _) in context.statuses.items()} == {2: 400, 4: 400}
