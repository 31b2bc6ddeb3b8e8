"""Reading the pipeline's metrics back from a TorchServe Prometheus scrape."""

from __future__ import annotations

import math
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from ts_microbatch.tools.scrape import format_summary, main, parse_prometheus, summarize, total


def scrape(scale: float, model: str = "m") -> str:
    """A scrape in TorchServe 0.12's format (note the trailing commas in the labels)."""
    labels = f'ModelName="{model}",Level="Model",Hostname="vm",'
    lines = [
        "# HELP ts_inference_requests_total Total number of inference requests.",
        "# TYPE ts_inference_requests_total counter",
        f'ts_inference_requests_total{{model_name="{model}",model_version="default",'
        f'hostname="vm",}} {64 * scale}',
        f'ts_queue_latency_microseconds{{model_name="{model}",model_version="default",'
        f'hostname="vm",}} {64 * scale * 20000}',
        f'ts_inference_latency_microseconds{{model_name="{model}",model_version="default",'
        f'hostname="vm",}} {64 * scale * 90000}',
        f"MicroBatchesPerBatch_count{{{labels}}} {2 * scale}",
        f"MicroBatchesPerBatch_sum{{{labels}}} {16 * scale}",
        f'MicroBatchSize{{Sizes="3-4",{labels}}} {16 * scale}',
        f'MicroBatchRequestErrors{{StatusCode="400",{labels}}} {scale}',
    ]
    for stage, seconds in (("preprocess", 0.02), ("inference", 0.005), ("postprocess", 0.001)):
        lines += [
            f'MicroBatchStageSeconds_count{{Stage="{stage}",{labels}}} {16 * scale}',
            f'MicroBatchStageSeconds_sum{{Stage="{stage}",{labels}}} {16 * scale * seconds}',
            f'MicroBatchQueueSeconds_count{{Stage="{stage}",{labels}}} {16 * scale}',
            f'MicroBatchQueueSeconds_sum{{Stage="{stage}",{labels}}} {16 * scale * seconds / 2}',
        ]
    lines.append('CPUUtilization{Level="Host",Hostname="vm",} 100.0')
    return "\n".join(lines) + "\n"


def test_parse_reads_names_labels_and_values() -> None:
    samples = parse_prometheus(scrape(1))
    assert not any(s.name.startswith("#") for s in samples)
    first = samples[0]
    assert first.name == "ts_inference_requests_total"
    assert first.labels == {"model_name": "m", "model_version": "default", "hostname": "vm"}
    assert first.value == 64.0
    assert total(samples, "MicroBatchStageSeconds_count", Stage="inference") == 16
    assert total(samples, "MicroBatchStageSeconds_count") == 48


def test_summary_of_the_traffic_between_two_scrapes() -> None:
    summary = summarize(scrape(3), scrape(1), "m")
    assert summary["requests"] == 128
    assert summary["batches"] == 4 and summary["micro_batches"] == 32
    assert summary["mean_batch_size"] == 32 and summary["mean_micro_batch_size"] == 4
    assert summary["micro_batches_per_batch"] == 8
    assert summary["stage_ms"] == pytest.approx(
        {"preprocess": 20.0, "inference": 5.0, "postprocess": 1.0}
    )
    assert summary["stage_wait_ms"]["preprocess"] == pytest.approx(10.0)
    assert summary["frontend_queue_ms"] == pytest.approx(20.0)
    assert summary["frontend_latency_ms"] == pytest.approx(90.0)
    assert summary["errors"] == {"400": 2}
    line = format_summary(summary)
    assert "preprocess 20.0 ms" in line and "2x400" in line


def test_summary_by_interval_takes_its_counts_from_the_counters() -> None:
    # Two one-second intervals: a batch of 32 in 8 micro-batches of 4, then ten batches of
    # one request. The histograms hold each interval's mean (4.0 and 1.0 for sizes, 8.0 and
    # 1.0 for micro-batches per batch); the counters hold the exact counts.
    labels = 'ModelName="m",Level="Model",Hostname="vm",'
    frontend = 'model_name="m",model_version="default",hostname="vm",'
    text = scrape(0)  # every other sample at zero
    text += "\n".join(
        [
            f"ts_inference_requests_total{{{frontend}}} 42",
            f"MicroBatchesPerBatch_count{{{labels}}} 2",
            f"MicroBatchesPerBatch_sum{{{labels}}} 9.0",
            f'MicroBatchSize{{Sizes="2",{labels}}} 1',
            f'MicroBatchSize{{Sizes="3-4",{labels}}} 1',
            f"MicroBatchBatches{{{labels}}} 11",
            f"MicroBatchesCut{{{labels}}} 18",
        ]
    )
    summary = summarize(text, "", "m")
    assert summary["batches"] == 11
    assert summary["mean_batch_size"] == pytest.approx(42 / 11)  # not (5/2) * (9/2)
    assert summary["mean_micro_batch_size"] == pytest.approx(42 / 18)
    assert summary["micro_batches_per_batch"] == pytest.approx(18 / 11)


def test_summary_filters_by_model_and_survives_a_restart() -> None:
    both = scrape(2, "a") + scrape(5, "b")
    assert summarize(both, "", "a")["micro_batches"] == 32
    assert summarize(both)["micro_batches"] == 16 * 7
    # Counters that went down mean the worker restarted: the later scrape alone counts.
    assert summarize(scrape(1), scrape(4), "m")["micro_batches"] == 16
    empty = summarize("", "", "m")
    assert empty["requests"] == 0 and math.isnan(empty["mean_micro_batch_size"])
    assert empty["errors"] == {}


def test_command_line_prints_a_line_per_interval(capsys: pytest.CaptureFixture[str]) -> None:
    scrapes = iter([scrape(1), scrape(3), scrape(6)])

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = next(scrapes).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        assert main([url, "--model", "m", "--interval", "0.01", "--count", "2"]) == 0
    finally:
        server.shutdown()
        thread.join(10)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert "128 requests;" in lines[0] and "2x400" in lines[0]  # scrape 3 minus scrape 1
    assert "192 requests;" in lines[1] and "3x400" in lines[1]  # scrape 6 minus scrape 3
    assert main(["http://127.0.0.1:9/metrics"]) == 2  # nothing listens on port 9
    assert "cannot read" in capsys.readouterr().err
    assert format_summary(summarize("", "", "m")) == "no micro-batches"


def test_padding_and_recompiles_in_the_summary() -> None:
    labels = 'ModelName="m",Level="Model",Hostname="vm",'
    padded = [
        f"MicroBatchPaddedItems_count{{{labels}}} 16.0",
        f"MicroBatchPaddedItems_sum{{{labels}}} 8.0",  # 8 padded items beside 64 real ones
        f"MicroBatchRecompiles{{{labels}}} 2.0",
    ]
    summary = summarize(scrape(1.0) + "\n".join(padded) + "\n", model_name="m")
    assert summary["padded_per_micro_batch"] == 0.5
    assert summary["padded_share"] == pytest.approx(8 / 72)
    assert summary["recompiles"] == 2
    line = format_summary(summary)
    assert line.endswith(
        "; padded 0.50 items per micro-batch (11%); 2 recompiles on the request path"
    )
    plain = summarize(scrape(1.0), model_name="m")
    assert math.isnan(plain["padded_per_micro_batch"]) and plain["recompiles"] == 0
    assert "padded" not in format_summary(plain)


def test_useful_token_share_in_the_summary() -> None:
    labels = 'ModelName="m",Level="Model",Hostname="vm",'
    tokens = [
        f"MicroBatchTokens_total{{{labels}}} 600.0",
        f"MicroBatchPaddedTokens_total{{{labels}}} 800.0",
    ]
    summary = summarize(scrape(1.0) + "\n".join(tokens) + "\n", model_name="m")
    assert summary["tokens"] == 600 and summary["padded_tokens"] == 800
    assert summary["useful_token_share"] == pytest.approx(0.75)
    assert "; tokens 75% useful (600 of 800 padded)" in format_summary(summary)
    assert "tokens" not in format_summary(summarize(scrape(1.0), model_name="m"))
