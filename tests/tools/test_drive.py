"""The corpus driver (ts_microbatch.tools.drive) against a small HTTP server on loopback:
every request sent once, bodies in the corpus's order, clients in parallel, statuses counted."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ts_microbatch.tools.corpus import Body, Corpus
from ts_microbatch.tools.drive import DriveError, floor, send_corpus


class Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as TorchServe
    received: list[tuple[bytes, str, str]] = []
    lock = threading.Lock()
    in_flight = 0
    most_in_flight = 0
    all_in = threading.Event()
    clients = 0
    collector_on: list[bool] = []  # gc.isenabled() as each request arrived (same process)

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        cls = type(self)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        cls.collector_on.append(gc.isenabled())
        with cls.lock:
            cls.received.append((body, self.headers["Content-Type"], self.headers["Authorization"]))
            cls.in_flight += 1
            cls.most_in_flight = max(cls.most_in_flight, cls.in_flight)
            if cls.in_flight >= cls.clients:
                cls.all_in.set()
        cls.all_in.wait(5)  # the first requests are answered once every client has one out
        with cls.lock:
            cls.in_flight -= 1
        status = 400 if body == b"bad" else 200
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Recorder.received, Recorder.in_flight, Recorder.most_in_flight = [], 0, 0
    Recorder.collector_on = []
    Recorder.all_in = threading.Event()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/predictions/m"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def test_every_request_sent_once_in_parallel_with_its_own_content_type(server: str) -> None:
    bodies = tuple(
        Body(f"b{i}", f"text {i}".encode(), "text/plain" if i % 2 else "application/json")
        for i in range(5)
    ) + (Body("bad", b"bad", "text/plain"),)
    corpus = Corpus("test", bodies)
    Recorder.clients = 4
    summary, latency = send_corpus(server, corpus, 30, 4, token="secret")
    assert Recorder.most_in_flight == 4  # four requests out at once: parallel clients
    sent = sorted(body for body, _, _ in Recorder.received)
    assert sent == sorted(corpus.bodies[i].data for i in corpus.sequence(30))
    types = {body: ct for body, ct, _ in Recorder.received}
    assert all(types[b.data] == b.content_type for b in bodies)
    assert {auth for _, _, auth in Recorder.received} == {"Bearer secret"}
    assert summary["complete_requests"] == 30 and summary["failed_requests"] == 0
    assert summary["non_2xx_responses"] == 5 and summary["statuses"] == {"200": 25, "400": 5}
    assert latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"]


def test_no_answer_is_a_failed_request(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    corpus = Corpus("one", (Body("x", b"x", "text/plain"),))
    summary, _ = send_corpus(f"http://127.0.0.1:{port}/p", corpus, 3, 2, timeout_s=5)
    assert summary["failed_requests"] == 3 and summary["statuses"] == {"no answer": 3}


def test_loopback_only_and_bounded() -> None:
    corpus = Corpus("one", (Body("x", b"x", "text/plain"),))
    with pytest.raises(DriveError, match="loopback only"):
        send_corpus("http://example.com/predictions/m", corpus, 1, 1)
    with pytest.raises(DriveError, match="expected >= 1"):
        send_corpus("http://127.0.0.1:1/p", corpus, 0, 1)


def test_the_floor_sends_one_request_at_a_time_and_gives_p99_with_its_interval(
    server: str,
) -> None:
    bodies = (Body("good", b"good", "text/plain"), Body("bad", b"bad", "text/plain"))
    Recorder.clients = 1  # each request answered at once: none waits for another
    alone = floor(server, Corpus("two", bodies), 40, token="t")
    assert Recorder.most_in_flight == 1  # never two out at once: the unloaded latency
    assert len(Recorder.received) == 40
    assert alone["requests"] == 40 and alone["answers"] == 20 and alone["errors"] == 20
    assert alone["p99_low_ms"] <= alone["p99_ms"] <= alone["p99_high_ms"]
    assert alone["p50_ms"] <= alone["p99_ms"]
    # Python's collector paused while the clients' clocks ran (openloop.collector_paused),
    # on again after.
    assert Recorder.collector_on == [False] * 40 and gc.isenabled()


def test_a_floor_with_no_answer_is_lost_not_a_made_up_latency() -> None:
    import math
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    corpus = Corpus("one", (Body("x", b"x", "text/plain"),))
    alone = floor(f"http://127.0.0.1:{port}/p", corpus, 3)
    assert alone["answers"] == 0 and alone["errors"] == 3 and math.isinf(alone["p99_ms"])
