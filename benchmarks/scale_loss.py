"""What scaling a model's workers 1 -> 4 -> 1 under load loses, measured over rounds.

Each round sends 24 requests at once while the worker count changes (up to 4, then
down to 1) and counts the requests that got no answer within the client timeout.
TorchServe 0.12 stops a removed worker without finishing its batch (pytorch/serve#1101).

    python benchmarks/scale_loss.py --rounds 10 --out benchmarks/results/scale_loss
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "examples" / "image_classifier"))

import bench_lib  # noqa: E402
import build_mar  # noqa: E402
import prepare  # noqa: E402

from ts_microbatch.tools.server import TorchServe  # noqa: E402

NAME = "resnet-scale"


def burst(server: TorchServe, bodies: list[bytes], timeout_s: float) -> list[int]:
    barrier = threading.Barrier(len(bodies))

    def send(body: bytes) -> int:
        barrier.wait(timeout=60)
        try:
            return server.predict(NAME, body, timeout_s=timeout_s).status
        except OSError:
            return -1  # no answer within the client timeout, or the connection dropped

    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return list(pool.map(send, bodies))


def scale_during_burst(
    server: TorchServe, workers: int, bodies: list[bytes], timeout_s: float
) -> list[int]:
    statuses: list[int] = []
    load = threading.Thread(target=lambda: statuses.extend(burst(server, bodies, timeout_s)))
    load.start()
    query = f"min_worker={workers}&max_worker={workers}&synchronous=true"
    resp = server.request("PUT", f"{server.management_url}/models/{NAME}?{query}", timeout_s=180)
    if resp.status != 200:
        raise RuntimeError(f"scaling to {workers} failed: {resp.status} {resp.body!r}")
    load.join()
    return statuses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--client-timeout-s", type=float, default=30.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    work = bench_lib.scratch_dir("scale_loss_")
    build_mar.build_mar(work / "store", model_name="resnet-18_mb", work_dir=work / "build")
    bodies = [prepare.make_jpeg(200 + i, size=(320, 240)) for i in range(24)]
    rounds = []
    with bench_lib.project_server(work / "store", work / "server") as server:
        resp = server.register(
            "resnet-18_mb.mar", model_name=NAME, batch_size=args.batch_size, max_batch_delay_ms=20
        )
        if resp.status != 200:
            raise RuntimeError(f"register failed: {resp.status} {resp.body!r}")
        for i in range(args.rounds):
            up = scale_during_burst(server, 4, bodies, args.client_timeout_s)
            down = scale_during_burst(server, 1, bodies, args.client_timeout_s)
            rounds.append({"up_lost": 24 - up.count(200), "down_lost": 24 - down.count(200)})
            print(
                f"round {i + 1}: 1->4 lost {rounds[-1]['up_lost']}/24, "
                f"4->1 lost {rounds[-1]['down_lost']}/24",
                flush=True,
            )
    summary = {
        "rounds": rounds,
        "requests_per_phase": 24,
        "batch_size": args.batch_size,
        "up_lost_total": sum(r["up_lost"] for r in rounds),
        "down_lost_total": sum(r["down_lost"] for r in rounds),
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "rounds"}))
    bench_lib.save_json(args.out, "summary.json", summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
