"""Start, drive and stop a TorchServe on loopback: for `make serve`, tests and benchmarks.

The server runs in a process group of its own (frontend and workers), so that stopping it
leaves nothing behind, and it is safe beside any other TorchServe: free HTTP and gRPC ports,
a block of free worker ports and a temp directory of its own for the worker sockets
(tools.ports says why). Its HTTP calls take any status as a ``Response``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import METRICS_YAML
from .ports import LOOPBACK, free_ports, free_worker_ports, socket_dir_for, without_java_tmpdir
from .ports import free_port as free_port  # re-exported: tests and benchmarks import it here
from .processes import remove_pid_file, stop_from_pid_file, stop_process_group, write_pid_file

# What a server started without a config.properties of the user's runs with: one worker,
# room for a benchmark's clients and camera photos, the package's metrics declared.
DEFAULT_PROPERTIES = {
    "default_workers_per_model": "1",
    "job_queue_size": "1000",
    "max_request_size": "33554432",
    "install_py_dep_per_model": "false",
    "metrics_config": str(METRICS_YAML),
}

# LOOPBACK, free_port and stop_process_group are also imported from here (tests, benchmarks).
logger = logging.getLogger(__name__)


class TorchServeError(RuntimeError):
    """TorchServe did not start, or answered the management API with an error."""


class _PortTakenError(Exception):
    """TorchServe could not bind one of its ports."""


@dataclass
class Response:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body)


def read_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """Reads a Java .properties file as TorchServe does (key=value, # comments)."""
    lines = (line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines())
    pairs = (line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def java_problem() -> str | None:
    """Why TorchServe's Java frontend cannot start here, or None when it can."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if java and os.path.exists(java):
        return None
    return (
        "java not found: TorchServe's frontend needs Java 17 "
        "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless)"
    )


@dataclass
class TorchServe:
    """A TorchServe process on loopback ports, configured from a base config.properties.

    Args:
        model_store: directory of .mar files.
        workdir: where the generated config, logs and key file go.
        base_config: a config.properties to start from; addresses and model store are set here.
        ports: (inference, management, metrics); free ports when None.
        worker_port: TorchServe's initial_worker_port; when None, the first port of a block
            no other server's workers use, chosen again at every start.
        token_auth: keep TorchServe's token authorization on (its default).
        properties: extra config.properties entries, applied last.
        env: extra environment variables for TorchServe and its workers.
        python: the Python whose environment's ``torchserve`` starts (its workers run that
            Python); this interpreter when None.
    """

    model_store: Path
    workdir: Path
    base_config: Path | None = None
    ports: tuple[int, int, int] | None = None
    worker_port: int | None = None
    token_auth: bool = True
    properties: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    python: Path | None = None
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.model_store = Path(self.model_store).resolve()
        self.workdir = Path(self.workdir).resolve()
        self.log_dir = self.workdir / "logs"
        self.pid_file = self.workdir / "torchserve.pid"
        self.config_path = self.workdir / "config.properties"
        # Java's temp directory for this server: its worker sockets, its unpacked models.
        self.socket_dir = socket_dir_for(self.workdir)
        # Free ports may be taken before TorchServe binds them: start() then picks others.
        self._auto_ports = self.ports is None
        self._auto_worker_port = self.worker_port is None
        self._new_ports()

    def _new_ports(self) -> None:
        picked = free_ports(5)  # distinct: one port given twice stops the server
        if self._auto_ports or self.ports is None:
            self.ports = (picked[0], picked[1], picked[2])
        # gRPC too, on 7070 and 7071 unless told otherwise: two servers would collide there.
        self._grpc_ports = (picked[3], picked[4])

    def _url(self, which: int) -> str:
        if self.ports is None:  # for mypy: chosen in __post_init__
            raise TorchServeError("the server's ports are not chosen yet")
        return f"http://{LOOPBACK}:{self.ports[which]}"

    @property
    def inference_url(self) -> str:
        return self._url(0)

    @property
    def management_url(self) -> str:
        return self._url(1)

    @property
    def metrics_url(self) -> str:
        return self._url(2)

    def write_config(self) -> Path:
        props = read_properties(self.base_config) if self.base_config else {}
        metrics_config = props.get("metrics_config")
        if self.base_config and metrics_config and not os.path.isabs(metrics_config):
            # TorchServe would resolve it against its working directory, which is ours.
            props["metrics_config"] = str(Path(self.base_config).resolve().parent / metrics_config)
        if self.worker_port is None:
            self.worker_port = free_worker_ports([self.socket_dir])
        props = without_java_tmpdir(props)  # Java's temp directory is this server's own
        props.update(
            inference_address=self.inference_url,
            management_address=self.management_url,
            metrics_address=self.metrics_url,
            grpc_inference_port=str(self._grpc_ports[0]),
            grpc_management_port=str(self._grpc_ports[1]),
            initial_worker_port=str(self.worker_port),
            model_store=str(self.model_store),
            enable_model_api="true",
            disable_token_authorization="false" if self.token_auth else "true",
        )
        props.update(self.properties)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in props.items()), "utf-8")
        return self.config_path

    def log(self, name: str = "model_log.log") -> str:
        path = self.log_dir / name
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    def start(self, timeout_s: float = 180.0, bind_attempts: int = 3) -> TorchServe:
        """Starts TorchServe and waits until /ping answers; with ports chosen here, a port
        taken in the meantime means new ports and another try, ``bind_attempts`` in all.

        Raises:
            TorchServeError: Java is missing, the process exited, or /ping never answered.
        """
        attempts_left = bind_attempts
        while True:
            try:
                return self._start_once(timeout_s)
            except _PortTakenError as exc:
                attempts_left -= 1
                if not self._auto_ports or attempts_left <= 0:
                    raise TorchServeError(str(exc)) from exc
                logger.warning("%s; retrying on new ports", exc)
                self._new_ports()

    def _start_once(self, timeout_s: float) -> TorchServe:
        problem = java_problem()
        if problem:
            raise TorchServeError(problem)
        if self._auto_worker_port:  # a block free at the last start may be taken since
            self.worker_port = None
        self.write_config()
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(
            os.environ,
            LOG_LOCATION=str(self.log_dir),
            METRICS_LOCATION=str(self.log_dir),
            TMPDIR=str(self.workdir),  # TorchServe keeps its pid file in the temp dir
            # ts/model_server.py passes TEMP to Java as java.io.tmpdir, where the frontend
            # puts the worker sockets (.ts.sock.<port>); /tmp is every other server's.
            TEMP=str(self.socket_dir),
            **self.env,
        )
        torchserve = str(Path(self.python or sys.executable).with_name("torchserve"))
        paths = ["--ts-config", str(self.config_path), "--model-store", str(self.model_store)]
        # A new file per start: an earlier attempt's output must not be read as this one's.
        out_path = self.log_dir / "torchserve.out"
        with open(out_path, "wb") as out:
            self.process = subprocess.Popen(
                [torchserve, "--start", "--foreground", "--ncs", *paths],
                cwd=self.workdir,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        write_pid_file(self.pid_file, self.process.pid)  # what `serve stop` may signal
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                output = out_path.read_text(errors="replace")
                if "Address already in use" in output:
                    raise _PortTakenError(
                        f"a port of {self.ports} was taken before TorchServe bound it"
                    )
                raise TorchServeError(
                    f"TorchServe exited: {output.strip()[-500:]!r}; see {out_path}"
                )
            try:
                if self.request("GET", f"{self.inference_url}/ping", timeout_s=2).status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.25)
        self.stop()
        raise TorchServeError(f"TorchServe did not answer /ping within {timeout_s:.0f} s")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stops the whole process group, frontend and workers; idempotent. One started by
        another process (``serve stop``) only once its pid file shows it is that TorchServe
        (else PidFileError, and nothing is signalled)."""
        if self.process is not None:
            stop_process_group(self.process.pid, timeout_s, self.process)
            self.process.wait(timeout=timeout_s)
            remove_pid_file(self.pid_file, self.process.pid)
            self.process = None
        elif self.pid_file.exists():
            stop_from_pid_file(self.pid_file, timeout_s)
        else:
            return
        # Its sockets are gone with its workers; what is left is unpacked model copies.
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    def __enter__(self) -> TorchServe:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def token(self, kind: str) -> str | None:
        """The ``"inference"`` or ``"management"`` key, None with token authorization off."""
        key_file = self.workdir / "key_file.json"
        if not self.token_auth or not key_file.exists():
            return None
        try:
            token: str | None = json.loads(key_file.read_text()).get(kind, {}).get("key")
        except json.JSONDecodeError:  # still being written by the frontend
            return None
        return token

    def request(
        self,
        method: str,
        url: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float = 120.0,
    ) -> Response:
        """One HTTP request; any status comes back as a Response, network errors raise OSError."""
        headers = dict(headers or {})
        token = self.token("management" if url.startswith(self.management_url) else "inference")
        if token:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return Response(resp.status, resp.read(), dict(resp.headers))
        except urllib.error.HTTPError as err:
            return Response(err.code, err.read(), dict(err.headers or {}))

    def register(
        self,
        mar: str,
        *,
        batch_size: int = 1,
        max_batch_delay_ms: int = 100,
        initial_workers: int = 1,
        response_timeout_s: int | None = None,
        model_name: str | None = None,
        timeout_s: float = 300.0,
    ) -> Response:
        """POST /models synchronously; the response says whether the workers started."""
        params: dict[str, Any] = {
            "url": mar,
            "batch_size": batch_size,
            "max_batch_delay": max_batch_delay_ms,
            "initial_workers": initial_workers,
            "synchronous": "true",
        }
        if response_timeout_s is not None:
            params["response_timeout"] = response_timeout_s
        if model_name:
            params["model_name"] = model_name
        query = urllib.parse.urlencode(params)
        return self.request("POST", f"{self.management_url}/models?{query}", timeout_s=timeout_s)

    def unregister(
        self, model_name: str, *, drain: bool = True, timeout_s: float = 120.0
    ) -> Response:
        """DELETE /models/<name>, by default once the requests queued for it are answered:
        TorchServe 0.12 drops them, and their clients wait until they time out
        (pytorch/serve#1101). Requests sent after the DELETE get 404."""
        url = f"{self.management_url}/models/{model_name}"
        deadline = time.monotonic() + timeout_s
        while drain and time.monotonic() < deadline:
            resp = self.request("GET", url)
            if resp.status != 200 or resp.json()[0]["jobQueueStatus"]["pendingRequests"] == 0:
                break
            time.sleep(0.05)  # TorchServe has no drain event to wait on
        return self.request("DELETE", url, timeout_s=max(1.0, deadline - time.monotonic()))

    def scale(self, model_name: str, workers: int, timeout_s: float = 300.0) -> Response:
        """PUT /models/<name> to exactly ``workers`` workers, synchronously. Also the way
        past a .mar's model-config.yaml: its minWorkers and maxWorkers win over the
        registration's initial_workers, not over this."""
        query = urllib.parse.urlencode(
            {"min_worker": workers, "max_worker": workers, "synchronous": "true"}
        )
        url = f"{self.management_url}/models/{model_name}?{query}"
        for _ in range(3):
            resp = self.request("PUT", url, timeout_s=timeout_s)
            # TorchServe 0.12's frontend can answer a scale-down under load with a 500
            # ConcurrentModificationException (its own worker map changing while it is
            # iterated); asked again, as a client would.
            if b"ConcurrentModificationException" not in resp.body:
                break
        return resp

    def describe(self, model_name: str) -> dict[str, Any]:
        resp = self.request("GET", f"{self.management_url}/models/{model_name}")
        if resp.status != 200:
            raise TorchServeError(f"GET /models/{model_name}: {resp.status} {resp.body!r}")
        described: dict[str, Any] = resp.json()[0]
        return described

    def predict(
        self,
        model_name: str,
        body: bytes,
        timeout_s: float = 120.0,
        content_type: str = "application/octet-stream",
        headers: dict[str, str] | None = None,
    ) -> Response:
        # Without a content type urllib sends a form encoding, which TorchServe would parse.
        headers = {"Content-Type": content_type, **(headers or {})}
        url = f"{self.inference_url}/predictions/{model_name}"
        return self.request("POST", url, body=body, headers=headers, timeout_s=timeout_s)

    def scrape_metrics(self) -> str:
        return self.request("GET", f"{self.metrics_url}/metrics").body.decode()
