"""Worker ports and socket paths (ts_microbatch.tools.ports) and what a tool's TorchServe is
configured with: a block of worker ports no other server uses, Java's temp directory of
its own, a user's config kept but for those. No TorchServe here (tests/integration/
test_beside_a_running_server.py starts one beside a user's)."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT
from ts_microbatch.tools import ports
from ts_microbatch.tools import server as server_module
from ts_microbatch.tools.server import TorchServe, TorchServeError, read_properties

# Far from TorchServe's 9000. It is inside Linux's ephemeral range (32768-60999): a
# connection the suite made a moment ago can linger on any of these ports (TIME_WAIT), and
# CI failed on it once the integration tests ran first. So the tests below see only the
# TCP ports they bind themselves (``own_tcp_ports``), never the machine's.
START = 41000


@pytest.fixture
def own_tcp_ports(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The TCP ports a test binds; ``ports.tcp_port_bound`` really checks those alone."""
    owned: set[int] = set()
    real = ports.tcp_port_bound
    monkeypatch.setattr(ports, "tcp_port_bound", lambda port: port in owned and real(port))
    return owned


def no_unix_sockets(tmp_path: Path) -> str:
    path = tmp_path / "proc_net_unix"
    path.write_text("Num       RefCount Protocol Flags    Type St Inode Path\n")
    return str(path)


def test_a_worker_socket_file_moves_the_block(tmp_path: Path, own_tcp_ports: set[int]) -> None:
    # The reported incident: /tmp/.ts.sock.9000 of a running server, and a tool's server
    # left at initial_worker_port=9000 whose worker removed it and bound the path.
    (tmp_path / f"{ports.SOCKET_PREFIX}{START + 3}").touch()
    proc = no_unix_sockets(tmp_path)
    first = ports.free_worker_ports([tmp_path], block=10, start=START, proc_net_unix=proc)
    assert first == START + 10


def test_a_listening_unix_socket_whose_file_is_gone_still_counts(
    tmp_path: Path, own_tcp_ports: set[int]
) -> None:
    proc = tmp_path / "proc_net_unix"
    proc.write_text(
        "Num       RefCount Protocol Flags    Type St Inode Path\n"
        f"0000: 00000002 00000000 00010000 0001 01 4242 /var/x/{ports.SOCKET_PREFIX}{START + 5}\n"
        "0000: 00000002 00000000 00010000 0001 01 4243 @abstract\n"
        "0000: 00000003 00000000 00000000 0001 03 4244\n"
    )
    assert ports.worker_socket_ports([], str(proc)) == {START + 5}
    first = ports.free_worker_ports([], block=10, start=START, proc_net_unix=str(proc))
    assert first == START + 10


def test_a_bound_tcp_port_moves_the_block(tmp_path: Path, own_tcp_ports: set[int]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # a port the OS says is free, not one that may linger
        taken.listen()
        port = taken.getsockname()[1]
        own_tcp_ports.add(port)
        assert ports.tcp_port_bound(port)
        proc = no_unix_sockets(tmp_path)
        first = ports.free_worker_ports([], block=10, start=port - 7, proc_net_unix=proc)
    assert first == port + 3  # the next block


def test_no_free_block_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / f"{ports.SOCKET_PREFIX}65525").touch()
    with pytest.raises(ports.PortError, match="no block of 10 free worker ports"):
        ports.free_worker_ports(
            [tmp_path], block=10, start=65520, proc_net_unix=no_unix_sockets(tmp_path)
        )
    with pytest.raises(ValueError, match="block: got 0"):
        ports.free_worker_ports(block=0)


def test_a_long_workdir_gets_a_short_socket_dir_that_a_later_stop_finds(tmp_path: Path) -> None:
    short = tmp_path / "w"
    assert ports.socket_dir_for(short) == short / "tmp"
    deep = tmp_path.joinpath(*["a-rather-long-directory-name"] * 5)
    chosen = ports.socket_dir_for(deep)
    assert chosen.parent == Path("/tmp") and chosen == ports.socket_dir_for(deep)
    assert len(str(chosen / f"{ports.SOCKET_PREFIX}65535").encode()) <= 107  # sun_path


def test_a_users_config_keeps_its_settings_but_not_the_ports_a_tool_must_own(
    tmp_path: Path,
) -> None:
    own = tmp_path / "config.properties"
    own.write_text(
        "inference_address=http://127.0.0.1:8080\n"
        "initial_worker_port=9000\n"
        "job_queue_size=7\n"
        "vmargs=-Xmx1g -Djava.io.tmpdir=/tmp -XX:+UseG1GC\n"
    )
    ts = TorchServe(model_store=tmp_path / "store", workdir=tmp_path / "work", base_config=own)
    written = read_properties(ts.write_config())
    assert written["job_queue_size"] == "7"
    assert written["vmargs"] == "-Xmx1g -XX:+UseG1GC"
    assert written["inference_address"] == ts.inference_url != "http://127.0.0.1:8080"
    assert ts.worker_port is not None and written["initial_worker_port"] == str(ts.worker_port)
    socket_files = ports.worker_socket_ports([*ports.default_socket_dirs(), ts.socket_dir])
    assert socket_files.isdisjoint(range(ts.worker_port, ts.worker_port + ports.WORKER_PORT_BLOCK))
    only_tmpdir = tmp_path / "only.properties"
    only_tmpdir.write_text("vmargs=-Djava.io.tmpdir=/tmp\n")
    ts = TorchServe(tmp_path / "store", tmp_path / "work2", base_config=only_tmpdir)
    assert "vmargs" not in read_properties(ts.write_config())
    given = TorchServe(tmp_path / "store", tmp_path / "work3", worker_port=12345)
    assert read_properties(given.write_config())["initial_worker_port"] == "12345"


def test_torchserve_gets_a_java_temp_directory_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    class Exited:
        pid = 2**22 + 1  # no such process: stop() finds nothing to signal

        def __init__(self, cmd: list[str], **kwargs: Any) -> None:
            seen.update(kwargs, cmd=cmd)
            Path(kwargs["stdout"].name).write_text("exited at once\n")

        def poll(self) -> int:
            return 1

        def wait(self, timeout: float | None = None) -> int:
            return 1

    monkeypatch.setattr(server_module, "java_problem", lambda: None)
    monkeypatch.setattr(server_module.subprocess, "Popen", Exited)
    monkeypatch.setattr(server_module, "stop_process_group", lambda *a: None)
    ts = TorchServe(model_store=tmp_path / "store", workdir=tmp_path / "work")
    with pytest.raises(TorchServeError, match="exited at once"):
        ts.start()
    # ts/model_server.py turns TEMP into -Djava.io.tmpdir, where worker sockets go.
    assert seen["env"]["TEMP"] == str(ts.socket_dir) != "/tmp"
    assert seen["env"]["TMPDIR"] == str(ts.workdir)
    assert not ts.socket_dir.exists()  # stop() removed it
    # The next start chooses its block again: the last one may have been taken since.
    blocks = iter([12300, 12400])
    monkeypatch.setattr(server_module, "free_worker_ports", lambda dirs: next(blocks))
    for block in (12300, 12400):
        with pytest.raises(TorchServeError):
            ts.start()
        assert read_properties(ts.config_path)["initial_worker_port"] == str(block)


def test_the_tools_that_start_torchserve_say_they_are_safe_beside_one() -> None:
    python = str(Path(server_module.sys.executable))
    commands = [
        [python, "-m", "ts_microbatch.tools.benchmark", "--help"],
        [python, "-m", "ts_microbatch.tools.tune", "--help"],
        [python, "-m", "ts_microbatch.tools.serve", "start", "--help"],
        [python, str(Path(ROOT, "benchmarks/benchmark-ab.py")), "--help"],
    ]
    for command in commands:
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        assert "safe beside a running torchserve" in " ".join(out.lower().split()), command
        assert "--ts-config" in out or "--config" in out, command


class _ReusingSocket:
    """A socket whose kernel hands out the lowest port not held open: a port released is
    the next one given, which made two of a server's ports the same."""

    held: set[int] = set()

    def __init__(self) -> None:
        self.port = 0

    def __enter__(self) -> _ReusingSocket:
        return self

    def __exit__(self, *exc_info: object) -> None:
        _ReusingSocket.held.discard(self.port)

    def bind(self, address: tuple[str, int]) -> None:
        self.port = min(set(range(50000, 50010)) - _ReusingSocket.held)
        _ReusingSocket.held.add(self.port)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


def test_a_servers_ports_are_distinct_when_the_kernel_reuses_a_released_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ports.socket, "socket", _ReusingSocket)
    # The scenario: ports chosen one at a time are all the same one here.
    assert ports.free_port() == ports.free_port() == 50000
    assert ports.free_ports(5) == [50000, 50001, 50002, 50003, 50004]
    ts = TorchServe(model_store=tmp_path / "store", workdir=tmp_path / "w", worker_port=9000)
    assert ts.ports is not None
    assert len({*ts.ports, *ts._grpc_ports}) == 5
