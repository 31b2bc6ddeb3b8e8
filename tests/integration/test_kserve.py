"""The KServe pod's data path, everything short of Kubernetes.

The bundle `make kserve-bundle` writes is served by TorchServe started as KServe's runtime
starts it (``torchserve --start --model-store=... --ts-config=...`` with
``TS_SERVICE_ENVELOPE`` set), from a Python environment in which ts_microbatch is not
installed: the .mar's own copy of the worker modules is all there is. The only change to
the bundle's config.properties is its addresses, moved to free loopback ports.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import psutil
import pytest

from tests.conftest import ROOT
from tests.handlers.conftest import make_jpeg
from tests.integration.conftest import build
from ts_microbatch.bundle import write_bundle
from ts_microbatch.scrape import summarize
from ts_microbatch.server import LOOPBACK, Response, free_port, stop_process_group

KSERVE_PYTHON = Path(ROOT) / ".venv-kserve" / "bin" / "python"  # make kserve-venv
DEPLOY = Path(ROOT) / "deploy" / "kserve"
NAME = "resnet-18_mb"
BATCH = 16
JSON = "application/json"
NOT_AN_IMAGE = base64.b64encode(b"not an image").decode()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("kserve_build")
    mar = build.build_mar(
        work / "staging", model_name=NAME, work_dir=work / "mar", self_contained=True
    )
    return write_bundle(
        work / "bundle",
        mar,
        NAME,
        Path(ROOT) / "configs/metrics.yaml",
        batch_size=BATCH,
        max_batch_delay_ms=100,
    )


@pytest.fixture(scope="module")
def python_without_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv that sees this environment's packages (torch, TorchServe) as a stock image
    would have them, but not ts_microbatch: the site directory is listed in a .pth file,
    so its own .pth files (the editable install's import hook) are never run."""
    venv = tmp_path_factory.mktemp("clean_venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "stock_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = (
        "import ts, torch, torchvision\n"
        "try:\n import ts_microbatch\nexcept ImportError:\n print('absent')"
    )
    out = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, cwd=venv, check=True
    )
    assert out.stdout.strip() == "absent", (
        "ts_microbatch is importable: the test would prove nothing"
    )
    return python


class Pod(NamedTuple):
    url: str
    metrics_url: str
    log_dir: Path
    python: Path


@pytest.fixture(scope="module")
def pod(
    bundle: Path, python_without_package: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pod]:
    work = tmp_path_factory.mktemp("kserve_pod")
    config = (bundle / "config" / "config.properties").read_text()
    port, metrics_port = free_port(), free_port()
    addresses = {
        "inference_address": f"http://{LOOPBACK}:{port}",
        "management_address": f"http://{LOOPBACK}:{port}",
        "metrics_address": f"http://{LOOPBACK}:{metrics_port}",
        "grpc_inference_port": str(free_port()),
        "grpc_management_port": str(free_port()),
    }
    for key, value in addresses.items():
        config = re.sub(rf"^{key}=.*$", f"{key}={value}", config, flags=re.M)
    ts_config = work / "config.properties"
    ts_config.write_text(config)
    (work / "metrics.yaml").write_bytes((bundle / "config" / "metrics.yaml").read_bytes())
    log_dir = work / "logs"
    env = dict(
        os.environ,
        TS_SERVICE_ENVELOPE="kservev2",  # as the runtime sets it; config leaves it unread
        LOG_LOCATION=str(log_dir),
        METRICS_LOCATION=str(log_dir),
        TMPDIR=str(work),
    )
    env.pop("PYTHONPATH", None)
    launcher = "import sys; from ts.model_server import start; sys.argv[0] = 'torchserve'; start()"
    process = subprocess.Popen(
        [
            str(python_without_package),
            "-c",
            launcher,
            "--start",
            "--foreground",
            f"--model-store={bundle / 'model-store'}",
            f"--ts-config={ts_config}",
        ],
        cwd=work,
        env=env,
        stdout=open(work / "torchserve.out", "wb"),  # noqa: SIM115 - owned by the child
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        url = addresses["inference_address"]
        ready = threading.Event()
        for _ in range(600):  # the model loads from model_snapshot at start
            if process.poll() is not None:
                raise AssertionError((work / "torchserve.out").read_text()[-3000:])
            try:
                workers = get_json(f"{url}/models/{NAME}")[0]["workers"]
                if workers and all(w["status"] == "READY" for w in workers):
                    break
            except OSError:
                pass
            ready.wait(0.25)  # no event to wait on: TorchServe is polled until it is up
        else:
            raise AssertionError("the model never became ready")
        yield Pod(url, addresses["metrics_address"] + "/metrics", log_dir, python_without_package)
    finally:
        stop_process_group(process.pid, 30, process)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def post(url: str, body: bytes, content_type: str) -> Response:
    req = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return Response(resp.status, resp.read())
    except urllib.error.HTTPError as err:
        return Response(err.code, err.read())


def parallel(calls: list[tuple[str, bytes, str]]) -> list[Response]:
    barrier = threading.Barrier(len(calls))

    def send(call: tuple[str, bytes, str]) -> Response:
        barrier.wait(60)
        return post(*call)

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(send, calls))


def same(got: dict[str, float], want: dict[str, float]) -> None:
    assert list(got) == list(want)
    assert list(got.values()) == pytest.approx(list(want.values()), abs=1e-5)


def test_the_worker_runs_the_mar_s_own_copy_of_the_package(pod: Pod) -> None:
    (worker,) = get_json(f"{pod.url}/models/{NAME}")[0]["workers"]
    assert psutil.Process(worker["pid"]).cmdline()[0] == str(pod.python)
    log = (pod.log_dir / "model_log.log").read_text()
    assert "micro-batching config:" in log  # the handler's own line: it loaded and ran
    assert "ModuleNotFoundError" not in log


def test_v1_v2_and_plain_requests_in_one_batch_each_get_their_own_answer(pod: Pod) -> None:
    images = [make_jpeg(700 + i, size=(320, 240)) for i in range(12)]
    b64 = [base64.b64encode(image).decode() for image in images]
    reference = [
        json.loads(post(f"{pod.url}/predictions/{NAME}", image, "image/jpeg").body)
        for image in images
    ]
    v1 = f"{pod.url}/v1/models/{NAME}:predict"
    v2 = f"{pod.url}/v2/models/{NAME}/infer"

    def v1_body(*indices: int) -> bytes:
        return json.dumps({"instances": [{"data": b64[i]} for i in indices]}).encode()

    def v2_body(*indices: int, request_id: str) -> bytes:
        tensor = {"name": "image", "shape": [len(indices)], "datatype": "BYTES"}
        return json.dumps(
            {"id": request_id, "inputs": [{**tensor, "data": [b64[i] for i in indices]}]}
        ).encode()

    calls = [(v1, v1_body(i), "application/json") for i in range(6)]  # single-instance
    calls += [
        (v1, v1_body(6, 7, 8), "application/json"),  # multi-instance
        (v2, v2_body(9, request_id="one"), "application/json"),
        (v2, v2_body(10, 11, request_id="two"), "application/json"),
        (f"{pod.url}/predictions/{NAME}", images[0], "image/jpeg"),  # plain, same .mar
        (
            v1,
            json.dumps({"instances": [{"data": "bm90IGFuIGltYWdl"}]}).encode(),
            "application/json",
        ),
        (
            v2,
            json.dumps({"inputs": [{"name": "x", "datatype": "FP32"}]}).encode(),
            "application/json",
        ),
    ]
    answers = parallel(calls)
    assert [a.status for a in answers] == [200] * 10 + [400, 400], [a.body for a in answers]
    bodies = [json.loads(a.body) for a in answers]
    for i in range(6):
        (prediction,) = bodies[i]["predictions"]
        same(prediction, reference[i])
    for got, want in zip(bodies[6]["predictions"], reference[6:9]):
        same(got, want)
    for body, request_id, indices in ((bodies[7], "one", [9]), (bodies[8], "two", [10, 11])):
        assert body["id"] == request_id and body["model_name"] == NAME
        (output,) = body["outputs"]
        assert output["datatype"] == "BYTES" and output["shape"] == [len(indices)]
        for text, i in zip(output["data"], indices):
            same(json.loads(text), reference[i])
    same(bodies[9], reference[0])
    assert "instance 0" in bodies[10]["error"]
    assert "missing" in bodies[11]["error"]


def test_micro_batches_span_requests(pod: Pod) -> None:
    before = urllib.request.urlopen(pod.metrics_url, timeout=10).read().decode()
    images = [make_jpeg(800 + i, size=(320, 240)) for i in range(BATCH)]
    calls = [
        (
            f"{pod.url}/v1/models/{NAME}:predict",
            json.dumps({"instances": [{"b64": base64.b64encode(im).decode()}]}).encode(),
            "application/json",
        )
        for im in images
    ]
    assert [a.status for a in parallel(calls)] == [200] * BATCH
    deadline = time.monotonic() + 30
    summary: dict[str, Any] = {}
    while time.monotonic() < deadline:  # the worker's metric lines reach /metrics later
        after = urllib.request.urlopen(pod.metrics_url, timeout=10).read().decode()
        summary = summarize(after, before, NAME)
        if summary["micro_batches"]:
            break
        threading.Event().wait(0.5)
    # Single-instance requests, micro-batch size 4: more than one request per micro-batch.
    assert summary["mean_micro_batch_size"] > 1, summary


def kserve_sdk(*args: str) -> subprocess.CompletedProcess[str]:
    if not KSERVE_PYTHON.exists():
        pytest.fail(f"{KSERVE_PYTHON} is missing: make kserve-venv")
    return subprocess.run([str(KSERVE_PYTHON), *args], capture_output=True, text=True, timeout=120)


def test_the_manifest_fits_the_kserve_sdk_schema(tmp_path: Path) -> None:
    manifest = DEPLOY / "inferenceservice.yaml"
    checked = kserve_sdk(str(DEPLOY / "check_manifest.py"), str(manifest))
    assert checked.returncode == 0, checked.stderr
    fields = json.loads(checked.stdout)
    assert fields["model_format"] == "pytorch" and fields["runtime_version"] == "0.12.0"
    assert fields["protocol_version"] in ("v1", "v2") and fields["max_replicas"] >= 2
    # The check can fail: a misspelt field is caught.
    misspelt = tmp_path / "misspelt.yaml"
    misspelt.write_text(manifest.read_text().replace("protocolVersion", "protocolVerson"))
    refused = kserve_sdk(str(DEPLOY / "check_manifest.py"), str(misspelt))
    assert refused.returncode != 0 and "protocolVerson: not a field" in refused.stderr


def test_the_kserve_sdk_rest_client_gets_each_image_s_predictions(pod: Pod, tmp_path: Path) -> None:
    images = [make_jpeg(900 + i, size=(320, 240)) for i in range(3)]
    paths = []
    for i, image in enumerate(images):
        paths.append(tmp_path / f"{i}.jpg")
        paths[-1].write_bytes(image)
    reference = [
        json.loads(post(f"{pod.url}/predictions/{NAME}", image, "image/jpeg").body)
        for image in images
    ]
    sent = kserve_sdk(str(DEPLOY / "client_check.py"), pod.url, NAME, *map(str, paths))
    assert sent.returncode == 0, sent.stderr
    answers = json.loads(sent.stdout)
    for got, want in zip(answers["v1"]["predictions"], reference):
        same(got, want)
    assert answers["v2"]["id"] == "sdk-client" and answers["v2"]["model_name"] == NAME
    (texts,) = answers["v2"]["outputs"]
    for text, want in zip(texts, reference):
        same(json.loads(text), want)
