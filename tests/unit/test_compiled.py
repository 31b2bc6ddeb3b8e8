"""CompiledInference: serialized calls, outputs off the model's memory, recompiles counted."""

from __future__ import annotations

import threading

import torch

from ts_microbatch import PipelineObserver
from ts_microbatch.compiled import CompiledInference, is_compiled


class Recompiles(PipelineObserver):
    def __init__(self) -> None:
        self.counts: list[int] = []

    def on_recompile(self, count: int) -> None:
        self.counts.append(count)


def test_hang_outputs_of_a_static_output_buffer_are_cloned() -> None:
    # Under CUDA graphs (mode="reduce-overhead") every replay writes its outputs to the
    # same memory: a postprocess thread reading micro-batch 1's outputs while micro-batch 2
    # replays would read micro-batch 2's. A model that reuses one buffer stands in for it.
    buffer = torch.zeros(2, 3)

    def replay(x: torch.Tensor) -> dict[str, torch.Tensor]:
        buffer.copy_(x)
        return {"logits": buffer[:2]}

    inference = CompiledInference(replay, PipelineObserver())
    first = inference(torch.ones(2, 3))
    second = inference(torch.full((2, 3), 2.0))
    assert first["logits"].tolist() == [[1.0] * 3] * 2
    assert second["logits"].tolist() == [[2.0] * 3] * 2


def test_compiles_in_warm_up_are_expected_and_on_the_request_path_reported() -> None:
    torch._dynamo.reset()
    model = torch.compile(torch.nn.Linear(4, 2), backend="eager", dynamic=False)
    assert is_compiled(model) and not is_compiled(torch.nn.Linear(4, 2))
    observer = Recompiles()
    inference = CompiledInference(model, observer)
    with torch.inference_mode():
        with inference.warming_up():
            inference(torch.ones(2, 4))
            inference(torch.ones(2, 4))
        assert (inference.compiles, inference.recompiles) == (1, 0)
        inference(torch.ones(2, 4))
        assert observer.counts == []
        inference(torch.ones(3, 4))  # a new size: dynamic=False recompiles
    assert (inference.compiles, inference.recompiles) == (2, 1) and observer.counts == [1]
    assert inference.compiled_on == {threading.current_thread().name}
    torch._dynamo.reset()


def test_without_warm_up_every_compile_is_on_the_request_path() -> None:
    torch._dynamo.reset()
    observer = Recompiles()
    inference = CompiledInference(torch.compile(torch.nn.Linear(4, 2), backend="eager"), observer)
    with torch.inference_mode():
        inference(torch.ones(2, 4))
    assert inference.recompiles == 1 and observer.counts == [1]
    torch._dynamo.reset()
