"""Drop-in fidelity: ``MicroBatching`` used as upstream's is, unit-tested as handler authors
test theirs, with TorchServe's own ``MockContext``.

Upstream's tests (pytorch/serve ``ts/tests/unit_tests/test_micro_batching.py``) build an
``ImageClassifier`` whose ``__init__`` sets ``self.handle = MicroBatching(self, size)``,
call ``handle(rows, MockContext)`` with batches of 1 and 16 at micro-batch sizes 1 and 8,
check the micro-batch indices preprocess saw, and count ``thread_groups`` while they
change ``parallelism``. These tests cover the same surface on a random ResNet-18: every
request's answer is compared with TorchServe's plain ``ImageClassifier`` on the same photo
(every photo distinct, so mixed-up rows show), and they add what upstream leaves out: a
bad request and a broken stage, which must be answered, not raised or hung.
"""

from __future__ import annotations

import math
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ts.torch_handler.image_classifier import ImageClassifier
from ts.torch_handler.unit_tests.test_utils.mock_context import MockContext

from tests.torchserve.images import jpeg_rows
from ts_microbatch import MicroBatching

STAGES = ("preprocess", "inference", "postprocess")
BATCH = 16
TOLERANCE = 1e-5  # one photo's probabilities alone and in a batch of 16, on a CPU


class UpstreamStyleHandler(ImageClassifier):  # type: ignore[misc]
    """Written as upstream's documentation says: MicroBatching replaces ``handle``."""

    def __init__(self, micro_batch_size: int) -> None:
        super().__init__()
        self.handle = MicroBatching(self, micro_batch_size)
        self.micro_batch_indices: set[int | None] = set()
        self.preprocessed: list[int] = []  # the sizes preprocess was called with
        self._seen = threading.Lock()

    def preprocess(self, data: list[Any]) -> Any:
        with self._seen:
            self.micro_batch_indices.add(self.handle.get_micro_batch_idx())
            self.preprocessed.append(len(data))
        return super().preprocess(data)


MODEL_FILE = "upstream_surface_resnet.py"


def mock_context(model_dir: Path) -> MockContext:
    return MockContext(
        model_pt_file="resnet18.pth", model_dir=str(model_dir), model_file=MODEL_FILE
    )


@pytest.fixture(scope="module")
def resnet_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The shared ResNet-18 directory, its model file under a name of its own: BaseHandler
    imports the model file by module name, and another test may have imported a "model"."""
    directory = tmp_path_factory.mktemp("upstream_surface")
    shutil.copy(model_dir / "model.py", directory / MODEL_FILE)
    for name in ("resnet18.pth", "index_to_name.json"):
        (directory / name).symlink_to(model_dir / name)
    sys.path.insert(0, str(directory))
    yield directory
    sys.path.remove(str(directory))


@pytest.fixture(scope="module")
def rows() -> list[dict[str, bytes]]:
    return jpeg_rows(BATCH, size=(64, 48))


@pytest.fixture(scope="module")
def plain(resnet_dir: Path, rows: list[dict[str, bytes]]) -> list[dict[str, float]]:
    """TorchServe's ImageClassifier, without micro-batching, on the same photos."""
    handler = ImageClassifier()
    context = mock_context(resnet_dir)
    handler.initialize(context)
    answers: list[dict[str, float]] = handler.handle(rows, context)
    # The photos tell apart: a row answered with another row's output would show.
    assert all(distinct(a, b) for i, a in enumerate(answers) for b in answers[i + 1 :])
    return answers


def distinct(a: dict[str, float], b: dict[str, float]) -> bool:
    return list(a) != list(b) or max(abs(x - y) for x, y in zip(a.values(), b.values())) > (
        10 * TOLERANCE
    )


@pytest.fixture
def handler(resnet_dir: Path) -> Iterator[UpstreamStyleHandler]:
    h = UpstreamStyleHandler(micro_batch_size=1)
    h.initialize(mock_context(resnet_dir))
    yield h
    h.handle.shutdown()


def assert_answers(got: list[Any], want: list[dict[str, float]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert list(g) == list(w), "top-5 classes differ"
        assert list(g.values()) == pytest.approx(list(w.values()), abs=TOLERANCE)


def thread_counts(mb: MicroBatching) -> dict[str, int]:
    return {stage: len(threads) for stage, threads in mb.thread_groups.items()}


@pytest.mark.parametrize(
    ("batch", "micro_batch_size"),
    [(1, 1), (1, 8), (5, 2), (16, 1), (16, 3), (16, 8), (16, 16)],
)
def test_defect_mock_context_handle_answers_every_request(
    handler: UpstreamStyleHandler,
    resnet_dir: Path,
    rows: list[dict[str, bytes]],
    plain: list[dict[str, float]],
    batch: int,
    micro_batch_size: int,
) -> None:
    # Was: AttributeError: 'MockContext' object has no attribute 'request_count'.
    handler.handle.micro_batch_size = micro_batch_size
    handler.handle.parallelism = {"preprocess": 1, "inference": 2, "postprocess": 3}
    got = handler.handle(rows[:batch], mock_context(resnet_dir))
    assert_answers(got, plain[:batch])
    assert handler.micro_batch_indices == set(range(math.ceil(batch / micro_batch_size)))


def test_thread_groups_follow_parallelism_and_sizes_changed_at_run_time(
    handler: UpstreamStyleHandler,
    resnet_dir: Path,
    rows: list[dict[str, bytes]],
    plain: list[dict[str, float]],
) -> None:
    mb = handler.handle
    assert thread_counts(mb) == dict.fromkeys(STAGES, 1)
    mb.parallelism = {"preprocess": 1, "inference": 2, "postprocess": 3}
    assert thread_counts(mb) == {"preprocess": 1, "inference": 2, "postprocess": 3}
    mb.parallelism = {"preprocess": 2, "inference": 3, "postprocess": 4}
    grown = mb.thread_groups
    assert thread_counts(mb) == {"preprocess": 2, "inference": 3, "postprocess": 4}
    assert all(
        t.is_alive() and t.name.startswith(f"ts-microbatch-{stage}-")
        for stage, threads in grown.items()
        for t in threads
    )
    mb.micro_batch_size = 4
    assert_answers(mb(rows, mock_context(resnet_dir)), plain)
    assert handler.micro_batch_indices == {0, 1, 2, 3}

    # As upstream's setter: scaling down returns once the retired threads are gone.
    mb.parallelism = {"preprocess": 1, "inference": 2, "postprocess": 3}
    assert thread_counts(mb) == {"preprocess": 1, "inference": 2, "postprocess": 3}
    kept = {t for threads in mb.thread_groups.values() for t in threads}
    retired = [t for threads in grown.values() for t in threads if t not in kept]
    assert len(retired) == 3 and not any(t.is_alive() for t in retired)
    handler.micro_batch_indices.clear()
    mb.micro_batch_size = 5
    assert_answers(mb(rows, mock_context(resnet_dir)), plain)
    assert handler.micro_batch_indices == {0, 1, 2, 3}


def test_mock_context_bad_request_fails_alone(
    handler: UpstreamStyleHandler,
    resnet_dir: Path,
    rows: list[dict[str, bytes]],
    plain: list[dict[str, float]],
) -> None:
    handler.handle.micro_batch_size = 4
    batch = rows[:6]
    batch[2] = {"body": b"not a photo"}
    got = handler.handle(batch, mock_context(resnet_dir))
    # The bad row shared a micro-batch of 4 with good ones, which was re-run in halves.
    assert handler.preprocessed[:1] == [4] and len(handler.preprocessed) > 2
    assert got[2]["code"] == 400 and got[2]["type"] == "UnidentifiedImageError"
    assert_answers(got[:2] + got[3:], plain[:2] + plain[3:6])


def test_mock_context_broken_stage_answers_every_request(
    handler: UpstreamStyleHandler, resnet_dir: Path, rows: list[dict[str, bytes]]
) -> None:
    # Upstream's worker thread dies on a stage exception and handle() waits forever.
    calls: list[int] = []

    def broken(batch: Any) -> Any:
        calls.append(len(batch))
        raise RuntimeError("inference is broken")

    handler.inference = broken
    handler.handle.micro_batch_size = 3
    got = handler.handle(rows[:7], mock_context(resnet_dir))
    assert calls, "the broken stage was never called"
    assert [(a["code"], a["message"]) for a in got] == [(500, "inference is broken")] * 7
