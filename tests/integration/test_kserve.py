"""The KServe pod's data path, everything short of Kubernetes.

TorchServe starts as KServe's TorchServe runtime (``kserve-torchserve``) starts it: the
bundle ``make kserve-bundle`` writes lies at the mount path (the pod's ``/mnt/models``,
mapped to a temp directory the way the mount maps it, and the bundle written for that
path), the working directory is an empty one standing for the image's
``/home/model-server``, the command line is the runtime's ``torchserve --start
--model-store=<mount>/model-store --ts-config=<mount>/config/config.properties`` (plus
``--foreground`` so the test owns the process), the environment is the runtime's
(``TS_SERVICE_ENVELOPE`` as KServe sets it for the manifest's protocol, no ``PYTHONPATH``),
and the ``torchserve`` on the PATH is a Python environment in which ts_microbatch is not
installed: the .mar's own copy of the worker modules is all there is. Nothing is copied
beside the bundle; the only change to its config.properties is its addresses, moved to
free loopback ports (in place, at the mount).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

import psutil
import pytest

from tests.helpers import ROOT
from tests.integration.servers import build, stock_python
from tests.torchserve.images import make_jpeg
from ts_microbatch.tools.ports import free_ports
from ts_microbatch.tools.scrape import summarize
from ts_microbatch.tools.server import LOOPBACK, stop_process_group

KSERVE_PYTHON = Path(ROOT) / ".venv-kserve" / "bin" / "python"  # make kserve-venv
DEPLOY = Path(ROOT) / "deploy" / "kserve"
NAME = "resnet-18_mb"
BATCH = 16
JSON = "application/json"
NOT_AN_IMAGE = base64.b64encode(b"not an image").decode()
# KServe sets TS_SERVICE_ENVELOPE from the runtime's serviceEnvelope label, which it derives
# from the InferenceService's protocolVersion.
ENVELOPES = {"v1": "kserve", "v2": "kservev2"}


def runtime_envelope() -> str:
    """TS_SERVICE_ENVELOPE as KServe sets it for deploy/kserve/inferenceservice.yaml."""
    manifest = (DEPLOY / "inferenceservice.yaml").read_text()
    found = re.search(r"^\s*protocolVersion:\s*(\S+)", manifest, flags=re.M)
    return ENVELOPES[found.group(1) if found else "v1"]


@pytest.fixture(scope="module")
def mount(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundle as `make kserve-bundle` writes it (build_mar.py --self-contained --kserve,
    then ``python -m ts_microbatch.tools.bundle``), lying at <tmp>/mnt/models and written for that
    mount path, as the pod sees it at /mnt/models."""
    work = tmp_path_factory.mktemp("kserve_build")
    mar = build.build_mar(
        work / "staging", model_name=NAME, work_dir=work / "mar", self_contained=True, kserve=True
    )
    mount = work / "mnt" / "models"
    bundle_cli = [sys.executable, "-m", "ts_microbatch.tools.bundle", "--out", str(mount)]
    bundle_cli += ["--mar", str(mar), "--model-name", NAME, "--mount-path", str(mount)]
    bundle_cli += ["--metrics-yaml", str(Path(ROOT) / "configs/metrics.yaml")]
    bundle_cli += ["--batch-size", str(BATCH), "--max-batch-delay", "100"]
    subprocess.run(bundle_cli, check=True, capture_output=True, cwd=work)
    return mount


@pytest.fixture(scope="module")
def python_without_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's Python: this environment's packages without ts_microbatch."""
    return stock_python(tmp_path_factory.mktemp("clean_venv"))


class Pod(NamedTuple):
    url: str
    metrics_url: str
    log_dir: Path
    python: Path
    mount: Path


def runtime_environment(bin_dir: Path, tmp: Path) -> dict[str, str]:
    """This machine's environment standing for the image's, as the runtime sets it:
    TS_SERVICE_ENVELOPE, no PYTHONPATH, nothing else of TorchServe's. TMPDIR only moves
    TorchServe's fixed pid file (/tmp/.model_server.pid) off this machine's other servers."""
    unset = ("PYTHONPATH", "LOG_LOCATION", "METRICS_LOCATION", "TEMP")
    env = {k: v for k, v in os.environ.items() if k not in unset and not k.startswith("TS_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    env["TS_SERVICE_ENVELOPE"] = runtime_envelope()  # config leaves it unread
    env["TMPDIR"] = str(tmp)
    return env


def worker_failed(log_dir: Path) -> bool:
    """A worker raised at load or died: at start, it will never be ready."""
    model_log, ts_log = log_dir / "model_log.log", log_dir / "ts_log.log"
    return (model_log.exists() and "Traceback" in model_log.read_text(errors="replace")) or (
        ts_log.exists() and "Backend worker process died" in ts_log.read_text(errors="replace")
    )


def wait_ready(url: str, process: subprocess.Popen[bytes], log_dir: Path) -> None:
    ready = threading.Event()
    deadline = time.monotonic() + 150  # the model loads from model_snapshot at start
    while time.monotonic() < deadline:
        if process.poll() is not None or worker_failed(log_dir):
            model_log = log_dir / "model_log.log"
            text = model_log.read_text(errors="replace") if model_log.exists() else ""
            raise AssertionError(f"TorchServe or its worker failed:\n{text[-3000:]}")
        try:
            workers = get_json(f"{url}/models/{NAME}")[0]["workers"]
            if workers and all(w["status"] == "READY" for w in workers):
                return
        except OSError:
            pass
        ready.wait(0.25)  # no event to wait on: TorchServe is polled until it is up
    raise AssertionError("the model never became ready")


@pytest.fixture(scope="module")
def pod(
    mount: Path, python_without_package: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pod]:
    ts_config = mount / "config" / "config.properties"
    config = ts_config.read_text()
    port, metrics_port, grpc_inference, grpc_management = free_ports(4)  # distinct
    addresses = {
        "inference_address": f"http://{LOOPBACK}:{port}",
        "management_address": f"http://{LOOPBACK}:{port}",
        "metrics_address": f"http://{LOOPBACK}:{metrics_port}",
        "grpc_inference_port": str(grpc_inference),
        "grpc_management_port": str(grpc_management),
    }
    for key, value in addresses.items():
        config, replaced = re.subn(rf"^{key}=.*$", f"{key}={value}", config, flags=re.M)
        assert replaced == 1, key
    ts_config.write_text(config)
    home = tmp_path_factory.mktemp("home_model_server")  # the image's working directory
    assert not any(home.iterdir())
    command = [
        "torchserve",  # found on the PATH: python_without_package's bin/
        "--start",
        f"--model-store={mount}/model-store",
        f"--ts-config={ts_config}",
        "--foreground",
    ]
    env = runtime_environment(python_without_package.parent, tmp_path_factory.mktemp("tmp"))
    out = tmp_path_factory.mktemp("kserve_out") / "torchserve.out"
    process = subprocess.Popen(
        command,
        cwd=home,
        env=env,
        stdout=open(out, "wb"),  # noqa: SIM115 - owned by the child
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        url = addresses["inference_address"]
        wait_ready(url, process, home / "logs")
        metrics_url = addresses["metrics_address"] + "/metrics"
        yield Pod(url, metrics_url, home / "logs", python_without_package, mount)
    finally:
        stop_process_group(process.pid, 30, process)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


class Answer(NamedTuple):
    status: int
    body: bytes
    request_id: str  # TorchServe's id for the request (x-request-id), as its worker sees it


def post(url: str, body: bytes, content_type: str) -> Answer:
    req = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return Answer(resp.status, resp.read(), resp.headers.get("x-request-id", ""))
    except urllib.error.HTTPError as err:
        return Answer(err.code, err.read(), err.headers.get("x-request-id", ""))


def parallel(calls: list[tuple[str, bytes, str]]) -> list[Answer]:
    barrier = threading.Barrier(len(calls))

    def send(call: tuple[str, bytes, str]) -> Answer:
        barrier.wait(60)
        return post(*call)

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(send, calls))


# The worker's PredictionTime line (ts/service.py, once per frontend batch) names every
# request id of the batch after its timestamp; the frontend logs it to ts_log.log.
PREDICTION_LINE = re.compile(r"\[METRICS\]PredictionTime\.\S*\|#hostname:[^,]*,\d+,(\S+)")


def frontend_batches(log_dir: Path) -> list[set[str]]:
    """The request ids of each frontend batch the worker has run so far."""
    batches = []
    for log in sorted(log_dir.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            found = PREDICTION_LINE.search(line)
            if found:
                batches.append(set(found.group(1).split(",")))
    return batches


def batch_of(log_dir: Path, request_ids: list[str]) -> set[str]:
    """The ids of the frontend batch that held the most of ``request_ids``. The worker
    writes its line before it answers, but the frontend logs it a moment later."""
    wanted = set(request_ids)
    logged: set[str] = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        seen = [b & wanted for b in frontend_batches(log_dir) if b & wanted]
        logged = set().union(*seen)
        if logged == wanted:  # every request's batch is logged
            return max(seen, key=len)
        threading.Event().wait(0.2)
    raise AssertionError(f"no frontend batch logged for {wanted - logged}")


def same(got: dict[str, float], want: dict[str, float]) -> None:
    assert list(got) == list(want)
    assert list(got.values()) == pytest.approx(list(want.values()), abs=1e-5)


def test_the_pod_starts_from_an_empty_working_directory_with_absolute_paths(pod: Pod) -> None:
    # A second check that no relative path slipped in: every *_config / *_path / model_store
    # key of the config.properties TorchServe served from names an absolute path that lies
    # in the bundle (the working directory held nothing; TorchServe wrote only logs/ there).
    config = (pod.mount / "config" / "config.properties").read_text()
    entries = {}
    for line in config.splitlines():
        key, _, value = line.partition("=")
        names_a_path = re.search(r"(_config|_path)$", key) or key == "model_store"
        if names_a_path and value not in ("true", "false"):  # enable_envvars_config: a switch
            entries[key] = value
    assert {"metrics_config", "model_store"} <= set(entries), entries
    for key, value in entries.items():
        assert PurePosixPath(value).is_absolute(), (key, value)
        assert Path(value).is_relative_to(pod.mount) and Path(value).exists(), (key, value)
    assert sorted(p.name for p in pod.log_dir.parent.iterdir()) == ["logs"]


def test_the_worker_runs_the_mar_s_own_copy_of_the_package(pod: Pod) -> None:
    (worker,) = get_json(f"{pod.url}/models/{NAME}")[0]["workers"]
    assert psutil.Process(worker["pid"]).cmdline()[0] == str(pod.python)
    log = (pod.log_dir / "model_log.log").read_text()
    assert "micro-batching config:" in log  # the handler's own line: it loaded and ran
    (config_line,) = [line for line in log.splitlines() if "micro-batching config:" in line]
    assert '"kserve": true' in config_line  # the packed micro_batching.json, as the bundle's
    assert "ModuleNotFoundError" not in log and "MetricsCacheIOError" not in log


def test_v1_v2_and_plain_requests_in_one_batch_each_get_their_own_answer(pod: Pod) -> None:
    images = [make_jpeg(700 + i, size=(320, 240)) for i in range(12)]
    b64 = [base64.b64encode(image).decode() for image in images]
    # Each image alone (one request in flight): the answer every request must get.
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

    calls = [(v1, v1_body(i), JSON) for i in range(6)]  # single-instance
    calls += [
        (v1, v1_body(6, 7, 8), JSON),  # multi-instance
        (v2, v2_body(9, request_id="one"), JSON),
        (v2, v2_body(10, 11, request_id="two"), JSON),
        (f"{pod.url}/predictions/{NAME}", images[0], "image/jpeg"),  # plain, same .mar
        (v1, json.dumps({"instances": [{"data": NOT_AN_IMAGE}]}).encode(), JSON),
        (v2, json.dumps({"inputs": [{"name": "x", "datatype": "FP32"}]}).encode(), JSON),
    ]
    kinds = ["v1"] * 6 + ["v1 x3", "v2", "v2 x2", "plain", "bad v1", "bad v2"]
    shared: list[str] = []
    for _ in range(5):  # arrivals more than maxBatchDelay apart split the batch: retry
        answers = parallel(calls)
        check_answers(answers, reference)
        ids = [a.request_id for a in answers]
        assert all(ids) and len(set(ids)) == len(ids), ids
        together = batch_of(pod.log_dir, ids)
        shared = [kind for kind, request_id in zip(kinds, ids) if request_id in together]
        if set(shared) == set(kinds):
            break
    # The scenario happened: one frontend batch held requests of every kind.
    assert set(shared) == set(kinds), f"no round put every kind in one batch: {shared}"
    assert shared.count("v1") >= 2


def check_answers(answers: list[Answer], reference: list[Any]) -> None:
    """Every answer is the one its request gets alone (the order of ``calls`` above)."""
    assert [a.status for a in answers] == [200] * 10 + [400, 400], [a.body for a in answers]
    bodies = [json.loads(a.body) for a in answers]
    for i in range(6):
        (prediction,) = bodies[i]["predictions"]
        same(prediction, reference[i])
    assert len(bodies[6]["predictions"]) == 3
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
