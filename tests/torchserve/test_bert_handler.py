"""The BERT example's handler through TorchServe's loader and Service.predict, in-process.

The model directory is made once for the module as build_mar.py makes it (a WordPiece
trained on texts.py, a BertForSequenceClassification saved with save_pretrained), with a
smaller BERT so the tests stay fast, and laid out as the .mar extracts: no serialized
file, the model's files in the root. The key property: padding inside a micro-batch never
changes an answer (attention_mask), so a text gets what it gets alone, whatever shares its
micro-batch.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.torchserve.bert import (
    EXAMPLE,
    SMALL_BERT,
    build,
    close,
    example_config,
    texts,
)
from tests.torchserve.ts_machinery import decode, load_service, request, write_manifest

JSON = "application/json"


def extract(directory: Path, model_dir: Path, config: dict[str, Any]) -> Path:
    """The example laid out as its .mar extracts, with ``config`` as model-config.yaml."""
    shutil.copytree(model_dir, directory, dirs_exist_ok=True)
    for name in ("bert_handler.py", "texts.py"):
        shutil.copy(EXAMPLE / name, directory / name)
    (directory / "model-config.yaml").write_text(json.dumps(config), encoding="utf-8")
    write_manifest(directory, "bert_mb", "bert_handler.py", configFile="model-config.yaml")
    return directory


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build.make_model_dir(tmp_path_factory.mktemp("bert") / "model", bert=SMALL_BERT)


def start(directory: Path) -> Any:
    sys.path.insert(0, str(directory))  # as in a worker: texts.py beside the handler
    try:
        return load_service(
            directory, model_name="bert_mb", handler="bert_handler.py", batch_size=32
        )
    finally:
        sys.path.remove(str(directory))


@pytest.fixture(scope="module")
def service(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    service = start(extract(tmp_path_factory.mktemp("bert_mar"), model_dir, example_config()))
    yield service
    handler(service).micro_batching.shutdown()


def handler(service: Any) -> Any:
    return service._entry_point.__self__


def predict(service: Any, bodies: list[tuple[Any, str]]) -> list[tuple[int, Any]]:
    """Each (body, content type) one request of one batch: (status, JSON answer) each."""
    batch = [request(i, body, content_type) for i, (body, content_type) in enumerate(bodies)]
    code, answers = decode(service.predict(batch))
    assert code == 200
    return [(status, json.loads(body)) for _, status, body in answers]


def alone(service: Any, text: str) -> list[float]:
    ((status, answer),) = predict(service, [(text.encode(), "text/plain")])
    assert status == 200, answer
    return answer["scores"]  # type: ignore[no-any-return]


def test_a_from_pretrained_handler_registers(service: Any) -> None:
    bert = handler(service)
    assert "serializedFile" not in bert.manifest["model"]  # nothing for BaseHandler.initialize
    assert bert.initialized and not bert.model.training
    assert bert.model.config.num_hidden_layers == SMALL_BERT["num_hidden_layers"]
    assert len(bert.tokenizer) == 8000 and bert.model_max_tokens == 512
    assert sorted(bert.micro_batching.thread_groups) == ["inference", "postprocess", "preprocess"]


def test_a_bad_config_still_fails_registration(model_dir: Path, tmp_path: Path) -> None:
    config = example_config(parallelism={"inference": 0})
    with pytest.raises(Exception, match=r"parallelism.inference: got 0"):
        start(extract(tmp_path, model_dir, config))


def test_plain_json_and_kserve_bodies_are_all_answered(service: Any) -> None:
    one, two, three = (texts.make_text(seed, 12) for seed in (1, 2, 3))
    want = {text: alone(service, text) for text in (one, two, three)}
    v2 = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": [two, three]}]}
    answers = predict(
        service,
        [
            (one.encode(), "application/octet-stream"),  # raw UTF-8 bytes
            (one, "text/plain"),  # TorchServe decodes text/* to str
            ({"text": two}, JSON),  # and parses application/json
            (json.dumps({"text": three}).encode(), "application/octet-stream"),
            ({"instances": [one, {"text": two}]}, JSON),  # KServe v1
            (v2, JSON),  # KServe v2, BYTES
        ],
    )
    assert [status for status, _ in answers] == [200] * 6, answers
    plain = [answer for _, answer in answers[:4]]
    assert all(set(a) == {"label", "scores"} and len(a["scores"]) == 3 for a in plain)
    labels = handler(service).labels
    assert all(a["label"] == labels[a["scores"].index(max(a["scores"]))] for a in plain)
    for answer, text in zip(plain, (one, one, two, three)):
        assert close(answer["scores"], want[text])
    v1_predictions = answers[4][1]["predictions"]
    assert [close(p["scores"], want[t]) for p, t in zip(v1_predictions, (one, two))] == [True] * 2
    output = answers[5][1]["outputs"][0]
    assert output["datatype"] == "BYTES" and output["shape"] == [2]
    v2_predictions = [json.loads(d) for d in output["data"]]
    assert [close(p["scores"], want[t]) for p, t in zip(v2_predictions, (two, three))] == [True] * 2


def test_every_answer_of_a_mixed_length_batch_is_what_the_text_gets_alone(service: Any) -> None:
    lengths = [3, 300, 17, 120, 5, 250, 40, 9, 180, 64, 3, 90, 220, 28, 150, 11]
    batch_texts = [texts.make_text(100 + i, n) for i, n in enumerate(lengths)]
    want = [alone(service, text) for text in batch_texts]
    bert = handler(service)
    padded_rows: list[int] = []
    inference = bert.inference

    def recording(data: dict[str, Any]) -> Any:
        mask = data["attention_mask"]
        padded_rows.append(int((mask.sum(dim=1) < mask.shape[1]).sum()))
        return inference(data)

    bert.inference = recording
    try:
        answers = predict(service, [(text.encode(), "text/plain") for text in batch_texts])
    finally:
        del bert.inference
    assert sum(padded_rows) > 0  # rows were padded: the scenario happened
    assert [status for status, _ in answers] == [200] * len(lengths)
    for i, ((_, answer), scores) in enumerate(zip(answers, want)):
        assert close(answer["scores"], scores), (i, lengths[i], answer["scores"], scores)
        assert answer["label"] == bert.labels[scores.index(max(scores))]


BAD_BODIES = [
    (b"", "application/octet-stream", "empty"),
    ("   \n", "text/plain", "empty"),
    (b"\xff\xfe not utf-8 \xc3\x28", "application/octet-stream", "not UTF-8"),
    ({"txt": "no text key"}, JSON, "JSON body must be an object"),
    (b'{"text": 42}', "application/octet-stream", "JSON body must be an object"),
    ([1, 2, 3], JSON, "got list"),
]


def test_a_bad_body_gets_400_alone_and_the_others_their_answers(service: Any) -> None:
    good = [texts.make_text(200 + i, 10 + 30 * i) for i in range(4)]
    want = [alone(service, text) for text in good]
    bodies: list[tuple[Any, str]] = []
    for i, (body, content_type, _) in enumerate(BAD_BODIES):
        bodies.append((good[i % len(good)].encode(), "text/plain"))
        bodies.append((body, content_type))
    answers = predict(service, bodies)
    for i, (_, _, message) in enumerate(BAD_BODIES):
        (good_status, good_answer), (bad_status, bad_answer) = answers[2 * i], answers[2 * i + 1]
        assert good_status == 200 and close(good_answer["scores"], want[i % len(good)])
        assert bad_status == 400, (BAD_BODIES[i], bad_answer)
        assert message in bad_answer["message"]


def test_a_text_over_the_token_limit_gets_413_alone(service: Any) -> None:
    short, long = texts.make_text(300, 20), texts.make_text(301, 700)
    bert = handler(service)
    assert bert.item_length(long.encode()) > 512  # over the model's 512 positions
    answers = predict(service, [(short.encode(), "text/plain"), (long.encode(), "text/plain")])
    assert answers[0][0] == 200 and close(answers[0][1]["scores"], alone(service, short))
    assert answers[1][0] == 413, answers[1]


def test_item_length_counts_the_tokens_preprocess_pads(service: Any) -> None:
    bert = handler(service)
    text = texts.make_text(400, 50)
    tokens = len(bert.tokenizer(text)["input_ids"])
    for row in (text.encode(), {"body": bytearray(text.encode())}, {"text": text}, {"data": text}):
        assert bert.item_length(row) == tokens
    assert bert.preprocess([text.encode()])["input_ids"].shape == (1, tokens)
    with pytest.raises(Exception, match="empty"):
        bert.item_length(b"")


def test_preprocess_pads_to_the_length_the_pipeline_chose(
    service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bert = handler(service)
    rows = [texts.make_text(500, 5).encode(), texts.make_text(501, 20).encode()]
    info = SimpleNamespace(padded_length=96, lengths=None)
    monkeypatch.setattr(bert.micro_batching, "current_micro_batch", lambda: info)
    padded = bert.preprocess(rows)
    monkeypatch.undo()
    longest = bert.preprocess(rows)
    assert padded["input_ids"].shape == (2, 96) and longest["input_ids"].shape[1] < 96
    got = bert.postprocess(bert.inference(padded))
    want = bert.postprocess(bert.inference(longest))
    assert all(close(g["scores"], w["scores"]) for g, w in zip(got, want))


def test_warmup_input_is_about_the_length_asked(service: Any) -> None:
    bert = handler(service)
    sys.path.insert(0, str(EXAMPLE))  # where the worker finds texts.py: the model dir
    try:
        for length in (8, 100, 400):
            tokens = bert.item_length(bert.warmup_input(length))
            assert length * 0.8 <= tokens <= length
        assert bert.item_length(bert.warmup_input()) > 0
    finally:
        sys.path.remove(str(EXAMPLE))


def test_truncate_cuts_long_texts_instead_of_refusing_them(model_dir: Path, tmp_path: Path) -> None:
    config = example_config(truncate=True, max_tokens=128)
    truncating = start(extract(tmp_path, model_dir, config))
    try:
        long = texts.make_text(600, 700)
        assert handler(truncating).item_length(long.encode()) == 128
        ((status, answer),) = predict(truncating, [(long.encode(), "text/plain")])
        assert status == 200 and len(answer["scores"]) == 3
    finally:
        handler(truncating).micro_batching.shutdown()


def test_pt2_section_not_ignored_by_a_handler_that_loads_its_model_itself(
    service: Any, model_dir: Path, tmp_path: Path
) -> None:
    """TorchServe reads ``pt2:`` in BaseHandler.initialize, which this handler skips: a
    compiled config served the eager model, silently, and the compiled-model rules (one
    inference thread, recompiles counted) never applied."""
    import torch

    from ts_microbatch.torchserve.compiled import is_compiled

    pt2 = {"compile": {"enable": True, "backend": "eager", "dynamic": False}}
    compiled = start(extract(tmp_path / "ok", model_dir, {**example_config(), "pt2": pt2}))
    try:
        bert = handler(compiled)
        assert is_compiled(bert.model) and bert.micro_batching.compiled is not None
        text = texts.make_text(700, 12)
        ((status, answer),) = predict(compiled, [(text.encode(), "text/plain")])
        assert status == 200 and close(answer["scores"], alone(service, text))
    finally:
        handler(compiled).micro_batching.shutdown()
        torch._dynamo.reset()  # the compiled-model tests count compiles per process
    with pytest.raises(Exception, match=r"pt2: got 'inductor'"):
        start(extract(tmp_path / "bad", model_dir, {**example_config(), "pt2": "inductor"}))
