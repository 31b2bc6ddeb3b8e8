"""Start, drive and stop a TorchServe on loopback: for `make serve`, tests and benchmarks.

Nothing here knows about a particular model. The server runs in its own process group
(frontend and backend workers), so that stopping it leaves nothing behind. It is safe
beside any other TorchServe on the machine: free HTTP and gRPC ports, a block of free
worker ports and a temp directory of its own for the worker sockets (ts_microbatch.tools.ports
says why a server left at TorchServe's defaults takes over another's worker). Its HTTP
calls (register, predict, ...) are in ts_microbatch.tools.server_api.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .ports import LOOPBACK, free_port, free_worker_ports, socket_dir_for, without_java_tmpdir
from .processes import remove_pid_file, stop_from_pid_file, stop_process_group, write_pid_file
from .server_api import Response, ServerAPI, TorchServeError

__all__ = [
    "LOOPBACK",
    "Response",
    "TorchServe",
    "TorchServeError",
    "free_port",
    "java_problem",
    "read_properties",
    "stop_process_group",
]

logger = logging.getLogger(__name__)


def read_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """Reads a Java .properties file as TorchServe does (key=value, # comments)."""
    props: dict[str, str] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            props[key.strip()] = value.strip()
    return props


def java_problem() -> str | None:
    """Why TorchServe's Java frontend cannot start here, or None when it can."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        return (
            "java not found: TorchServe's frontend needs Java 17 "
            "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless)"
        )
    return None


class _PortTakenError(Exception):
    """TorchServe could not bind one of its ports."""


@dataclass
class TorchServe(ServerAPI):
    """A TorchServe process on loopback ports, configured from a base config.properties;
    its HTTP calls (request, register, predict, ...) are ServerAPI's (tools.server_api).

    Args:
        model_store: directory of .mar files.
        workdir: where the generated config, logs and key file go.
        base_config: a config.properties to start from; addresses and model store are set here.
        ports: (inference, management, metrics); free ports when None.
        worker_port: TorchServe's initial_worker_port; when None, the first port of a block
            that no other server's workers use (ports.free_worker_ports), chosen at start.
        token_auth: keep TorchServe's token authorization on (its default).
        properties: extra config.properties entries, applied last.
        env: extra environment variables for TorchServe and its workers (such as
            TORCHINDUCTOR_CACHE_DIR).
    """

    model_store: Path
    workdir: Path
    base_config: Path | None = None
    ports: tuple[int, int, int] | None = None
    worker_port: int | None = None
    token_auth: bool = True
    properties: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.model_store = Path(self.model_store).resolve()
        self.workdir = Path(self.workdir).resolve()
        # Ports picked here may be taken by another process before TorchServe binds them
        # (free_port closes its socket): start() then picks new ones and tries again.
        self._auto_ports = self.ports is None
        if self.ports is None:
            self.ports = (free_port(), free_port(), free_port())
        # TorchServe also listens for gRPC, on 7070 and 7071 unless told otherwise: two
        # servers on one machine would collide there.
        self._grpc_ports = (free_port(), free_port())
        self._auto_worker_port = self.worker_port is None

    # -- files -------------------------------------------------------------------------

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def pid_file(self) -> Path:
        return self.workdir / "torchserve.pid"

    @property
    def config_path(self) -> Path:
        return self.workdir / "config.properties"

    @property
    def socket_dir(self) -> Path:
        """Java's temp directory for this server: its worker sockets, its unpacked models."""
        return socket_dir_for(self.workdir)

    def choose_worker_port(self) -> int:
        """A new block of free worker ports (with ``worker_port`` given: that one)."""
        if self._auto_worker_port:
            self.worker_port = free_worker_ports([self.socket_dir])
        if self.worker_port is None:  # for mypy: set just above
            raise TorchServeError("no worker port chosen")
        return self.worker_port

    def write_config(self) -> Path:
        props = read_properties(self.base_config) if self.base_config else {}
        metrics_config = props.get("metrics_config")
        if self.base_config and metrics_config and not os.path.isabs(metrics_config):
            # TorchServe would resolve it against its working directory, which is ours.
            props["metrics_config"] = str(Path(self.base_config).resolve().parent / metrics_config)
        # Java's temp directory must be this server's own (TEMP, in _start_once): its worker
        # sockets would otherwise sit beside other servers' and replace them.
        props = without_java_tmpdir(props)
        worker_port = (
            self.worker_port if self.worker_port is not None else self.choose_worker_port()
        )
        props.update(
            {
                "inference_address": self.inference_url,
                "management_address": self.management_url,
                "metrics_address": self.metrics_url,
                "grpc_inference_port": str(self._grpc_ports[0]),
                "grpc_management_port": str(self._grpc_ports[1]),
                "initial_worker_port": str(worker_port),
                "model_store": str(self.model_store),
                "enable_model_api": "true",
                "disable_token_authorization": "false" if self.token_auth else "true",
            }
        )
        props.update(self.properties)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(
            "".join(f"{k}={v}\n" for k, v in props.items()), encoding="utf-8"
        )
        return self.config_path

    def log(self, name: str = "model_log.log") -> str:
        path = self.log_dir / name
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    # -- process -------------------------------------------------------------------------

    def start(self, timeout_s: float = 180.0, bind_attempts: int = 3) -> TorchServe:
        """Starts TorchServe and waits until /ping answers.

        With ports chosen automatically, a port taken by another process in the meantime
        (TorchServe exits with "Address already in use") means new ports and another try,
        up to ``bind_attempts`` in all.

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
                self.ports = (free_port(), free_port(), free_port())
                self._grpc_ports = (free_port(), free_port())

    def _start_once(self, timeout_s: float) -> TorchServe:
        problem = java_problem()
        if problem:
            raise TorchServeError(problem)
        # Chosen again at every start: a block free at the last one may be taken since.
        self.choose_worker_port()
        self.write_config()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(parents=True, exist_ok=True)
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
        torchserve = str(Path(sys.executable).with_name("torchserve"))
        cmd = [
            torchserve,
            "--start",
            "--foreground",
            "--ncs",
            "--ts-config",
            str(self.config_path),
            "--model-store",
            str(self.model_store),
        ]
        # A new file per start: an earlier attempt's output must not be read as this one's.
        out = open(self.log_dir / "torchserve.out", "wb")  # noqa: SIM115 - owned by the child
        self.process = subprocess.Popen(
            cmd,
            cwd=self.workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        write_pid_file(self.pid_file, self.process.pid)  # what `serve stop` may signal
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                output = (self.log_dir / "torchserve.out").read_text(errors="replace")
                if "Address already in use" in output:
                    raise _PortTakenError(
                        f"a port of {self.ports} was taken before TorchServe bound it"
                    )
                raise TorchServeError(
                    f"TorchServe exited: {output.strip()[-500:]!r}; see "
                    f"{self.log_dir / 'torchserve.out'}"
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
        """Stops the whole process group: frontend and backend workers. Idempotent. One
        started by another process (``serve stop``): only once the pid file's record shows
        it is that TorchServe, else PidFileError and nothing signalled (tools.processes)."""
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
