#!/usr/bin/env python3
"""What each of TorchServe's frontend settings costs a request: the lean frontend study.

    python benchmarks/dev/lean_frontend.py [--rounds 3] [--requests 20000] [--out DIR]
        [--variants shipped,access-log-off,...] [--workload tabular|image]
        [--photo 720px|12mp] [--gc-log]

The fraud scorer (examples/tabular_scorer, built from the checkout; one of its corpus's
bodies) or the image example on the compute stand-in (a 720px or a 12 MP photo), closed
loop with ``ab -k`` at 64 clients (32 for 12 MP photos), a fresh TorchServe per variant
and round (interleaved, shuffled from round to round), warmed up with 3,000 requests (half
the measured ones when fewer). Each variant changes one frontend setting from the
project's configs/config.properties (``shipped``); ``lean`` changes all of those in LEAN
at once; ``workers-2`` (the fraud scorer only) serves its .mar with two workers, and
``lean-workers-2`` both. Each run prints its throughput, P99, the frontend's CPU per
request, the CPU ledger (ts_microbatch.tools.ledger) and with ``--gc-log`` the JVM's
pauses during the measured run; the report gives each variant's medians and its ratios to
``shipped`` within each round.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE.parent), str(ROOT)]

import bench_lib  # noqa: E402
import compare  # noqa: E402
import tabular_workload  # noqa: E402

from ts_microbatch.tools.cpu import frontend_pid  # noqa: E402
from ts_microbatch.tools.ledger import MAIN_PARTS, format_ledger  # noqa: E402
from ts_microbatch.tools.ledger import summary as ledger_summary  # noqa: E402
from ts_microbatch.tools.mar import override_mar  # noqa: E402
from ts_microbatch.tools.runs import round_order  # noqa: E402
from ts_microbatch.tools.server import TorchServe  # noqa: E402

# TorchServe 0.12.0's log4j2.xml logs every request's access line (ACCESS_LOG at info) and
# org.pytorch.serve at debug (per-batch lines); this one keeps its files and levels but for
# the two loggers the variants change.
LINE, BARE = "%d{ISO8601} [%-5p] %t %c - %m%n", "%d{ISO8601} - %m%n"
FILES = {  # appender -> (its file, where, its pattern)
    "access_log": ("access_log", "LOG_LOCATION", BARE),
    "model_log": ("model_log", "LOG_LOCATION", LINE),
    "ts_log": ("ts_log", "LOG_LOCATION", LINE),
    "metrics": ("ts_metrics", "METRICS_LOCATION", BARE),
}
LOGGERS = (  # logger, level ("{access}"/"{ts}": the variant's), appender
    ("ACCESS_LOG", "{access}", "access_log"),
    ("MODEL_LOG", "all", "model_log"),
    ("MODEL_METRICS", "all", "metrics"),
    ("TS_METRICS", "all", "metrics"),
    ("org.pytorch.serve", "{ts}", "ts_log"),
)


def log4j2(access: str, ts: str) -> str:
    """The log4j2.xml of FILES and LOGGERS at those two levels."""
    appenders = "".join(
        f'<RollingFile name="{name}" fileName="${{env:{where}:-logs}}/{file}.log" '
        f'filePattern="${{env:{where}:-logs}}/{file}.%d{{dd-MMM}}.log.gz">'
        f'<PatternLayout pattern="{pattern}"/>'
        '<Policies><SizeBasedTriggeringPolicy size="100 MB"/></Policies></RollingFile>\n'
        for name, (file, where, pattern) in FILES.items()
    )
    loggers = "".join(
        f'<Logger name="{name}" level="{level.format(access=access, ts=ts)}">'
        f'<AppenderRef ref="{ref}"/></Logger>\n'
        for name, level, ref in LOGGERS
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Configuration><Appenders>\n'
        f'{appenders}<Console name="STDOUT" target="SYSTEM_OUT">'
        f'<PatternLayout pattern="{LINE}"/></Console></Appenders><Loggers>\n{loggers}'
        '<Logger name="io.netty" level="error"/><Logger name="org.apache" level="off"/>'
        '<Root level="info"><AppenderRef ref="STDOUT"/></Root></Loggers></Configuration>\n'
    )


# name -> config.properties lines over the shipped ones; "log4j2": the two levels
VARIANTS: dict[str, dict[str, str]] = {
    "shipped": {},
    "log4j2-as-shipped": {"log4j2": "info,debug"},  # the file itself, at TorchServe's levels
    "access-log-off": {"log4j2": "off,debug"},
    "ts-log-info": {"log4j2": "info,info"},
    "async-logging": {"async_logging": "true"},
    "no-system-metrics": {"disable_system_metrics": "true"},
    "parallel-gc": {"vmargs": "-XX:+UseParallelGC"},
    "netty-1": {"number_of_netty_threads": "1", "netty_client_threads": "1"},
    # not a frontend setting: the same .mar with minWorkers/maxWorkers 2, two workers
    "workers-2": {"workers": "2"},
}
# The ones that cut the fraud scorer's frontend CPU a request in a first run of 3 rounds
# (benchmarks/dev/results/lean_frontend/README.md); the logging variants did not.
LEAN = ("parallel-gc", "netty-1", "no-system-metrics")
# LEAN's settings with two workers: the frontend's CPU cut once the worker's idle is gone
VARIANTS["lean-workers-2"] = {
    **{k: v for part in LEAN for k, v in VARIANTS[part].items()},
    "workers": "2",
}
CLIENTS = 64


def properties(name: str, work: Path) -> dict[str, str]:
    """The config.properties lines of variant ``name`` (``lean``: LEAN's together)."""
    wanted: dict[str, str] = {}
    for part in LEAN if name == "lean" else (name,):
        wanted.update(VARIANTS[part])
    wanted.pop("workers", None)  # the model's, not the config's (``model``)
    levels = wanted.pop("log4j2", None)
    if levels:
        access, ts = levels.split(",")
        path = work / f"log4j2-{access}-{ts}.xml"
        path.write_text(log4j2(access, ts))
        vmargs = f"-Dlog4j.configurationFile=file://{path}"
        wanted["vmargs"] = " ".join(filter(None, [wanted.get("vmargs"), vmargs]))
    return wanted


def base_config(work: Path, name: str, gc_log: Path | None = None) -> Path:
    """configs/config.properties with the variant's lines, beside a copy of metrics.yaml;
    with ``gc_log``, the JVM logs each collection's pause there."""
    folder = work / f"config-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "configs/metrics.yaml", folder / "metrics.yaml")
    wanted = properties(name, work)
    if gc_log is not None:
        logging = f"-Xlog:gc:file={gc_log}"
        wanted["vmargs"] = " ".join(filter(None, [wanted.get("vmargs"), logging]))
    lines = [
        line
        for line in (ROOT / "configs/config.properties").read_text().splitlines()
        if line.split("=", 1)[0] not in wanted
    ]
    lines += [f"{key}={value}" for key, value in wanted.items()]
    path = folder / "config.properties"
    path.write_text("\n".join(lines) + "\n")
    return path


def model(
    workload: str, work: Path, photo: str = "720px"
) -> tuple[Path, str, Path, str, dict[str, Any]]:
    """The store, the model to register, its body and content type, its frontend batching."""
    if workload == "tabular":
        sources, corpus = tabular_workload.tabular_models({"head-example"}, work)
        mar = sources["head-example"]
        body = work / "body.json"
        body.write_bytes(corpus.bodies[0].data)
        frontend = {"batch_size": 32, "max_batch_delay_ms": 1, "model_name": "fraud"}
        override_mar(mar, mar.parent / "two-workers.mar", None, {"minWorkers": 2, "maxWorkers": 2})
        return mar.parent, mar.name, body, "application/json", frontend
    sides = {"head": compare.checkout("head", compare.WORKTREE, work / "head")}
    compare.write_bodies(work, [photo])
    compare.package(work / "store", work / "build", "head-example", "compute", sides)
    path, content_type = compare.bodies()[photo]
    return work / "store", "head-example-compute", path, content_type, {"max_batch_delay_ms": 2}


PAUSE = re.compile(r"^\[([\d.]+)s\].*GC\(\d+\) Pause .* ([\d.]+)ms$")


def pauses(gc_log: Path, after_s: float) -> dict[str, float]:
    """The JVM's stop-the-world pauses logged after ``after_s`` (its uptime): count, total
    and longest, ms."""
    found = []
    for line in gc_log.read_text().splitlines() if gc_log.exists() else ():
        match = PAUSE.match(line)
        if match and float(match.group(1)) >= after_s:
            found.append(float(match.group(2)))
    return {
        "pauses": len(found),
        "pause_total_ms": sum(found),
        "pause_max_ms": max(found, default=0.0),
    }


def uptime_s(pid: int) -> float:
    """Seconds since process ``pid`` started (the JVM's log clock)."""
    start_ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot_s = float(Path("/proc/uptime").read_text().split()[0])
    return boot_s - start_ticks / os.sysconf("SC_CLK_TCK")


def one_run(
    work: Path,
    name: str,
    round_no: int,
    served: tuple[Path, str, Path, str, dict[str, Any]],
    requests: int,
    gc_log: bool,
) -> dict[str, Any]:
    store, registered, body, content_type, frontend = served
    workers = int(VARIANTS.get(name, {}).get("workers", 1))
    if workers > 1:  # TorchServe caps initial_workers at the .mar's maxWorkers
        registered, frontend = "two-workers.mar", {**frontend, "initial_workers": workers}
    log_path = work / f"gc-{name}-{round_no}.log" if gc_log else None
    config = base_config(work, name, log_path)
    with TorchServe(
        model_store=store, workdir=work / f"server-{name}-{round_no}", base_config=config
    ) as server:
        target = compare.register(
            server, registered, name, body, content_type, frontend_pid(server), **frontend
        )
        clients = 32 if body.name.endswith("12mp") else CLIENTS  # as compare.py sends 12 MP
        compare.warm_up(target, body, content_type, clients, min(3000, requests // 2))
        if len(target.worker_pids) != workers:
            raise RuntimeError(f"{name}: {len(target.worker_pids)} workers, expected {workers}")
        measured_from = uptime_s(target.frontend_pid)
        result = compare.ab_run(target, body, content_type, requests, clients, work)
    if log_path is not None:
        result.update(pauses(log_path, measured_from))
    result.update(variant=name, round=round_no)
    bench_lib.log(
        f"  round {round_no + 1} {name:18} {result['requests_per_s']:7.1f} req/s  "
        f"P99 {result['p99_ms']:5.1f} ms  frontend {result['cpu_ms_per_request']['frontend']:.3f} "
        f"ms/req  {format_ledger(result['ledger'])}"
        + (
            f"; JVM pauses {result['pauses']}, {result['pause_total_ms']:.0f} ms, longest "
            f"{result['pause_max_ms']:.1f}"
            if gc_log
            else ""
        )
    )
    return result


def report(results: list[dict[str, Any]], names: list[str]) -> str:
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for r in results:
        by_round.setdefault(r["round"], {})[r["variant"]] = r
    lines = [
        "| variant | req/s | / shipped per round | median | frontend ms/req | / shipped | P99 ms | "
        + " | ".join(MAIN_PARTS)
        + " |",
        "|---|---|---|---|---|---|---|" + "---|" * len(MAIN_PARTS),
    ]
    for name in names:
        runs = [r for r in results if r["variant"] == name]
        if not runs:
            continue
        pairs = [m for m in by_round.values() if name in m and "shipped" in m]
        rate = [m[name]["requests_per_s"] / m["shipped"]["requests_per_s"] for m in pairs]
        cpu = [
            m[name]["cpu_ms_per_request"]["frontend"]
            / m["shipped"]["cpu_ms_per_request"]["frontend"]
            for m in pairs
        ]
        folded = [ledger_summary(r["ledger"]) for r in runs]
        cores = [statistics.median(f[p] for f in folded) for p in MAIN_PARTS]
        lines.append(
            f"| {name} | {statistics.median(r['requests_per_s'] for r in runs):.0f} | "
            + ", ".join(f"{x:.2f}" for x in rate)
            + f" | **{statistics.median(rate):.3f}x** | "
            f"{statistics.median(r['cpu_ms_per_request']['frontend'] for r in runs):.3f} | "
            f"{statistics.median(cpu):.2f}x | "
            f"{statistics.median(r['p99_ms'] for r in runs):.1f} | "
            + " | ".join(f"{c:.2f}" for c in cores)
            + " |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=20000, help="measured per run")
    parser.add_argument("--variants", default=",".join([*VARIANTS, "lean"]))
    parser.add_argument("--workload", choices=("tabular", "image"), default="tabular")
    parser.add_argument("--photo", choices=("720px", "12mp"), default="720px", help="image's body")
    parser.add_argument("--gc-log", action="store_true", help="log and count the JVM's pauses")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    names = args.variants.split(",")
    unknown = sorted(set(names) - {*VARIANTS, "lean"})
    if unknown or "shipped" not in names:
        parser.error(f"--variants: shipped and any of {', '.join([*VARIANTS, 'lean'])}")
    if args.workload == "image" and any("workers" in VARIANTS.get(n, {}) for n in names):
        parser.error("--variants: the workers variants serve the fraud scorer only")
    work = bench_lib.scratch_dir("ts-microbatch-lean-")
    served = model(args.workload, work, args.photo)
    results: list[dict[str, Any]] = []
    try:
        for round_no in range(args.rounds):
            for name in round_order(names, round_no, first_as_given=True):
                results.append(one_run(work, name, round_no, served, args.requests, args.gc_log))
    finally:
        text = report(results, names)
        print(text)
        info = {
            "workload": args.workload,
            "photo": args.photo,
            "variants": VARIANTS,
            "lean": LEAN,
            "clients": CLIENTS,
        }
        bench_lib.save_json(args.out, "results.json", {**info, "results": results})
        if args.out is not None:
            (args.out / "report.md").write_text(text)


if __name__ == "__main__":
    main()
