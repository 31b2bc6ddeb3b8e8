"""Padding to allowed sizes with the text example, through TorchServe's loader and predict.

examples/text_classifier's preprocess returns one flat tensor of every request's token ids
and the offsets where each request starts. With three one-word requests the flat tensor has
three rows, as many as the micro-batch: padding it as if it were batch-major gave request 2
an empty bag, answered with 200. Whole requests are padded by default; padding tensors is
the handler's declaration, checked at load.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import ROOT, load_module
from tests.torchserve.ts_machinery import decode, load_service, request, write_manifest

EXAMPLE = Path(ROOT, "examples/text_classifier")
WORDS = ["great", "awful", "movie"]


def extract(directory: Path, micro_batching: dict[str, Any]) -> Path:
    """The text example laid out as its .mar extracts, with ``micro_batching`` settings."""
    model = load_module("examples/text_classifier/model.py", "ts_microbatch_text_model")
    torch.manual_seed(0)
    torch.save(model.TextClassifier().state_dict(), directory / "text_classifier.pth")
    # A module name of its own: TorchServe imports the model file by name, and other tests of
    # this process imported the image example's model.py as "model".
    shutil.copy(EXAMPLE / "model.py", directory / "text_classifier_model.py")
    shutil.copy(EXAMPLE / "text_handler.py", directory / "text_handler.py")
    (directory / "sample.txt").write_text("great", encoding="utf-8")
    (directory / "model-config.yaml").write_text(
        json.dumps({"micro_batching": micro_batching}), encoding="utf-8"
    )
    write_manifest(
        directory,
        "text_mb",
        "text_handler.py",
        serializedFile="text_classifier.pth",
        modelFile="text_classifier_model.py",
        configFile="model-config.yaml",
    )
    return directory


def predict(service: Any, words: list[str]) -> list[tuple[int, Any]]:
    batch = [request(i, word.encode(), "text/plain") for i, word in enumerate(words)]
    code, answers = decode(service.predict(batch))
    assert code == 200
    return [(status, json.loads(body)) for _, status, body in answers]


def test_hang_text_example_padded_answered_an_empty_bag_with_200(tmp_path: Path) -> None:
    settings = {"micro_batch_size": 4, "allowed_micro_batch_sizes": [1, 2, 4]}
    service = load_service(
        extract(tmp_path, settings), model_name="text_mb", handler="text_handler.py"
    )
    try:
        alone = [predict(service, [word])[0] for word in WORDS]  # micro-batches of one
        together = predict(service, WORDS)  # one micro-batch of 3, padded to 4
    finally:
        service._entry_point.__self__.micro_batching.shutdown()
    assert len({json.dumps(body) for _, body in alone}) == 3  # the answers tell rows apart
    assert [status for status, _ in together] == [200, 200, 200]
    for (_, body), (_, single) in zip(together, alone):
        assert body.keys() == single.keys()
        assert all(abs(body[k] - single[k]) < 1e-5 for k in body)


def test_pad_tensors_on_the_text_example_is_refused_at_load(tmp_path: Path) -> None:
    settings = {
        "micro_batch_size": 4,
        "allowed_micro_batch_sizes": [1, 2, 4],
        "pad": "tensors",
        "warmup": {"sample": "sample.txt"},
    }
    with pytest.raises(Exception) as info:
        load_service(extract(tmp_path, settings), model_name="text_mb", handler="text_handler.py")
    assert type(info.value).__name__ == "WarmupError"
    assert "padded to 4 answered row 2 differently" in str(info.value)
