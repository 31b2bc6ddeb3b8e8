"""ts-microbatch-benchmark beside a TorchServe that a user started at TorchServe's defaults.

The incident: the benchmark's servers left ``initial_worker_port`` at 9000 and Java's temp
directory at /tmp, so their worker removed the running server's /tmp/.ts.sock.9000 and
bound the path itself, and their frontend deleted it when it stopped. Here a user's server
runs as ``torchserve --start`` runs it (8080-8082, worker socket /tmp/.ts.sock.9000; when
9000 is taken or another TorchServe runs here, which may take it at any moment, the next
free block, where the tools' scan is then made to start, so that a tool not checking would
still collide), the benchmark runs a short comparison of another .mar
beside it, and the user's socket file must be the same file afterwards, its model must
answer, and answer again after its worker is restarted.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, load_module
from ts_microbatch.tools import benchmark, ports
from ts_microbatch.tools import server as server_module
from ts_microbatch.tools.ports import (
    TORCHSERVE_WORKER_PORT,
    WORKER_PORT_BLOCK,
    free_port,
    free_worker_ports,
    tcp_port_bound,
)
from ts_microbatch.tools.server import java_problem, stop_process_group

text_build = load_module("examples/text_classifier/build_mar.py", "ts_microbatch_text_build_mar")
USER_PORTS = (8080, 8081, 8082)
USER_MODEL = "user_text"
SAMPLE = Path(ROOT, "examples/text_classifier/sample.txt")


def call(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        req.add_header("Content-Type", "application/octet-stream")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def wait_ready(management: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the user's TorchServe exited: {log.read_text()[-2000:]}")
        try:
            status, body = call("GET", f"{management}/models/{USER_MODEL}")
            workers = json.loads(body)[0]["workers"] if status == 200 else []
            if workers and all(w["status"] == "READY" for w in workers):
                return
        except OSError:
            pass
        time.sleep(0.25)  # TorchServe has no readiness event to wait on
    raise AssertionError("the user's model never became ready")


def socket_owner(path: Path) -> str:
    """Who listens on ``path`` now, for a failure message: another TorchServe left at its
    defaults (a colleague's, an older checkout's) takes the path as this test's would."""
    import psutil

    for conn in psutil.net_connections(kind="unix"):
        if conn.laddr == str(path) and conn.pid:
            try:
                proc = psutil.Process(conn.pid)
                return f"pid {conn.pid} in {proc.cwd()}: {' '.join(proc.cmdline())[:300]}"
            except psutil.Error:
                return f"pid {conn.pid}"
    return "nobody listens on it now"


class UserServer:
    """A TorchServe started by its own command line, as a user starts one."""

    def __init__(self, root: Path, worker_port: int) -> None:
        self.root = root
        self.worker_port = worker_port
        self.inference = f"http://127.0.0.1:{USER_PORTS[0]}"
        self.management = f"http://127.0.0.1:{USER_PORTS[1]}"
        # Java's default temp directory, where TorchServe puts the worker's socket.
        self.socket = Path("/tmp") / f".ts.sock.{worker_port}"

    def config(self) -> Path:
        grpc = [p if not tcp_port_bound(p) else free_port() for p in (7070, 7071)]
        lines = [
            f"inference_address={self.inference}",
            f"management_address={self.management}",
            f"metrics_address=http://127.0.0.1:{USER_PORTS[2]}",
            f"grpc_inference_port={grpc[0]}",
            f"grpc_management_port={grpc[1]}",
            "disable_token_authorization=true",
            "default_workers_per_model=1",
        ]
        if self.worker_port != TORCHSERVE_WORKER_PORT:
            lines.append(f"initial_worker_port={self.worker_port}")
        path = self.root / "config.properties"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self, store: Path) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if k not in ("TEMP", "TMP")}
        # Its own pid file (TorchServe keeps it in TMPDIR); Java's temp dir stays /tmp.
        env.update(TMPDIR=str(self.root), LOG_LOCATION=str(self.root / "logs"))
        env["METRICS_LOCATION"] = str(self.root / "logs")
        command = [str(Path(sys.executable).with_name("torchserve")), "--start", "--foreground"]
        command += ["--ncs", "--ts-config", str(self.config()), "--model-store", str(store)]
        command += ["--models", f"{USER_MODEL}=text_mb.mar"]
        return subprocess.Popen(
            command,
            cwd=self.root,
            env=env,
            stdout=open(self.root / "torchserve.out", "wb"),  # noqa: SIM115 - the child's
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def predict(self) -> tuple[int, Any]:
        status, body = call(
            "POST", f"{self.inference}/predictions/{USER_MODEL}", SAMPLE.read_bytes()
        )
        return status, json.loads(body) if status == 200 else body

    def scale(self, workers: int) -> int:
        query = f"min_worker={workers}&max_worker={workers}&synchronous=true"
        return call("PUT", f"{self.management}/models/{USER_MODEL}?{query}")[0]


def other_torchservers() -> list[int]:
    """The Java frontends of TorchServes running on this machine now."""
    import psutil

    return [
        proc.pid
        for proc in psutil.process_iter(["cmdline"])
        if "org.pytorch.serve.ModelServer" in (proc.info["cmdline"] or [])
    ]


@pytest.fixture
def user_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[UserServer]:
    if java_problem():
        pytest.fail(java_problem() or "")
    taken = [p for p in USER_PORTS if tcp_port_bound(p)]
    if taken:
        pytest.skip(f"port(s) {taken} taken: the user's TorchServe runs at its defaults 8080-8082")
    block = free_worker_ports()
    others = other_torchservers()
    if others or block != TORCHSERVE_WORKER_PORT:
        # 9000 is taken, or may be at any moment: another TorchServe runs here, and one
        # left at the defaults would take /tmp/.ts.sock.9000 from this test's user too. The
        # user's server takes the next free block instead, and the tools' scan starts at
        # that block, so that a tool not checking would still collide with it.
        block = free_worker_ports(start=TORCHSERVE_WORKER_PORT + WORKER_PORT_BLOCK)
        scan = functools.partial(ports.free_worker_ports, start=block)
        monkeypatch.setattr(server_module, "free_worker_ports", scan)
    user = UserServer(tmp_path / "user", block)
    user.root.mkdir()
    store = tmp_path / "user_store"
    store.mkdir()
    mar = text_build.build_mar(str(store), work_dir=tmp_path / "build")
    assert mar.name == "text_mb.mar"
    process = user.start(store)
    try:
        wait_ready(user.management, process, user.root / "torchserve.out")
        yield user
    finally:
        stop_process_group(process.pid, 30, process)


def test_the_benchmark_leaves_a_running_torchserves_worker_alone(
    user_server: UserServer, tmp_path: Path
) -> None:
    user = user_server
    assert user.socket.is_socket(), f"the user's worker socket is not at {user.socket}"
    inode = user.socket.stat().st_ino
    assert user.predict()[0] == 200
    other = tmp_path / "bench" / "other.mar"
    other.parent.mkdir()
    shutil.copy(user.root.parent / "user_store" / "text_mb.mar", other)
    out = tmp_path / "out"
    # 200 requests: the OS counts a process's CPU in 10 ms ticks, and 24 requests of the
    # plain text model once cost its worker less than one (read as 0.0 ms a request).
    argv = ["--mar", str(other), "--body", str(SAMPLE), "--rounds", "1", "--requests", "200"]
    argv += ["--warmup-requests", "8", "--concurrency", "4", "--batch-size", "4"]
    argv += ["--settle-s", "0"]  # what is proved is where it runs, not its numbers
    assert benchmark.main([*argv, "--keep-logs", "--out", str(out)]) == 0

    # The user's worker socket is the same file, and its model still answers.
    beside = (
        f"; TorchServes running beside this test now: {other_torchservers()} (one left at "
        f"TorchServe's defaults takes {user.socket} just as the benchmark's used to)"
    )
    assert user.socket.is_socket(), f"{user.socket} is gone{beside}"
    assert user.socket.stat().st_ino == inode, (
        f"{user.socket} replaced: {socket_owner(user.socket)}{beside}"
    )
    assert user.predict()[0] == 200
    # The benchmark ran: every variant measured, each on a server of its own whose worker
    # sockets were in that server's temp directory, on ports outside the user's block.
    results = json.loads((out / "results.json").read_text())
    assert {r["handler"] for r in results["runs"]} == {"plain", "plain1", "ours"}
    assert all(r["complete_requests"] >= 200 and r["errors"] == 0 for r in results["runs"])
    # Read from the servers' own processes (ts_microbatch.tools.cpu): every run cost both.
    cpu = [
        (r["frontend_cpu_ms_per_request"], r["workers_cpu_ms_per_request"]) for r in results["runs"]
    ]
    assert all(frontend > 0 and worker > 0 for frontend, worker in cpu), cpu
    listened = []
    for server_dir in sorted((out / "servers").iterdir()):
        log = (server_dir / "logs" / "model_log.log").read_text()
        listened += re.findall(r"Listening on port: (\S+)", log)
    assert len(listened) == 3, listened  # plain, plain1, ours
    for path in map(Path, listened):
        assert path.parent != Path("/tmp") and path.parent.name.startswith(("tmp", "ts-"))
        port = int(path.name.rsplit(".", 1)[1])
        assert not user.worker_port <= port < user.worker_port + WORKER_PORT_BLOCK, path

    # Its worker restarted (scaled down and up) comes back and answers.
    assert user.scale(0) == 200 and user.scale(1) == 200
    status, answer = user.predict()
    assert status == 200, answer
