"""The sentence embedding workload (benchmarks/dev/embedding), built and loaded in-process as
the latency tuner loads it (ts_microbatch.tools.inprocess), no server: each body of a batch
embedded as it is alone, a unit vector of 256; a bad body its own 400 inside a batch of
good ones; the corpus and the tokenizer as the README says.

Embeddings are compared within 1e-5: the model is the same, but a micro-batch pads its rows
to the longest, and a matrix product over padded rows may sum in another order (float32).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import load_module
from ts_microbatch import InvalidInputError
from ts_microbatch.tools import inprocess
from ts_microbatch.tools.corpus import read_corpus, rows_of

build = load_module("benchmarks/dev/embedding/build.py", "ts_microbatch_embedding_build")
handler_module = load_module(
    "benchmarks/dev/embedding/embedding_handler.py", "ts_microbatch_embedding_handler"
)
TOLERANCE = 1e-5
WIDTH = 256


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("embedding_work")


@pytest.fixture(scope="module")
def loaded(work: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """The .mar built into a temp dir, unpacked, its handler's MicroBatching loaded."""
    tmp = tmp_path_factory.mktemp("embedding")
    mar = build.build_mar(tmp / "store", work_dir=work)
    model_dir = inprocess.model_dir_of(mar, tmp / "model")
    _, mb = inprocess.load_handler(model_dir, inprocess.make_context(model_dir, 8))
    yield mb, model_dir
    mb.shutdown()


def run(loaded: tuple[Any, Path], rows: list[dict[str, Any]]) -> tuple[list[int], list[Any]]:
    """Each row's status and answer, the rows sent as one batch."""
    mb, model_dir = loaded
    context = inprocess.make_context(model_dir, len(rows))
    answers = mb(rows, context)
    return [context.get_response_status(i)[0] for i in range(len(rows))], answers


def alone(loaded: tuple[Any, Path], row: dict[str, Any]) -> list[float]:
    statuses, answers = run(loaded, [row])
    assert statuses == [200]
    return answers[0]["embedding"]  # type: ignore[no-any-return]


def close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(abs(g - w) <= TOLERANCE for g, w in zip(got, want))


def corpus_rows(work: Path, count: int) -> list[dict[str, Any]]:
    corpus = read_corpus(work / build.CORPUS_FILE)
    return rows_of(corpus.batches(count, 1)[0])


@pytest.mark.parametrize("micro_batch_size", ["auto", 3])
def test_each_body_of_a_batch_is_embedded_as_it_is_alone(
    loaded: tuple[Any, Path], work: Path, micro_batch_size: Any
) -> None:
    mb, _ = loaded
    mb.micro_batch_size = micro_batch_size
    rows = corpus_rows(work, 8)
    statuses, answers = run(loaded, rows)
    assert statuses == [200] * 8
    for row, answer in zip(rows, answers):
        embedding = answer["embedding"]
        assert len(embedding) == WIDTH
        assert abs(math.sqrt(sum(v * v for v in embedding)) - 1.0) <= TOLERANCE
        assert close(embedding, alone(loaded, row))


def test_a_body_without_text_gets_its_own_400_and_the_others_their_embeddings(
    loaded: tuple[Any, Path], work: Path
) -> None:
    mb, _ = loaded
    mb.micro_batch_size = 4
    rows = corpus_rows(work, 8)
    rows[5] = {"body": {"txt": "x"}}
    statuses, answers = run(loaded, rows)
    assert statuses == [200] * 5 + [400] + [200] * 2
    assert answers[5]["type"] == "InvalidInputError" and "txt" in answers[5]["message"]
    for i in (0, 1, 2, 3, 4, 6, 7):
        assert close(answers[i]["embedding"], alone(loaded, rows[i]))


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"txt": "x"}, "keys ['txt']"),
        ({"text": 3}, "got int"),
        ({"text": " \n\t "}, "no words"),
        (b"\xff", "not UTF-8"),
        ("{", "not JSON"),
        ([1, 2], "got list"),
    ],
)
def test_each_bad_body_is_refused_naming_what_is_wrong(body: Any, names: str) -> None:
    with pytest.raises(InvalidInputError, match=names.replace("[", r"\[").replace("]", r"\]")):
        handler_module.tokenize(handler_module.read_text({"body": body}))


def test_words_are_cut_into_pieces_of_six_hashed_within_the_vocabulary_and_truncated() -> None:
    ids = handler_module.tokenize("Abcdefghij KLM")
    assert len(ids) == 3 and ids == handler_module.tokenize("abcdefghij klm")
    assert all(1 <= i < handler_module.VOCAB for i in ids)
    assert len(handler_module.tokenize("word " * 1000)) == handler_module.MAX_TOKENS
    assert handler_module.read_text(b'{"text": "a b"}') == "a b"


def test_the_handler_and_the_model_agree_on_vocabulary_and_length() -> None:
    assert handler_module.VOCAB == build.model.VOCAB
    assert handler_module.MAX_TOKENS == build.model.MAX_TOKENS


def test_the_corpus_is_512_bodies_of_5_to_300_words_the_same_at_every_build(
    work: Path, tmp_path: Path, loaded: tuple[Any, Path]
) -> None:
    lines = (work / build.CORPUS_FILE).read_text(encoding="utf-8").splitlines()
    counts = [len(json.loads(line)["text"].split()) for line in lines]
    assert len(counts) == 512 and min(counts) >= 5 and max(counts) <= 300
    assert min(counts) < 10 and max(counts) > 200  # a mix of lengths, not one
    again = build.write_corpus(tmp_path / build.CORPUS_FILE)
    assert again.read_bytes() == (work / build.CORPUS_FILE).read_bytes()
    sample = json.loads((work / build.SAMPLE_FILE).read_text(encoding="utf-8"))
    assert len(sample["text"].split()) == build.SAMPLE_WORDS
