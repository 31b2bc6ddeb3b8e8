"""Length settings through TorchServe's loader and ``Service.predict``, on the text example.

The text example has no ``item_length``, so lengths are the bodies' sizes (the default).
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.torchserve.metric_lines import written
from tests.torchserve.test_text_padding import extract
from tests.torchserve.ts_machinery import decode, load_service, request
from ts_microbatch.torchserve.metrics import PADDED_TOKENS, TOKENS

TEXTS = [
    "great movie",
    "awful awful awful plot and a great cast " * 6,
    "movie",
    "great",
    "a long review of a movie that was awful and then great " * 3,
]


def predict(service: Any, bodies: list[bytes]) -> list[tuple[int, Any]]:
    batch = [request(i, body, "text/plain") for i, body in enumerate(bodies)]
    code, answers = decode(service.predict(batch))
    assert code == 200
    return [(status, json.loads(body)) for _, status, body in answers]


def loaded(tmp_path: Path, settings: dict[str, Any]) -> Any:
    return load_service(
        extract(tmp_path, settings), model_name="text_mb", handler="text_handler.py"
    )


def handler_of(service: Any) -> Any:
    return service._entry_point.__self__


def close(service: Any) -> None:
    handler_of(service).micro_batching.shutdown()


def record_preprocess(service: Any) -> list[tuple[list[int], threading.Thread]]:
    """Wraps the handler's preprocess: each call's body sizes and thread, in call order."""
    handler = handler_of(service)
    preprocess, calls = handler.preprocess, []

    def recording(data: list[Any]) -> Any:
        calls.append(([len(row["body"]) for row in data], threading.current_thread()))
        return preprocess(data)

    handler.preprocess = recording
    return calls


def close_to(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-5 for k in a)


def test_length_order_answers_every_request_in_its_own_place(tmp_path: Path) -> None:
    settings = {"micro_batch_size": 2, "order": "length", "max_micro_batch_tokens": 400}
    service = loaded(tmp_path, settings)
    calls = record_preprocess(service)
    try:
        alone = [predict(service, [t.encode()])[0] for t in TEXTS]
        calls.clear()
        together = predict(service, [t.encode() for t in TEXTS])
    finally:
        close(service)
    # The scenario: the batch was cut by length, not in arrival order.
    assert [n for sizes, _ in calls for n in sizes] == sorted(len(t) for t in TEXTS)
    assert [status for status, _ in together] == [200] * len(TEXTS)
    for (_, body), (_, single) in zip(together, alone):
        assert close_to(body, single)


def test_a_body_over_max_tokens_gets_413_alone_before_any_stage(tmp_path: Path) -> None:
    service = loaded(tmp_path, {"micro_batch_size": 4, "max_tokens": 100})
    calls = record_preprocess(service)
    try:
        answers = predict(service, [t.encode() for t in TEXTS])
    finally:
        close(service)
    long_ones = [i for i, t in enumerate(TEXTS) if len(t.encode()) > 100]
    assert long_ones and len(long_ones) < len(TEXTS)
    seen = [n for sizes, _ in calls for n in sizes]
    assert sorted(seen) == sorted(len(t) for i, t in enumerate(TEXTS) if i not in long_ones)
    for i, (status, body) in enumerate(answers):
        if i in long_ones:
            assert status == 413 and body["type"] == "PayloadTooLargeError"
            assert "max_tokens" in body["message"]
        else:
            assert status == 200


def test_enabled_false_runs_the_handlers_own_handle_on_the_whole_batch(tmp_path: Path) -> None:
    service = loaded(tmp_path, {"micro_batch_size": 2, "enabled": False})
    calls = record_preprocess(service)
    try:
        answers = predict(service, [t.encode() for t in TEXTS])
    finally:
        close(service)
    # One call with the whole batch, on the worker's own thread: BaseHandler.handle's shape.
    assert [(len(sizes), thread) for sizes, thread in calls] == [
        (len(TEXTS), threading.current_thread())
    ]
    assert [status for status, _ in answers] == [200] * len(TEXTS)


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"order": "shortest"}, "micro_batching.order"),
        ({"max_tokens": 0}, "micro_batching.max_tokens"),
        ({"allowed_sequence_lengths": [64, 64]}, "micro_batching.allowed_sequence_lengths"),
        ({"truncate": True}, "micro_batching.truncate"),
        ({"max_tokens": 600, "allowed_sequence_lengths": [128, 512]}, "micro_batching.max_tokens"),
        ({"enabled": "no"}, "micro_batching.enabled"),
    ],
)
def test_bad_length_settings_fail_the_load_naming_the_key(
    tmp_path: Path, settings: dict[str, Any], key: str
) -> None:
    with pytest.raises(Exception) as info:
        loaded(tmp_path, settings)
    assert type(info.value).__name__ == "ConfigError"
    assert key in str(info.value)


def test_real_and_padded_tokens_are_counted_per_micro_batch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    service = loaded(tmp_path, {"micro_batch_size": 2, "order": "length", "metrics_interval_s": 0})
    with caplog.at_level(logging.INFO):
        try:
            predict(service, [t.encode() for t in TEXTS])
        finally:
            close(service)  # writes the metric lines still pending (their own thread writes them)
    lines = written(caplog.records, "[METRICS]MicroBatch")

    def counted(name: str) -> list[float]:
        prefix = f"[METRICS]{name}.Count:"
        return [
            float(line.split(":")[1].split("|")[0]) for line in lines if line.startswith(prefix)
        ]

    lengths = sorted(len(t) for t in TEXTS)
    pairs = [lengths[i : i + 2] for i in range(0, len(lengths), 2)]
    assert counted(TOKENS) == [float(sum(p)) for p in pairs]
    assert counted(PADDED_TOKENS) == [float(len(p) * max(p)) for p in pairs]
