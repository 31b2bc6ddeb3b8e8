"""KServe v1 / OIP v2 bodies: unpacked into instances, answered per request in their shape."""

from __future__ import annotations

import base64
import json
import logging
import math
from collections import namedtuple
from typing import Any

import numpy as np
import pytest
import torch

from tests.core.fakes import Bad
from tests.torchserve.test_micro_batching import FakeContext, FakeTorchServeHandler
from ts_microbatch import MicroBatching
from ts_microbatch.core.config import MicroBatchingConfig
from ts_microbatch.core.errors import RequestError
from ts_microbatch.torchserve._submission import PLAIN, V1, V2, Request, unpack
from ts_microbatch.torchserve.answers import encode
from ts_microbatch.torchserve.kserve import ProtocolError, regroup
from ts_microbatch.torchserve.kserve_encoding import to_json

KSERVE = MicroBatchingConfig(kserve=True)


def v1(*instances: Any) -> dict[str, Any]:
    return {"body": {"instances": list(instances)}}


def v2_body(datatype: str, shape: list[int], data: Any, **extra: Any) -> dict[str, Any]:
    tensor = {"name": "input-0", "shape": shape, "datatype": datatype, "data": data}
    return {"inputs": [tensor], **extra}


def v2(datatype: str, shape: list[int], data: Any, **extra: Any) -> dict[str, Any]:
    return {"body": v2_body(datatype, shape, data, **extra)}


def sent(answer: Any) -> Any:
    """What the client reads: TorchServe's serializer (json.dumps, indent=2) and back."""
    return json.loads(encode(answer))


def test_every_instance_of_every_request_is_one_item() -> None:
    rows = [
        {"body": b"\xff\xd8 a jpeg"},
        v1({"b64": "aGk="}, {"data": "aGk="}, [1, 2]),
        {"body": json.dumps({"instances": [3]}).encode()},  # JSON sent as bytes
        v2("FP32", [2, 3], [1, 2, 3, 4, 5, 6], id="r-7"),
        v2("BYTES", [2], ["aGk=", "aGk="]),
    ]
    requests, items = unpack(rows, kserve=True)
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


# -- which bodies are KServe requests ---------------------------------------------------

STRICT_V2 = v2_body("INT64", [2], [1, 2])
HUGGING_FACE = {"inputs": "I love this movie"}
NOT_STRICT = {"inputs": [{"name": "x", "datatype": "FP32"}]}  # no shape, no data


@pytest.mark.parametrize(
    ("body", "kserve", "protocol", "malformed"),
    [
        (HUGGING_FACE, "auto", PLAIN, False),
        (HUGGING_FACE, True, V2, True),  # a KServe deployment answers it 400
        (HUGGING_FACE, False, PLAIN, False),
        ({"instances": [1, 2, 3]}, "auto", PLAIN, False),
        ({"instances": [1, 2, 3]}, True, V1, False),
        (NOT_STRICT, "auto", PLAIN, False),
        (NOT_STRICT, True, V2, True),
        (STRICT_V2, "auto", V2, False),
        (json.dumps(STRICT_V2).encode(), "auto", V2, False),
        (STRICT_V2, True, V2, False),
        (STRICT_V2, False, PLAIN, False),
    ],
)
def test_defect_plain_bodies_taken_as_kserve_requests(
    body: Any, kserve: bool | str, protocol: str, malformed: bool
) -> None:
    # {"inputs": "I love this movie"} (the common Hugging Face body) on /predictions got 400
    # where the handler without micro-batching answered it. Only the config's kserve key, or
    # by default the strict v2 shape, makes a body a KServe request.
    row = {"body": body}
    requests, items = unpack([row], kserve=kserve)
    assert requests[0].protocol == protocol
    if protocol == PLAIN:
        assert items == [row] and items[0] is row  # reaches the handler unchanged
    assert (requests[0].error is not None) == malformed


def test_defect_plain_bodies_reach_the_handler_unchanged_with_the_default_config() -> None:
    handler = RowHandler()
    rows = [{"body": HUGGING_FACE}, {"body": {"instances": [1, 2, 3]}}]
    with MicroBatching(handler, micro_batch_size=2) as mb:
        context = FakeContext(2)
        out = mb(rows, context)
    assert context.statuses == {}
    assert handler.calls["preprocess"] == [[HUGGING_FACE, {"instances": [1, 2, 3]}]]
    assert [o["item"] for o in out] == [HUGGING_FACE, {"instances": [1, 2, 3]}]


# -- bodies that cannot be read -------------------------------------------------------------

DEEP = b'{"a": ' + b"[" * 2000  # RecursionError in json.loads


class HostileRow(dict[str, Any]):
    """A row whose reading raises an exception nobody would list."""

    def get(self, *args: Any) -> Any:
        raise ZeroDivisionError("hostile row")


@pytest.mark.parametrize("kserve", ["auto", True])
def test_defect_one_body_failed_its_whole_batch(kserve: bool | str) -> None:
    # A 4 KB body of nested brackets (RecursionError), a UINT8 of -1, an INT8 of 300, an
    # INT64 of 2**70 (OverflowError in numpy), an integer of 5,000 digits (ValueError in
    # json.loads), a row that raises what nobody expects: the parser caught a list of
    # exception types outside any per-request guard, so each failed the whole batch (503).
    bad = [
        {"body": DEEP},
        v2("UINT8", [1], [-1]),
        v2("INT8", [1], [300]),
        v2("INT64", [1], [2**70]),
        {"body": b'{"inputs": ' + b"9" * 5000 + b"}"},
        HostileRow(),
    ]
    rows = [{"body": b"first"}, *bad, {"body": b"last"}]
    requests, items = unpack(rows, kserve=kserve)
    assert [r.count for r in requests] == [1] + [0] * len(bad) + [1]
    assert items == [rows[0], rows[-1]]
    for request in requests[1:-1]:
        assert isinstance(request.error, RequestError) and request.error.status_code == 400
    assert "RecursionError" in str(requests[1].error)
    assert "out of range 0..255" in str(requests[2].error)
    assert "ZeroDivisionError" in str(requests[6].error)
    handler = RowHandler()
    with MicroBatching(
        handler, micro_batch_size=3, config=MicroBatchingConfig(kserve=kserve)
    ) as mb:
        context = FakeContext(len(rows))
        out = mb(rows, context)
    assert {i: code for i, (code, _) in context.statuses.items()} == dict.fromkeys(range(1, 7), 400)
    assert out[0] == {"item": "first", "value": "first!"}
    assert out[-1] == {"item": "last", "value": "last!"}
    assert out[1]["code"] == 400 and "RecursionError" in out[1]["message"]  # a plain body
    assert "out of range" in out[2]["error"]  # a v2 body: KServe's error shape


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (v1(), '"instances" must be a non-empty list'),
        ({"body": {"instances": "x"}}, '"instances" must be a non-empty list'),
        (v2("FP33", [1], [1.0]), "unknown datatype 'FP33'"),
        (v2(["FP32"], [1], [1.0]), "unknown datatype ['FP32']"),  # unhashable
        (v2("FP32", [2, 2], [1.0, 2.0, 3.0]), "shape [2, 2] holds 4 values, data has 3"),
        (v2("BYTES", [3], ["a"]), "shape [3] holds 3 values, data has 1"),
        (v2("BYTES", [2], ["a", 1]), "BYTES data must be strings"),
        (v2("INT64", [2], ["x", "y"]), "data is not INT64: expected integers"),
        (v2("INT64", [2], ["1", "2"]), "data is not INT64"),  # numpy would read "1" as 1
        (v2("INT32", [1], [1.5]), "data is not INT32"),  # numpy would truncate it to 1
        (v2("INT64", [2], [1, None]), "data is not INT64"),
        (v2("BOOL", [2], [1, 0]), "data is not BOOL: expected true or false"),
        (v2("FP32", [1], [True]), "data is not FP32"),
        (v2("INT64", [2], [True, 2]), "data is not INT64"),  # numpy would read True as 1
        (v2("FP32", [2], [False, 1.5]), "data is not FP32"),
        (v2("UINT8", [1], [-1]), "-1 is out of range 0..255"),
        (v2("INT8", [2], [1, 300]), "300 is out of range -128..127"),
        (v2("INT64", [1], [2**70]), f"data is not INT64: {2**70} is out of range"),
        (v2("UINT64", [1], [-(2**70)]), "out of range"),
        (v2("FP16", [1], [1e6]), "data is not FP16: a value is out of range"),
        (v2("FP32", [2, 2], [[1.0, 2.0], [3.0]]), "nested data does not have shape [2, 2]"),
        (v2("FP32", [2], [[1.0], [2.0]]), "nested data is deeper than shape [2]"),
        (v2("FP32", [-1], []), "shape must be a list of sizes"),
        (v2("FP32", [True], [1.0]), "shape must be a list of sizes"),
        (v2("FP32", "2", [1.0, 2.0]), "shape must be a list of sizes"),
        (v2("FP32", [0, 3], []), "shape [0, 3] holds no instance"),
        (v2("FP32", [1], {"a": 1}), "data must be a list"),
        ({"body": {"inputs": []}}, '"inputs" must be a list of one input'),
        ({"body": {"inputs": "I love this movie"}}, '"inputs" must be a list of one input'),
        ({"body": {"inputs": [STRICT_V2["inputs"][0]] * 2}}, "list of one input"),
        ({"body": {"inputs": [{"name": "x"}]}}, "missing 'shape', 'datatype', 'data'"),
    ],
)
def test_malformed_bodies_fail_their_request_with_a_message(row: Any, message: str) -> None:
    requests, items = unpack([row, {"body": b"plain"}], kserve=True)
    assert requests[0].count == 0 and isinstance(requests[0].error, ProtocolError)
    assert message in str(requests[0].error)
    assert items == [{"body": b"plain"}]  # the other request is untouched
    answer = regroup(requests[0], [], [])
    assert answer.status == 400 and message in answer.body["error"]
    assert answer.phrase == "Bad Request"


# -- valid v2 shapes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "data", "instances"),
    [
        ([2, 1], ["aGk=", "b2s="], ["aGk=", "b2s="]),
        ([2, 1], [["aGk="], ["b2s="]], ["aGk=", "b2s="]),  # nested as the shape
        ([1, 1], ["aGk="], ["aGk="]),
        ([1, 1, 1], [[["aGk="]]], ["aGk="]),
        ([2, 2], ["a", "b", "c", "d"], [["a", "b"], ["c", "d"]]),
    ],
)
def test_defect_v2_bytes_shapes_with_more_dimensions_refused(
    shape: list[int], data: list[Any], instances: list[Any]
) -> None:
    # BYTES of shape [2, 1] or [1, 1] got 400 while FP32 of the same layout was accepted:
    # n instances is shape[0] whatever the datatype.
    requests, items = unpack([v2("BYTES", shape, data)], kserve="auto")
    assert requests[0].error is None and requests[0].count == shape[0]
    assert items == [{"data": x} for x in instances]


def test_v2_numbers_are_read_exactly_in_their_datatype() -> None:
    rows = [
        v2("INT64", [2], [2**62 + 1, -(2**62)]),
        v2("UINT64", [1], [2**64 - 1]),
        v2("BOOL", [2, 1], [[True], [False]]),
        v2("FP64", [1], [0.1]),
        v2("FP64", [1], [2**70]),  # an integer literal is a number too
        v2("INT8", [2, 2], [[1, -128], [127, 0]]),
        v2("FP32", [2, 0], []),
    ]
    requests, items = unpack(rows)
    assert all(r.error is None for r in requests), [str(r.error) for r in requests]
    assert [i["data"] for i in items] == [
        2**62 + 1,
        -(2**62),
        2**64 - 1,
        [True],
        [False],
        0.1,
        float(2**70),
        [1, -128],
        [127, 0],
        [],
        [],
    ]


def test_defect_v2_binary_data_extension_handed_to_the_handler_as_plain() -> None:
    # A body using the binary data extension was treated as plain and its raw bytes handed
    # to the handler. It is refused, naming the extension, found by the header TorchServe
    # passes through or by binary_data_size in the JSON head, however the JSON ends.
    tensor = {"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}
    head = json.dumps({"inputs": [tensor]}).encode()
    body = head + np.array([1.5, 2.5], dtype=np.float32).tobytes()
    with_header = v2("FP32", [1], [1.0])  # a JSON body, but the header says binary follows
    rows = [{"body": body}, {"body": head}, with_header, {"body": b"plain"}]

    class Headers(FakeContext):
        def get_all_request_header(self, idx: int) -> dict[str, str]:
            return {"Inference-Header-Content-Length": str(len(head))} if idx == 2 else {}

    for kserve in ("auto", True):
        requests, items = unpack(rows, kserve=kserve, context=Headers(len(rows)))
        for request in requests[:3]:
            assert request.protocol == V2 and request.error is not None
            assert "binary data extension (Inference-Header-Content-Length" in str(request.error)
        assert items == [{"body": b"plain"}]
    requests, items = unpack(rows, kserve=False, context=Headers(len(rows)))
    assert items == rows  # kserve: false reads no body


def test_headers_of_a_context_without_them_are_none() -> None:
    # TorchServe's MockContext and hand-made contexts lack get_all_request_header, or fail
    # in it: no request fails for that.
    class Broken(FakeContext):
        def get_all_request_header(self, idx: int) -> dict[str, str]:
            raise IndexError(idx)

    for context in (FakeContext(2), Broken(2)):
        requests, _ = unpack([v2("FP32", [1], [1.0]), {"body": b"x"}], context=context)
        assert [r.error for r in requests] == [None, None]


# -- answers -----------------------------------------------------------------------------

Prediction = namedtuple("Prediction", "label score")


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
            {"name": "predictions", "shape": [2, 2], "datatype": "FP64", "data": [1, 2, 3, 4]}
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


def v2_output(*outputs: Any) -> dict[str, Any]:
    body = regroup(Request(V2, 0, len(outputs)), list(outputs), [None] * len(outputs)).body
    return sent(body)["outputs"][0]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("outputs", "datatype", "shape", "data"),
    [
        ((16777217, 2**31 - 1), "INT64", [2], [16777217, 2**31 - 1]),
        ((2**63,), "UINT64", [1], [2**63]),
        ((True, False), "BOOL", [2], [True, False]),
        ((0.1, 1), "FP64", [2], [0.1, 1.0]),
        (([1, 2], [3, 4]), "INT64", [2, 2], [1, 2, 3, 4]),
        ((torch.tensor([0.1, 0.2]),), "FP32", [1, 2], np.float32([0.1, 0.2]).tolist()),
        ((torch.tensor([0.1], dtype=torch.float64),), "FP64", [1, 1], [0.1]),
        ((torch.tensor([-3], dtype=torch.int8),), "INT8", [1, 1], [-3]),
        ((torch.tensor(2**40),), "INT64", [1], [2**40]),
        ((torch.tensor([True]),), "BOOL", [1, 1], [True]),
        ((torch.tensor([0.5], dtype=torch.float16),), "FP32", [1, 1], [0.5]),
        ((torch.tensor([0.5], dtype=torch.bfloat16),), "FP32", [1, 1], [0.5]),
        ((torch.ones(2, requires_grad=True) * 2,), "FP32", [1, 2], [2.0, 2.0]),
        ((np.uint8([255, 0]), np.uint8([1, 2])), "UINT8", [2, 2], [255, 0, 1, 2]),
        ((np.float64(0.1), np.float64(0.2)), "FP64", [2], [0.1, 0.2]),
        ((np.int32(7),), "INT32", [1], [7]),
        ((np.bool_(True),), "BOOL", [1], [True]),
        ((np.float32(0.5), 1), "FP64", [2], [0.5, 1.0]),  # mixed: the common type
    ],
)
def test_defect_v2_numbers_lose_precision(
    outputs: tuple[Any, ...], datatype: str, shape: list[int], data: list[Any]
) -> None:
    # Every numeric output went as FP32: 16777217 came back 16777216.0, 2**31 - 1 as
    # 2147483648.0, True as BYTES "true". The datatype is the outputs' own.
    output = v2_output(*outputs)
    assert (output["datatype"], output["shape"], output["data"]) == (datatype, shape, data)
    assert all(type(x) is type(y) for x, y in zip(output["data"], data))


@pytest.mark.parametrize(
    ("outputs", "data"),
    [
        (({"cat": np.float32(0.5)}, "dog"), ['{"cat": 0.5}', "dog"]),
        ((b"caf\xc3\xa9", bytearray(b"tea")), ["café", "tea"]),
        ((None, Prediction("cat", np.float64(0.25))), ["null", '["cat", 0.25]']),
        (([1, "x"], [1, 2]), ['[1, "x"]', "[1, 2]"]),  # not numeric: text per instance
        (([1, 2], [3]), ["[1, 2]", "[3]"]),  # ragged
        ((2**70,), ["1180591620717411303424"]),
        ((torch.tensor([1, 2]), "x"), ["[1, 2]", "x"]),
    ],
)
def test_v2_outputs_that_are_not_one_tensor_are_bytes_texts(
    outputs: tuple[Any, ...], data: list[str]
) -> None:
    output = v2_output(*outputs)
    assert (output["datatype"], output["shape"], output["data"]) == ("BYTES", [len(data)], data)


def test_v1_predictions_are_json_values() -> None:
    outputs = [
        torch.tensor([[1.5, 2.0]]),
        np.arange(3, dtype=np.int16),
        np.float32(0.25),
        b"\x00\xff",
        Prediction("cat", torch.tensor(0.5)),
        {"top": torch.topk(torch.tensor([0.1, 0.7, 0.2]), 2), np.int64(3): None},
        None,
    ]
    body = regroup(Request(V1, 0, len(outputs)), outputs, [None] * len(outputs)).body
    assert sent(body)["predictions"] == [
        [[1.5, 2.0]],
        [0, 1, 2],
        0.25,
        {"b64": base64.b64encode(b"\x00\xff").decode()},
        ["cat", 0.5],
        {"top": [[pytest.approx(0.7), pytest.approx(0.2)], [1, 2]], "3": None},
        None,
    ]


@pytest.mark.parametrize(
    "output",
    [
        object(),
        {1, 2},
        torch.tensor([1 + 2j]),
        np.array([1 + 2j]),
        {(1, 2): 0.5},  # a key JSON has no form for
        [math.inf, object()],
    ],
)
def test_outputs_with_no_json_form_raise(output: Any) -> None:
    with pytest.raises(TypeError):
        to_json(output)
    with pytest.raises(TypeError):
        regroup(Request(V2, 0, 1), [output], [None])


# -- through MicroBatching ------------------------------------------------------------------


class RowHandler(FakeTorchServeHandler):
    """Reads TorchServe-shaped rows ({"data": x} or {"body": x}) of any body; answers
    ``{"item": body, "value": "<body>!"}``; preprocess fails on the ints in ``fail_on``."""

    def preprocess(self, data: list[Any]) -> list[Any]:
        bodies = [row.get("data", row.get("body")) for row in data]
        self.calls["preprocess"].append(bodies)
        bad = [b for b in bodies if isinstance(b, int) and b in self.fail_on["preprocess"]]
        if bad:
            raise Bad(f"preprocess rejects {bad}")
        return bodies

    def inference(self, data: list[Any]) -> list[Any]:
        return [x.decode() if isinstance(x, bytes) else x for x in data]

    def postprocess(self, data: list[Any]) -> list[Any]:
        return [{"item": x, "value": f"{x}!"} for x in data]


class OutputHandler(FakeTorchServeHandler):
    """Postprocess returns ``outputs[body]``: a tensor, an array, bytes, anything."""

    def __init__(self, outputs: dict[str, Any]) -> None:
        super().__init__()
        self.outputs = outputs

    def preprocess(self, data: list[Any]) -> list[str]:
        return [row.get("data", row.get("body")) for row in data]

    def inference(self, data: list[str]) -> list[str]:
        return data

    def postprocess(self, data: list[str]) -> list[Any]:
        return [self.outputs[key] for key in data]


def test_instances_of_different_requests_share_micro_batches() -> None:
    # Eight single-instance v1 requests at micro-batch 4: two preprocess calls of 4, not 8
    # of 1; a 6-instance request is cut into micro-batches of its own.
    handler = RowHandler()
    rows = [{"body": {"instances": [i]}} for i in range(8)]
    with MicroBatching(handler, micro_batch_size=4, config=KSERVE) as mb:
        out = mb(rows, FakeContext(8))
        assert out == [{"predictions": [{"item": i, "value": f"{i}!"}]} for i in range(8)]
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
    with MicroBatching(handler, micro_batch_size=3, config=KSERVE) as mb:
        out = mb(rows, context)
    assert out[0] == {"item": 1, "value": "1!"}
    assert out[1] == {"predictions": [{"item": 2, "value": "2!"}, {"item": 3, "value": "3!"}]}
    assert out[2] == {"error": "instance 1: preprocess rejects [13]"}
    assert out[3]["id"] == "req-v2" and out[3]["outputs"][0]["datatype"] == "BYTES"
    assert [json.loads(x)["item"] for x in out[3]["outputs"][0]["data"]] == [5, 6]
    assert "shape [2] holds 2 values, data has 1" in out[4]["error"]
    assert out[5] == {"item": 7, "value": "7!"}
    assert {i: code for i, (code, _) in context.statuses.items()} == {2: 400, 4: 400}


OUTPUTS: dict[str, Any] = {
    "tensor": torch.tensor([0.25, 0.75]),
    "ints": torch.tensor([16777217, 2**31 - 1]),
    "array": np.array([[1, 2]], dtype=np.uint8),
    "scalar": np.float32(0.5),
    "utf8": "café".encode(),
    "png": b"\x89PNG",  # not UTF-8: v1 sends base64, v2 JSON has no form for it
    "complex": torch.tensor([1j]),
    "object": object(),
}


def test_defect_tensor_outputs_over_kserve_failed_the_batch() -> None:
    # A postprocess returning tensors, arrays, numpy scalars or bytes: every batch holding a
    # v1 or v2 request answered 503 (json.dumps of a tensor in the v2 answer; TorchServe's
    # serializer on {"predictions": [tensor]}). Each is encoded as its protocol says, and
    # one the protocol cannot carry fails its own request (500), nothing else.
    keys = ["tensor", "ints", "array", "scalar", "utf8"]
    rows = [v1(*keys, "png"), v2("BYTES", [len(keys)], keys)]
    rows += [v1("complex"), v2("BYTES", [1], ["object"]), v2("BYTES", [1], ["png"])]
    rows += [v1(key) for key in keys] + [v2("BYTES", [1], [key]) for key in keys]
    context = FakeContext(len(rows))
    with MicroBatching(OutputHandler(OUTPUTS), micro_batch_size=3, config=KSERVE) as mb:
        out = [sent(answer) for answer in mb(rows, context)]
    assert {i: code for i, (code, _) in context.statuses.items()} == dict.fromkeys([2, 3, 4], 500)
    assert out[0]["predictions"] == [
        [0.25, 0.75],
        [16777217, 2**31 - 1],
        [[1, 2]],
        0.5,
        {"b64": base64.b64encode("café".encode()).decode()},
        {"b64": base64.b64encode(b"\x89PNG").decode()},
    ]
    assert out[1]["outputs"][0]["datatype"] == "BYTES"  # shapes differ: one text each
    assert json.loads(out[1]["outputs"][0]["data"][1]) == [16777217, 2**31 - 1]
    assert out[1]["outputs"][0]["data"][4] == "café"
    assert "complex" in out[2]["error"] and "object" in out[3]["error"]
    assert "UnicodeDecodeError" in out[4]["error"]
    assert out[5 : 5 + len(keys)] == [{"predictions": [p]} for p in out[0]["predictions"][:-1]]
    singles = [o["outputs"][0] for o in out[-len(keys) :]]
    assert [(s["datatype"], s["shape"]) for s in singles] == [
        ("FP32", [1, 2]),
        ("INT64", [1, 2]),
        ("UINT8", [1, 1, 2]),
        ("FP32", [1]),
        ("BYTES", [1]),
    ]
    assert singles[1]["data"] == [16777217, 2**31 - 1]


class Circular(dict[str, Any]):
    def __init__(self) -> None:
        super().__init__(me=self)


def deep_list(depth: int) -> list[Any]:
    nested: list[Any] = []
    for _ in range(depth):
        nested = [nested]
    return nested


@pytest.mark.parametrize(
    ("output", "error"),
    [
        (np.array([1.0, 2.0]), "TypeError"),  # TorchServe answered the batch 503
        ({"p": np.float32(0.5)}, "TypeError"),
        (Circular(), "ValueError"),  # escaped Service.predict: the worker died
        (deep_list(5000), "RecursionError"),  # escaped Service.predict too
    ],
)
def test_defect_unsendable_plain_output_failed_the_batch(output: Any, error: str) -> None:
    # TorchServe serializes a plain answer itself; one it cannot (TypeError: 503 for the
    # whole batch; anything else escapes and kills the worker) fails its own request.
    outputs = {"bad": output, "good": {"label": "cat"}}
    rows = [{"body": "good"}, {"body": "bad"}, {"body": "good"}]
    context = FakeContext(len(rows))
    with MicroBatching(OutputHandler(outputs), micro_batch_size=3) as mb:
        out = mb(rows, context)
    assert {i: code for i, (code, _) in context.statuses.items()} == {1: 500}
    assert out[0] == out[2] == {"label": "cat"}
    assert out[1]["type"] == error and out[1]["request_id"] == "req-1"
    assert out[1]["message"].startswith("the handler's output of type ")
    for answer in out:
        encode(answer)


@pytest.mark.parametrize(
    "output",
    [b"\x00raw", bytearray(b"x"), "text", torch.ones(2), [1, 2.5, None], {"a": 1}, None, 3],
)
def test_plain_outputs_torchserve_sends_are_answered_unchanged(output: Any) -> None:
    with MicroBatching(OutputHandler({"k": output})) as mb:
        context = FakeContext(1)
        (answer,) = mb([{"body": "k"}], context)
    assert answer is output and context.statuses == {}


class UnreadableMessage(Exception):
    """A handler's exception whose message cannot be read."""

    def __str__(self) -> str:
        raise RuntimeError("no message")


class FailingRowHandler(RowHandler):
    def preprocess(self, data: list[Any]) -> list[Any]:
        bodies = [row.get("data", row.get("body")) for row in data]
        if "bad" in bodies:
            raise UnreadableMessage()
        return bodies


def test_an_exception_whose_message_cannot_be_read_fails_only_its_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The handler's exception is read at the boundary too: its __str__ raising used to
    # escape handle() while the batch's answers were built (503 for every request).
    # The pipeline's log lines format it too: the stdlib's handlers print such an error,
    # pytest's capture handler re-raises it unless raiseExceptions is off.
    monkeypatch.setattr(logging, "raiseExceptions", False)
    rows = [{"body": "a"}, {"body": "bad"}, {"body": "c"}]
    context = FakeContext(len(rows))
    with MicroBatching(FailingRowHandler(), micro_batch_size=3) as mb:
        out = mb(rows, context)
    assert out[0] == {"item": "a", "value": "a!"} and out[2] == {"item": "c", "value": "c!"}
    assert out[1] == {
        "code": 400,
        "type": "UnreadableMessage",
        "message": "UnreadableMessage",
        "request_id": "req-1",
    }
    assert context.statuses == {1: (400, "Bad Request")}


# -- defects found at the KServe / answers boundary -------------------------------------------

IDS_AND_MASK = {
    "inputs": [
        {"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": [101, 7, 102]},
        {"name": "attention_mask", "shape": [1, 3], "datatype": "INT64", "data": [1, 1, 1]},
    ]
}


def test_defect_multi_input_v2_body_refused_under_auto() -> None:
    # A valid OIP v2 body of two inputs got 400 "must be a list of one input" under the
    # default kserve "auto"; without micro-batching the handler would have received it.
    row = {"body": IDS_AND_MASK}
    requests, items = unpack([row], kserve="auto")
    assert requests[0].protocol == PLAIN and requests[0].error is None
    assert items == [row] and items[0] is row
    requests, items = unpack([row], kserve=True)  # a KServe deployment keeps the clear 400
    assert items == [] and "must be a list of one input" in str(requests[0].error)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (v2("UINT64", [2], [2**64 - 1, -1]), "-1 is out of range 0..18446744073709551615"),
        (v2("INT64", [2], [2**64 - 1, 1]), "18446744073709551615 is out of range"),
    ],
)
def test_defect_out_of_range_integer_reported_as_a_float(row: Any, message: str) -> None:
    # numpy read [2**64 - 1, -1] as float64: "-1.0 is out of range".
    (request,), _ = unpack([row], kserve=True)
    assert message in str(request.error) and ".0 " not in str(request.error)


@pytest.mark.parametrize(
    ("outputs", "datatype", "data"),
    [
        ([np.array([2**63 + 1], np.uint64), np.array([3], np.int64)], "UINT64", [2**63 + 1, 3]),
        ([np.array([2**62 + 1], np.uint64), np.array([-1], np.int64)], "INT64", [2**62 + 1, -1]),
        (
            [np.array([2**63 + 1], np.uint64), np.array([-1], np.int64)],
            "BYTES",
            [f"[{2**63 + 1}]", "[-1]"],
        ),
    ],
)
def test_defect_v2_uint64_and_int64_outputs_lost_precision(
    outputs: list[Any], datatype: str, data: list[Any]
) -> None:
    # numpy's common type of uint64 and int64 is float64: 2**63 + 1 came back as 2**63.
    output = v2_output(*outputs)
    assert (output["datatype"], output["data"]) == (datatype, data)


class UnalignedContext(FakeContext):
    """A context of more requests than rows: TorchServe's json envelope flattened them."""


def test_defect_v2_id_taken_from_another_request_when_rows_are_not_requests() -> None:
    # With rows that are not requests, the v2 answer's "id" was the request id of the
    # context's row of the same index (another request's), while statuses were withheld.
    body = v2_body("BYTES", [1], ["x"])
    with MicroBatching(RowHandler(), micro_batch_size=2) as mb:
        context = UnalignedContext(5)
        out = mb([{"body": body}, {"body": b"plain"}], context)
    assert context.statuses == {}  # proves the rows were not taken as the context's requests
    assert out[0]["id"] is None
    with MicroBatching(RowHandler(), micro_batch_size=2) as mb:
        out = mb([{"body": body}], FakeContext(1))
    assert out[0]["id"] == "req-0"  # aligned: the request's own id


class CountingHeaders:
    """A context whose per-request headers count how often they are read."""

    def __init__(self, n: int) -> None:
        self.request_count = n
        self.reads = 0

    def get_all_request_header(self, idx: int) -> dict[str, str]:
        self.reads += 1
        return {"Content-Type": "application/json"}


def test_defect_headers_built_for_every_row_without_kserve() -> None:
    rows = [{"body": b"a"}, {"body": b"b"}]
    context = CountingHeaders(len(rows))
    unpack(rows, kserve=False, context=context)
    assert context.reads == 0
    unpack(rows, kserve="auto", context=context)
    assert context.reads == 0  # bodies that cannot open with a JSON header: none read
    unpack([{"body": b'{"a": 1}'}, {"body": b"\xff\xd8"}], kserve="auto", context=context)
    assert context.reads == 1  # the binary extension's header, for the JSON-looking body


def test_defect_body_that_is_not_json_parsed_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    # A large body starting with "{" that is not JSON was decoded and parsed by json.loads,
    # then decoded and parsed again looking for a binary extension header.
    parses = []
    raw_decode = json.JSONDecoder.raw_decode

    def counting(self: json.JSONDecoder, s: str, idx: int = 0) -> tuple[Any, int]:
        parses.append(len(s))
        return raw_decode(self, s, idx)

    monkeypatch.setattr(json.JSONDecoder, "raw_decode", counting)
    for body in (b'{"a": 1} trailing' + b"x" * 100_000, b'{"a": "' + b"\xff" * 100_000):
        parses.clear()
        row = {"body": bytearray(body)}
        requests, items = unpack([row], kserve="auto")
        assert requests[0].protocol == PLAIN and items[0] is row
        assert len(parses) <= 1, parses


def test_defect_runtime_error_whose_message_cannot_be_read_failed_a_good_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A RuntimeError subclass: status_code_for read str(exc) unguarded for "out of memory"
    # while bisection asked whether the error was the request's own (declared_per_request).
    monkeypatch.setattr(logging, "raiseExceptions", False)

    class UnreadableRuntimeError(RuntimeError):
        def __str__(self) -> str:
            raise ValueError("no message")

    class Failing(RowHandler):
        def preprocess(self, data: list[Any]) -> list[Any]:
            bodies = [row.get("data", row.get("body")) for row in data]
            if "bad" in bodies:
                raise UnreadableRuntimeError()
            return bodies

    rows = [{"body": "a"}, {"body": "bad"}, {"body": "c"}]
    context = FakeContext(len(rows))
    with MicroBatching(Failing(), micro_batch_size=3) as mb:
        out = mb(rows, context)
    assert out[0] == {"item": "a", "value": "a!"} and out[2] == {"item": "c", "value": "c!"}
    assert out[1]["type"] == "UnreadableRuntimeError" and list(context.statuses) == [1]


def unpicklable_tensor() -> torch.Tensor:
    tensor = torch.ones(2)
    tensor.callback = lambda: None  # type: ignore[attr-defined]  # torch.save cannot pickle it
    return tensor


@pytest.mark.parametrize(
    ("output", "error"),
    [
        ("hi \ud800", "UnicodeEncodeError"),  # a lone surrogate, echoed from a JSON body
        (10**5000, "ValueError"),  # over the 4,300 digits int -> str allows
        ([1, 10**5000], "ValueError"),  # a flat list was never checked
        ({"n": 10**5000}, "ValueError"),
        (unpicklable_tensor(), "AttributeError"),  # torch.save raises
        (memoryview(b"x"), "TypeError"),  # TorchServe: 503 for the whole batch
    ],
    ids=["surrogate", "huge-int", "huge-int-in-list", "huge-int-in-dict", "tensor", "memoryview"],
)
def test_defect_plain_answer_torchserve_cannot_send_failed_the_batch(
    output: Any, error: str
) -> None:
    outputs = {"bad": output, "good": {"label": "cat"}}
    rows = [{"body": "good"}, {"body": "bad"}, {"body": "good"}]
    context = FakeContext(len(rows))
    with MicroBatching(OutputHandler(outputs), micro_batch_size=3) as mb:
        out = mb(rows, context)
    assert context.statuses == {1: (500, "Internal Server Error")}
    assert out[0] == out[2] == {"label": "cat"}
    assert out[1]["code"] == 500 and out[1]["type"] == error
    assert out[1]["request_id"] == "req-1"
    assert out[1]["message"].startswith(
        f"the handler's output of type {type(output).__name__} cannot be sent: {error}: "
    )
    for answer in out:
        encode(answer)
