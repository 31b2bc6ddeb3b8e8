"""What the tail's hiccups coincide with: each episode of slow requests beside every
candidate cause, timestamped on one clock (issue 51, docs/metrics.md "The load
generator's own stalls").

    .venv/bin/python benchmarks/dev/hiccups.py [--rate 1200] [--seconds 130] \\
        [--rounds 2] [--spike-ms 100] [--out benchmarks/dev/results/hiccups]

The fraud scorer example (the fastest model here: a pause of 100 ms is most of a P99) is
served as shipped (``freeze_gc`` on) by a fresh TorchServe per round and variant, settled
(``ledger.settle_frontend``: open loop at ``--rate`` until the JVM's compilers go quiet),
then offered ``--rate`` req/s open loop for ``--seconds``. Variants, interleaved:
``shipped`` (TorchServe's defaults), ``no collector`` (``disable_system_metrics=true``: no
``metric_collector.py`` process each minute), and ``generator GC on``: shipped, measured
by a generator whose own collector runs (``openloop.collector_paused`` undone, as every
tool measured before it). Recorded on CLOCK_MONOTONIC:

* every request's due, sent and answered times (the generator's lateness among them);
* the JVM's safepoints, GC pauses among them (``-Xlog:safepoint``, ``timenanos``: the
  JVM's nanoTime is CLOCK_MONOTONIC);
* the worker's garbage collections of generation 2 or over 5 ms (gc_pauses.py's hook);
* every 50 ms, by a sampler process: the machine's busy, idle and stolen ticks
  (/proc/stat), the frontend's CPU and its JIT compilers', the worker's, and the frontend's
  other children (TorchServe's metric collector) alive and their CPU.

An episode is a run of requests slower than ``--spike-ms`` whose lifetimes chain within
50 ms. Each is listed with what overlapped it (from 100 ms before its first request was
due to its last answer), and every candidate's share of the run's time is printed beside,
so a coincidence can be told from chance.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from gc_pauses import HOOK, workload_mar  # noqa: E402

from ts_microbatch.tools import openloop  # noqa: E402
from ts_microbatch.tools.cpu import server_pids  # noqa: E402
from ts_microbatch.tools.intervals import percentile, percentile_interval  # noqa: E402
from ts_microbatch.tools.ledger import settle_frontend  # noqa: E402
from ts_microbatch.tools.openloop import run_open_loop  # noqa: E402
from ts_microbatch.tools.server import TorchServe  # noqa: E402

# name: (the server's extra properties, the generator's own collector left on as before)
VARIANTS: dict[str, tuple[dict[str, str], bool]] = {
    "generator GC on": ({}, True),
    "shipped": ({}, False),
    "no collector": ({"disable_system_metrics": "true"}, False),
}
PAUSED = openloop.collector_paused
SAMPLE_S = 0.05
BEFORE_S = 0.1  # a cause may start before the first slow request was due
CHAIN_S = 0.05
PAUSE_MS = 10.0  # a JVM safepoint or worker collection this long counts as a candidate
LATE_MS = 10.0  # a send this late: the generator itself stalled

# The sampler: its own process, so that reading /proc never takes the generator's GIL.
SAMPLER = r"""
import json, os, sys, time
frontend, worker, out, stop = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
JIT = ("C1 CompilerThre", "C2 CompilerThre")
def ticks(path):
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime
    except (OSError, IndexError, ValueError):
        return None
def ppid_and_cmd(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return ppid, f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, IndexError, ValueError):
        return None, ""
seen, children, jit_tids, last_scan = set(), {}, [], 0.0
with open(out, "w") as sink:
    while not os.path.exists(stop):
        now = time.monotonic()
        if now - last_scan > 1.0:  # compiler threads come and go (dynamic count)
            last_scan = now
            jit_tids = []
            for tid in os.listdir(f"/proc/{frontend}/task"):
                try:
                    with open(f"/proc/{frontend}/task/{tid}/comm") as f:
                        if f.read().strip().startswith(JIT):
                            jit_tids.append(tid)
                except OSError:
                    pass
        for name in os.listdir("/proc"):
            if name.isdigit() and name not in seen:
                seen.add(name)
                ppid, cmd = ppid_and_cmd(name)
                if ppid == frontend and int(name) != worker:
                    children[name] = cmd
        with open("/proc/stat") as f:
            cpu = [int(v) for v in f.readline().split()[1:]]
        alive = {p: ticks(f"/proc/{p}/stat") for p in children}
        sink.write(json.dumps({
            "t": now,
            "busy": sum(cpu[:3]) + sum(cpu[5:7]), "idle": cpu[3] + cpu[4], "steal": cpu[7],
            "frontend": ticks(f"/proc/{frontend}/stat"),
            "jit": sum(ticks(f"/proc/{frontend}/task/{t}/stat") or 0 for t in jit_tids),
            "worker": ticks(f"/proc/{worker}/stat"),
            "children": {p: [children[p][:80], v] for p, v in alive.items() if v is not None},
        }) + "\n")
        time.sleep(max(0.0, now + SAMPLE_S - time.monotonic()))
""".replace("SAMPLE_S", repr(SAMPLE_S))

GENERATOR_GCS: list[dict[str, Any]] = []  # this process's own, as the worker's hook keeps them
_gc_started = [0.0]


def _generator_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_started[0] = time.monotonic()
        return
    ms = 1000 * (time.monotonic() - _gc_started[0])
    if info["generation"] == 2 or ms > 5:
        GENERATOR_GCS.append({"start": _gc_started[0], "ms": ms, "generation": info["generation"]})


SAFEPOINT = re.compile(r"\[(\d+)ns\].*Safepoint \"([^\"]+)\".*Total: (\d+) ns")


def run_variant(work: Path, name: str, bodies: list[bytes], args: Any, run: str) -> dict[str, Any]:
    """A fresh server: settled, then ``args.seconds`` of open loop, every source recorded."""
    properties, generator_gc = VARIANTS[name]
    openloop.collector_paused = contextlib.nullcontext if generator_gc else PAUSED
    server_dir = work / "servers" / run
    server_dir.mkdir(parents=True)
    hook = work / "hook"
    jvm_log = server_dir / "safepoints.log"
    props = {**properties, "vmargs": f"-Xlog:safepoint:file={jvm_log}:timenanos"}
    env = {"PYTHONPATH": str(hook), "GC_PAUSES_LOG": str(server_dir / "gc.jsonl")}
    with TorchServe(work / "store", server_dir, token_auth=False, properties=props, env=env) as ts:
        registered = ts.register(
            "fraud.mar", batch_size=32, max_batch_delay_ms=1, model_name="fraud"
        )
        if registered.status != 200:
            raise SystemExit(f"{name}: not registered: {registered.body[:300]!r}")
        url = f"{ts.inference_url}/predictions/fraud"
        headers = {"Content-Type": "application/json"}
        frontend, workers = server_pids(ts)
        if frontend is None or len(workers) != 1:
            raise SystemExit(f"{name}: expected a frontend and one worker, got {workers}")
        settled = settle_frontend(
            lambda: run_open_loop(url, bodies, args.rate, int(args.rate), headers=headers),
            frontend,
            90.0,
        )
        stop = server_dir / "stop"
        sampler = subprocess.Popen(
            [
                sys.executable,
                "-c",
                SAMPLER,
                str(frontend),
                str(workers[0]),
                str(server_dir / "samples.jsonl"),
                str(stop),
            ]
        )
        try:
            time.sleep(0.5)
            GENERATOR_GCS.clear()
            count = int(args.rate * args.seconds)
            result = run_open_loop(url, bodies, args.rate, count, seed=7, headers=headers)
            started = result.started_at
            # not the collections collector_paused makes before the run, or any after it
            ended = started + result.elapsed_s
            GENERATOR_GCS[:] = [p for p in GENERATOR_GCS if started <= p["start"] <= ended]
            time.sleep(0.5)
        finally:
            stop.touch()
            sampler.wait(10)
    samples = [
        json.loads(line) for line in (server_dir / "samples.jsonl").read_text().split("\n") if line
    ]
    pauses = []
    for path in server_dir.glob("gc.jsonl.*"):
        pauses += [json.loads(line) for line in path.read_text().splitlines()]
    safepoints = []
    for line in jvm_log.read_text().splitlines() if jvm_log.exists() else []:
        found = SAFEPOINT.search(line)
        if found:
            end, total = int(found[1]) / 1e9, int(found[3]) / 1e9
            safepoints.append({"start": end - total, "ms": 1000 * total, "what": found[2]})
    return {
        "variant": name,
        "run": run,
        "started": started,
        "result": result,
        "samples": samples,
        "pauses": pauses,
        "generator_gcs": list(GENERATOR_GCS),
        "safepoints": safepoints,
        "settled": settled,
    }


def episodes(run: dict[str, Any], spike_ms: float) -> list[dict[str, Any]]:
    """The slow requests, grouped into episodes on the run's clock (absolute seconds)."""
    t0 = run["started"]
    slow = sorted(
        (t0 + s.due_s, t0 + (s.done_s if s.done_s is not None else s.due_s + 60))
        for s in run["result"].sends
        if s.latency_s is None or s.latency_s * 1000 >= spike_ms
    )
    found: list[dict[str, Any]] = []
    for due, done in slow:
        if found and due <= found[-1]["end"] + CHAIN_S:
            found[-1]["end"] = max(found[-1]["end"], done)
            found[-1]["requests"] += 1
            found[-1]["max_ms"] = max(found[-1]["max_ms"], 1000 * (done - due))
        else:
            found.append({"start": due, "end": done, "requests": 1, "max_ms": 1000 * (done - due)})
    return found


def window_causes(run: dict[str, Any], begin: float, end: float) -> dict[str, Any]:
    """Every candidate in [begin, end]: pauses, late sends, and the sampled cores."""
    t0 = run["started"]
    sp = [
        p
        for p in run["safepoints"]
        if p["ms"] >= PAUSE_MS and p["start"] <= end and p["start"] + p["ms"] / 1000 >= begin
    ]
    gc = [
        p
        for p in run["pauses"]
        if p["ms"] >= PAUSE_MS and p["start"] <= end and p["start"] + p["ms"] / 1000 >= begin
    ]
    own = [
        p
        for p in run["generator_gcs"]
        if p["ms"] >= PAUSE_MS and p["start"] <= end and p["start"] + p["ms"] / 1000 >= begin
    ]
    late = [1000 * s.late_s for s in run["result"].sends if begin <= t0 + s.due_s <= end]
    inside = [s for s in run["samples"] if begin - SAMPLE_S <= s["t"] <= end + SAMPLE_S]
    cores: dict[str, float] = {}
    collector = False
    if len(inside) >= 2:
        a, b = inside[0], inside[-1]
        span = 100 * (b["t"] - a["t"])  # ticks of 10 ms in the span
        for part in ("busy", "steal", "frontend", "jit", "worker"):
            if a[part] is not None and b[part] is not None:
                cores[part] = (b[part] - a[part]) / span
        kids = [p for s in inside for p in s["children"]]
        collector = any(
            "metric_collector" in s["children"][p][0] for s in inside for p in s["children"]
        )
        cores["children"] = (
            sum(max(s["children"][p][1] for s in inside if p in s["children"]) for p in set(kids))
            / span
            if kids
            else 0.0
        )
    return {
        "jvm_pause_ms": round(max((p["ms"] for p in sp), default=0.0), 1),
        "jvm_pause_what": sorted({p["what"] for p in sp}),
        "worker_gc_ms": round(max((p["ms"] for p in gc), default=0.0), 1),
        "generator_gc_ms": round(max((p["ms"] for p in own), default=0.0), 1),
        "late_ms": round(max(late, default=0.0), 1),
        "collector": collector,
        "cores": {k: round(v, 2) for k, v in cores.items()},
    }


def base_rates(run: dict[str, Any]) -> dict[str, float]:
    """Each candidate's share of the run's 50 ms sample intervals (chance coincidence)."""
    t0, samples = run["started"], run["samples"]
    end = t0 + run["result"].elapsed_s
    pairs = [(a, b) for a, b in zip(samples, samples[1:]) if t0 <= a["t"] <= end]
    if not pairs:
        return {}

    def share(test: Any) -> float:
        return round(sum(1 for a, b in pairs if test(a, b)) / len(pairs), 3)

    def cores(a: dict[str, Any], b: dict[str, Any], part: str) -> float:
        return (b[part] - a[part]) / (100 * (b["t"] - a["t"]))

    def paused(items: list[dict[str, Any]]) -> Any:
        long = [p for p in items if p["ms"] >= PAUSE_MS]
        return lambda a, b: any(
            p["start"] <= b["t"] and p["start"] + p["ms"] / 1000 >= a["t"] for p in long
        )

    collector = lambda a, b: any("metric_collector" in c[0] for c in b["children"].values())  # noqa: E731
    return {
        "collector alive": share(collector),
        "JVM pause >= 10 ms": share(paused(run["safepoints"])),
        "worker GC >= 10 ms": share(paused(run["pauses"])),
        "generator GC >= 10 ms": share(paused(run["generator_gcs"])),
        "steal >= 0.2 cores": share(lambda a, b: cores(a, b, "steal") >= 0.2),
        "JIT >= 0.3 cores": share(lambda a, b: cores(a, b, "jit") >= 0.3),
        "machine busy >= 1.9 cores": share(
            lambda a, b: cores(a, b, "busy") + cores(a, b, "steal") >= 1.9
        ),
    }


def summarize(run: dict[str, Any], spike_ms: float) -> dict[str, Any]:
    result = run["result"]
    latencies = result.latencies_ms()
    found = episodes(run, spike_ms)
    for ep in found:
        ep.update(window_causes(run, ep["start"] - BEFORE_S, ep["end"]))
        ep["at_s"] = round(ep.pop("start") - run["started"], 2)
        ep["ms"] = round(1000 * (ep.pop("end") - run["started"]) - 1000 * ep["at_s"])
        ep["max_ms"] = round(ep["max_ms"], 1)
    p99 = percentile_interval(latencies, 99)
    collector_runs = {
        p for s in run["samples"] for p, c in s["children"].items() if "metric_collector" in c[0]
    }
    return {
        "variant": run["variant"],
        "run": run["run"],
        "requests": len(latencies),
        "errors": dict(result.errors),
        "p50_ms": round(percentile(latencies, 50), 1),
        "p99_ms": round(p99.value, 1),
        "p99_interval": [round(p99.low, 1), round(p99.high, 1)],
        "p999_ms": round(percentile(latencies, 99.9), 1),
        "max_ms": round(max(latencies), 1),
        "settled": run["settled"],
        "collector_runs": len(collector_runs),
        "jvm_pauses_over_10ms": sum(1 for p in run["safepoints"] if p["ms"] >= PAUSE_MS),
        "longest_jvm_pause_ms": round(max((p["ms"] for p in run["safepoints"]), default=0.0), 1),
        "worker_gcs_over_10ms": sum(1 for p in run["pauses"] if p["ms"] >= PAUSE_MS),
        "generator_gcs_over_10ms": sum(1 for p in run["generator_gcs"] if p["ms"] >= PAUSE_MS),
        "longest_generator_gc_ms": round(
            max((p["ms"] for p in run["generator_gcs"]), default=0.0), 1
        ),
        "generator_max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "base_rates": base_rates(run),
        "episodes": found,
    }


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"# The tail's hiccups and what they coincide with: the fraud scorer at {args.rate:g} "
        f"req/s open loop, {args.seconds:g} s a run, {args.rounds} rounds\n",
        f"Episodes: requests over {args.spike_ms:g} ms, chained within {1000 * CHAIN_S:g} ms; "
        f"causes looked for from {1000 * BEFORE_S:g} ms before.\n",
        "| run | variant | requests | P50 | P99 [95%] | P99.9 | max | lost | collector runs | "
        "JVM pauses >= 10 ms (longest) | worker GCs >= 10 ms | "
        "generator GCs >= 10 ms (longest) | episodes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['variant']} | {r['requests']} | {r['p50_ms']} | {r['p99_ms']} "
            f"{r['p99_interval']} | {r['p999_ms']} | {r['max_ms']} | {sum(r['errors'].values())} | "
            f"{r['collector_runs']} | {r['jvm_pauses_over_10ms']} "
            f"({r['longest_jvm_pause_ms']} ms) | {r['worker_gcs_over_10ms']} | "
            f"{r['generator_gcs_over_10ms']} ({r['longest_generator_gc_ms']} ms) | "
            f"{len(r['episodes'])} |"
        )
    lines.append("\nEach candidate's share of a run's 50 ms intervals (chance):\n")
    for r in rows:
        lines.append(
            f"- {r['run']}: " + ", ".join(f"{k} {v:.1%}" for k, v in r["base_rates"].items())
        )
    lines += [
        "\n## Episodes\n",
        "| run | at s | ms | requests | max ms | collector | JVM pause ms | worker GC ms | "
        "generator GC ms | late send ms | cores: busy, steal, frontend, JIT, worker, children |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for ep in r["episodes"]:
            c = ep["cores"]
            shown = ", ".join(
                f"{c.get(k, float('nan')):.2f}"
                for k in ("busy", "steal", "frontend", "jit", "worker", "children")
            )
            what = f" {'/'.join(ep['jvm_pause_what'])}" if ep["jvm_pause_what"] else ""
            lines.append(
                f"| {r['run']} | {ep['at_s']} | {ep['ms']} | {ep['requests']} | {ep['max_ms']} | "
                f"{'yes' if ep['collector'] else ''} | {ep['jvm_pause_ms'] or ''}{what} | "
                f"{ep['worker_gc_ms'] or ''} | {ep['generator_gc_ms'] or ''} | "
                f"{ep['late_ms']} | {shown} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1200.0)
    parser.add_argument("--seconds", type=float, default=130.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--spike-ms", type=float, default=100.0)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/dev/results/hiccups")
    args = parser.parse_args()
    if unknown := set(args.variants.split(",")) - set(VARIANTS):
        parser.error(f"--variants: unknown {sorted(unknown)}; choose from {list(VARIANTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="hiccups-"))
    gc.callbacks.append(_generator_gc)
    try:
        (work / "hook").mkdir()
        (work / "hook" / "sitecustomize.py").write_text(HOOK)
        mar, bodies = workload_mar("tabular", work / "build")
        (work / "store").mkdir()
        shutil.copy(mar, work / "store" / "fraud.mar")
        rows = []
        for index in range(args.rounds):
            for name in args.variants.split(","):
                run = f"{name.replace(' ', '-')}-{index + 1}"
                row = summarize(run_variant(work, name, bodies, args, run), args.spike_ms)
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "episodes"}), flush=True)
                (args.out / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
        (args.out / "report.md").write_text(report(rows, args))
        print(report(rows, args))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
