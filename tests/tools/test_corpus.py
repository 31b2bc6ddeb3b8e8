"""Corpora (ts_microbatch.tools.corpus): reading, content types, the fixed order, labels,
and the tuner's --corpus (arguments and the batches it measures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ts_microbatch.tools import inprocess, tune
from ts_microbatch.tools.corpus import Body, Corpus, CorpusError, read_corpus, rows_of


def write_dir(root: Path) -> Path:
    root.mkdir()
    (root / "short.txt").write_text("hi there")
    (root / "long.txt").write_text("word " * 40)
    (root / "query.json").write_text('{"text": "abc"}')
    (root / "photo.JPG").write_bytes(b"\xff\xd8\xff fake jpeg")
    (root / "shot.png").write_bytes(b"\x89PNG fake")
    (root / "blob.bin").write_bytes(bytes(range(7)))
    (root / ".hidden").write_text("not a body")
    (root / "nested").mkdir()
    return root


def test_a_directory_is_one_body_per_file_typed_by_extension(tmp_path: Path) -> None:
    corpus = read_corpus(write_dir(tmp_path / "bodies"))
    types = {b.name: b.content_type for b in corpus.bodies}
    assert types == {
        "blob.bin": "application/octet-stream",
        "long.txt": "text/plain",
        "photo.JPG": "image/jpeg",
        "query.json": "application/json",
        "short.txt": "text/plain",
        "shot.png": "image/png",
    }
    values = {b.name: b.torchserve_value() for b in corpus.bodies}
    # as TorchServe's worker hands them over: str for text, parsed JSON, bytes otherwise
    assert values["short.txt"] == "hi there" and values["query.json"] == {"text": "abc"}
    assert values["blob.bin"] == bytes(range(7))
    assert corpus.unit == "bytes"  # images and bytes in it: lengths in bytes


def test_jsonl_strings_are_text_and_objects_json(tmp_path: Path) -> None:
    path = tmp_path / "mix.jsonl"
    path.write_text('"a short text"\n\n{"text": "déjà vu", "n": 2}\n"third"\n')
    corpus = read_corpus(path)
    assert [b.name for b in corpus.bodies] == ["mix.jsonl:1", "mix.jsonl:3", "mix.jsonl:4"]
    assert [b.content_type for b in corpus.bodies] == [
        "text/plain",
        "application/json",
        "text/plain",
    ]
    assert json.loads(corpus.bodies[1].data) == {"text": "déjà vu", "n": 2}
    assert rows_of(corpus.bodies[:1]) == [{"body": "a short text"}]
    assert corpus.unit == "chars" and corpus.bodies[0].length == len("a short text")
    path.write_text('"ok"\n[1, 2]\n')
    with pytest.raises(CorpusError, match=r"mix.jsonl:2: got list, expected a string"):
        read_corpus(path)
    path.write_text('"ok"\n{broken\n')
    with pytest.raises(CorpusError, match=r"mix.jsonl:2: not JSON"):
        read_corpus(path)
    path.write_text("\n")
    with pytest.raises(CorpusError, match="no request bodies"):
        read_corpus(path)
    with pytest.raises(CorpusError, match="no such file"):
        read_corpus(tmp_path / "missing")


def test_the_order_is_shuffled_fixed_and_sends_every_body_in_turn(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text("".join(f'"{"w " * n}"\n' for n in range(1, 11)))
    corpus = read_corpus(path)
    order = corpus.order
    assert sorted(order) == list(range(10)) and order != list(range(10))  # shuffled
    assert read_corpus(path).order == order  # the same in every run
    assert read_corpus(path, seed=1).order != order
    assert corpus.sequence(25) == order + order + order[:5]
    # the weights a run reports: how many requests took each body
    described = corpus.describe(25)
    sent = {b["name"]: b["requests"] for b in described["bodies"]}
    assert sum(sent.values()) == 25 and sorted(set(sent.values())) == [2, 3]
    assert {corpus.bodies[i].name for i in order[:5]} == {n for n, k in sent.items() if k == 3}
    assert described["bodies"][0]["share"] == sent["c.jsonl:1"] / 25


def test_labels_say_what_the_bodies_are(tmp_path: Path) -> None:
    path = tmp_path / "texts.jsonl"
    path.write_text('"abcd"\n"ab"\n"abcdefghij"\n')
    assert read_corpus(path).label == "texts.jsonl: 3 bodies, 2-10 chars, median 4"
    one = tmp_path / "review.txt"
    one.write_text("a review of a film")
    assert read_corpus(one).label == "review.txt"  # a single body: its file name, never 720px
    images = read_corpus(write_dir(tmp_path / "imgs"))
    assert images.label.startswith("imgs: 6 bodies, ") and " bytes, median " in images.label


def test_tune_takes_a_corpus_or_one_input(tmp_path: Path) -> None:
    parser = tune.build_parser()
    objective = ["--slo-p99-ms", "100"]
    args = parser.parse_args(["--mar", "m.mar", "--corpus", str(tmp_path), *objective])
    assert args.corpus == tmp_path and args.input is None
    for argv in (["--mar", "m.mar"], ["--mar", "m.mar", "--input", "x", "--corpus", "y"]):
        with pytest.raises(SystemExit):
            parser.parse_args([*argv, *objective])
    sample = tmp_path / "sample.txt"
    sample.write_text("one body")
    one = tune.tuning_corpus(parser.parse_args(["--mar", "m", "--input", str(sample), *objective]))
    # --input is sent as bytes, in-process and by ab, as before
    assert one.bodies == (Body("sample.txt", b"one body", "application/octet-stream"),)
    with pytest.raises(SystemExit, match="--corpus: .*no such file"):
        tune.tuning_corpus(
            parser.parse_args(["--mar", "m", "--corpus", str(tmp_path / "no"), *objective])
        )


def test_tune_measures_batches_drawn_from_the_corpus_in_order(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text("".join(f'"text {n}"\n' for n in range(7)))
    args = tune.build_parser().parse_args(
        ["--mar", "m", "--corpus", str(path), "--slo-p99-ms", "1"]
    )
    corpus = tune.tuning_corpus(args)
    batches = corpus.batches(batch_size=4, count=3)
    assert [len(b) for b in batches] == [4, 4, 4]
    drawn = [b.name for batch in batches for b in batch]
    assert drawn == [corpus.bodies[i].name for i in corpus.sequence(12)]
    assert len(set(drawn)) == 7  # the whole mix is measured, not one body

    seen: list[list[str]] = []

    class FakeMicroBatching:
        """Records the rows of each batch; answers every request 200."""

        def __call__(self, rows: list[dict[str, str]], context: object) -> None:
            seen.append([r["body"] for r in rows])

    class FakeContext:
        def get_response_status(self, i: int) -> tuple[int, str]:
            return 200, ""

    original = inprocess.fresh_batch
    inprocess.fresh_batch = lambda context, n: None  # type: ignore[assignment]
    try:
        inprocess.measure_with_cpu(FakeMicroBatching(), FakeContext(), batches)  # type: ignore[arg-type]
    finally:
        inprocess.fresh_batch = original
    assert seen == [[b.torchserve_value() for b in batch] for batch in batches]


def test_a_stall_is_measured_again_and_a_long_body_keeps_its_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch far over the median runs again: a stall (once) goes, a long body (every
    time) stays, so the tuner's spread is the corpus's own. A fake clock: no timing."""
    clock = [0.0]
    calls: list[str] = []
    stalled = {"b3"}  # stalls on its first run only

    class FakeTime:
        perf_counter = staticmethod(lambda: clock[0])
        process_time = staticmethod(lambda: clock[0])

    class FakeMicroBatching:
        def __call__(self, rows: list[dict[str, str]], context: object) -> None:
            name = rows[0]["body"]
            calls.append(name)
            clock[0] += 10.0 if name == "long" else 1.0
            if name in stalled:
                stalled.discard(name)
                clock[0] += 50.0

    class FakeContext:
        def get_response_status(self, i: int) -> tuple[int, str]:
            return 200, ""

    monkeypatch.setattr(inprocess, "time", FakeTime)
    monkeypatch.setattr(inprocess, "fresh_batch", lambda context, n: None)
    names = ["warm", "b1", "b2", "b3", "long", "b5"]
    batches = [[Body(f"{n}.txt", n.encode(), "text/plain")] for n in names]
    median, _, each = inprocess.measure_with_cpu(FakeMicroBatching(), FakeContext(), batches)  # type: ignore[arg-type]
    reruns = inprocess.STALL_RERUNS
    assert calls.count("b3") == 1 + reruns and calls.count("long") == 1 + reruns  # the scenario
    assert calls.count("b1") == 1  # a batch near the median is not run again
    assert each == (1.0, 1.0, 1.0, 10.0, 1.0) and median == 1.0


def test_a_corpus_of_one_body_and_an_empty_one() -> None:
    with pytest.raises(CorpusError, match="no request bodies"):
        Corpus("nothing", ())
    single = Corpus("x", (Body("x.bin", b"\x00", "application/octet-stream"),))
    assert single.sequence(3) == [0, 0, 0] and single.label == "x.bin"
