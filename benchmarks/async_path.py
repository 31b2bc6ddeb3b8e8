#!/usr/bin/env python3
"""CPU per request of TorchServe 0.12's asynchronous worker, in-process: where it goes.

    python benchmarks/async_path.py [--requests 4000] [--in-flight 32] [--rounds 3] \\
        --out benchmarks/results/async_path

A fake frontend on a socket pair streams predict messages, in TorchServe's own wire format,
to the worker's ``AsyncService`` running as the worker runs it (its receiving, batching and
sending threads and its event loop), with a handler whose stages cost next to nothing, so
what is measured is the path and not a model. It keeps ``--in-flight`` requests outstanding
and reads every response. For each predict (TorchServe's own, ``lean_predict``) and each
thread it reports CPU ms per request (from ``/proc/self/task``), rounds interleaved. What
the frontend spends is measured on a real server (``benchmarks/latency_load.py``'s CPU
columns).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

from ts import async_service  # noqa: E402
from ts.async_service import AsyncService  # noqa: E402

from tests.torchserve.ts_machinery import (  # noqa: E402
    ResponseReader,
    load_service,
    predict_message,
    write_manifest,
)
from ts_microbatch.torchserve._async import lean_predict  # noqa: E402

HANDLER = """
from ts.torch_handler.base_handler import BaseHandler

from ts_microbatch import MicroBatchingMixin


class Echo(MicroBatchingMixin, BaseHandler):
    def initialize(self, context):
        self.context = context
        self.initialized = True
        self.start_micro_batching(context)

    def preprocess(self, data):
        return [len(row.get("body") or b"") for row in data]

    def inference(self, data, *args, **kwargs):
        return data

    def postprocess(self, data):
        return [{"n": n} for n in data]
"""
CONFIG = """asyncCommunication: true
batchSize: 1
micro_batching:
  micro_batch_size: 4
  parallelism: {preprocess: 1, inference: 1, postprocess: 1}
"""
CLK_TCK = os.sysconf("SC_CLK_TCK")
ORIGINAL_PREDICT = async_service.predict
PREDICTS = {"torchserve": ORIGINAL_PREDICT, "lean": lean_predict}


def thread_cpu_s() -> dict[int, float]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def thread_names() -> dict[int, str]:
    names = {}
    for thread in threading.enumerate():
        target = getattr(thread, "_target", None)
        inner = getattr(target, "args", (None,))[0] if target is not None else None
        name = getattr(inner, "__name__", None) or thread.name
        if thread.native_id is not None:
            names[thread.native_id] = name
    return names


def group(name: str) -> str:
    if name.startswith("ts-microbatch-metrics"):
        return "metrics"
    if name.startswith("ts-microbatch-"):
        return "stages"
    return name


def run(predict: str, requests: int, in_flight: int, work: Path) -> dict[str, Any]:
    directory = work / predict
    directory.mkdir(parents=True)
    (directory / "echo.py").write_text(HANDLER)
    (directory / "model-config.yaml").write_text(CONFIG)
    write_manifest(directory, "echo", "echo.py", configFile="model-config.yaml")
    service = load_service(directory, model_name="echo", handler="echo.py", batch_size=1)
    async_service.predict = PREDICTS[predict]  # bound by AsyncService, as in the worker
    frontend, worker = socket.socketpair()
    service.set_cl_socket(worker)
    worker_service = AsyncService(service)

    def serve() -> None:  # the worker runs it on its main thread, which has an event loop
        asyncio.set_event_loop(asyncio.new_event_loop())
        worker_service.run()

    loop_thread = threading.Thread(target=serve, name="event_loop", daemon=True)
    loop_thread.start()
    reader = ResponseReader(frontend)
    body = b"x" * 64
    for i in range(in_flight):  # warm-up: every stage has run, the threads exist
        frontend.sendall(predict_message(i, body))
    for _ in range(in_flight):
        reader.response()
    names = thread_names()
    before, wall = thread_cpu_s(), time.perf_counter()
    sent = answered = 0
    while answered < requests:
        while sent < requests and sent - answered < in_flight:
            frontend.sendall(predict_message(sent, body))
            sent += 1
        answered += reader.response()
    elapsed = time.perf_counter() - wall
    after = thread_cpu_s()
    per_thread: dict[str, float] = {}
    for tid, cpu in after.items():
        name = group(names.get(tid, "other"))
        if name == "MainThread":
            name = "fake frontend (this process's main thread)"
        per_thread[name] = per_thread.get(name, 0.0) + cpu - before.get(tid, 0.0)
    frontend.close()
    service._entry_point.__self__.micro_batching.shutdown(wait=False)
    return {
        "predict": predict,
        "requests_per_s": round(requests / elapsed, 1),
        "cpu_ms_per_request": {
            k: round(1000 * v / requests, 4) for k, v in sorted(per_thread.items())
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tsmb-async-path-") as tmp:
        for round_no in range(args.rounds):
            for predict in PREDICTS if round_no % 2 == 0 else reversed(PREDICTS):
                row = run(predict, args.requests, args.in_flight, Path(tmp) / f"{round_no}")
                row["round"] = round_no + 1
                rows.append(row)
                print(json.dumps(row), flush=True)
    async_service.predict = ORIGINAL_PREDICT
    (args.out / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
