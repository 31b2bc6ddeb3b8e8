"""ts_microbatch.tools.server.TorchServe, the fixture every integration test stands on."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.integration.servers import local_server
from ts_microbatch.tools import server as server_module
from ts_microbatch.tools.processes import group_members
from ts_microbatch.tools.server import TorchServe


def test_hang_free_port_taken_before_torchserve_binds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # free_port() closes its socket, so another process can take the port first. Here a
    # listener holds the first port handed out; start() must move to new ports.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        real = server_module.free_ports
        handed: Iterator[int] = iter([busy])

        def first_busy(count: int) -> list[int]:
            ports = real(count)
            return [next(handed, None) or ports[0], *ports[1:]]

        monkeypatch.setattr(server_module, "free_ports", first_busy)
        (tmp_path / "store").mkdir()
        ts = TorchServe(
            model_store=tmp_path / "store",
            workdir=tmp_path / "server",
            base_config=Path(ROOT) / "configs/config.properties",
        )
        assert ts.ports is not None and ts.ports[0] == busy
        with caplog.at_level(logging.WARNING, logger="ts_microbatch.tools.server"), ts:
            assert "retrying on new ports" in caplog.text  # the first try did hit the port
            assert ts.ports[0] != busy
            assert ts.request("GET", f"{ts.inference_url}/ping").status == 200


def test_stop_from_the_pid_file_stops_the_torchserve_it_started(tmp_path: Path) -> None:
    # `serve stop` runs in another process than `serve start`: it has the pid file only,
    # whose record (start time, command line) must match the real TorchServe it names.
    (tmp_path / "store").mkdir()
    started = local_server(tmp_path / "store", tmp_path / "server")
    with started:
        assert started.process is not None
        pgid = started.process.pid
        assert len(group_members(pgid)) >= 2  # the torchserve launcher and its Java frontend
        TorchServe(model_store=tmp_path / "store", workdir=tmp_path / "server").stop()
        started.process.wait(timeout=60)
        assert not group_members(pgid)
        assert not started.pid_file.exists()
