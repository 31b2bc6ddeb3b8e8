"""The frontend's CPU a request over time on a fresh server, and its JIT compilers' share.

    .venv/bin/python benchmarks/dev/jit_settle.py [--rate 1000] [--windows 9]

Serves the fraud scorer (as ``lean_frontend.py`` builds it, config.properties as shipped),
sends open-loop Poisson load at ``--rate`` in windows of 10 s, and prints per window the
Java process's CPU a request split by thread: the JIT compilers (``C1``/``C2
CompilerThread``), the collector, netty's event loops, TorchServe's worker threads (``W-``)
and the rest. A fresh JVM compiles its hot paths for a minute or more under load: what a
benchmark measures in its first minute is partly the compiler (ts_microbatch.tools.ledger's
``settle_frontend``). Results: ``results/jit_settle/``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE.parent), str(ROOT), str(HERE)]

import lean_frontend  # noqa: E402

from ts_microbatch.tools.cpu import frontend_pid, thread_cpu  # noqa: E402
from ts_microbatch.tools.ledger import JIT_THREADS  # noqa: E402
from ts_microbatch.tools.openloop import run_open_loop  # noqa: E402
from ts_microbatch.tools.server import TorchServe  # noqa: E402

GROUPS = ("jit", "gc", "netty", "W- threads", "other")
WINDOW_S = 10


def group(name: str) -> str:
    if name.startswith(JIT_THREADS):  # the ledger's rule: /proc's 15-character names
        return "jit"
    if "GC" in name or name.startswith("G1"):
        return "gc"
    if name.startswith("epollEventLoop"):
        return "netty"
    return "W- threads" if name.startswith("W-") else "other"


def by_group(pid: int) -> dict[str, float]:
    used = dict.fromkeys(GROUPS, 0.0)
    for name, (seconds, _) in thread_cpu(pid).items():
        used[group(name)] += seconds
    return used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="requests a second")
    parser.add_argument("--windows", type=int, default=9, help=f"of {WINDOW_S} s each")
    parser.add_argument("--work", type=Path, default=Path("build/jit_settle"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    store, registered, body, content_type, frontend = lean_frontend.model("tabular", args.work)
    config = lean_frontend.base_config(args.work, "shipped")
    with TorchServe(model_store=store, workdir=args.work / "server", base_config=config) as ts:
        frontend.pop("model_name", None)
        resp = ts.register(registered, model_name="fraud", **frontend)
        if resp.status != 200:
            raise SystemExit(f"registering failed: {resp.status} {resp.body!r}")
        url = f"{ts.inference_url}/predictions/fraud"
        headers = {"Content-Type": content_type, "Authorization": f"Bearer {ts.token('inference')}"}
        pid, data = frontend_pid(ts), body.read_bytes()
        print(f"{args.rate:g} req/s open loop, windows of {WINDOW_S} s, frontend CPU ms a request")
        print("| window | answered | errors | frontend | " + " | ".join(GROUPS) + " |")
        print("|---" * (4 + len(GROUPS)) + "|")
        for window in range(args.windows):
            before = by_group(pid)
            count = int(args.rate * WINDOW_S)
            done = run_open_loop(url, [data], args.rate, count, headers=headers, seed=window)
            after = by_group(pid)
            per = {g: 1000 * (after[g] - before[g]) / len(done.sends) for g in GROUPS}
            print(
                f"| {window * WINDOW_S}-{(window + 1) * WINDOW_S} s | {len(done.sends)} | "
                f"{sum(done.errors.values())} | {sum(per.values()):.3f} | "
                + " | ".join(f"{per[g]:.3f}" for g in GROUPS)
                + " |",
                flush=True,
            )


if __name__ == "__main__":
    main()
