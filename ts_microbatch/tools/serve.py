"""`make serve` / `make stop`: a local TorchServe with one model, answering one request.

python -m ts_microbatch.tools.serve start --mar resnet-18_mb.mar --input kitten.jpg
python -m ts_microbatch.tools.serve stop
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
from pathlib import Path

from .. import agent
from ._cli import SAFE_BESIDE, prog
from .processes import PidFileError, StalePidFileError
from .server import TorchServe, TorchServeError, read_properties

# Overridable so that tests can run the README commands verbatim on free ports.
WORKDIR = Path(os.environ.get("TS_MICROBATCH_WORKDIR", "logs/torchserve"))
PORTS_ENV = "TS_MICROBATCH_PORTS"  # "inference,management,metrics"
_ADDRESSES = ("inference_address", "management_address", "metrics_address")


def _port(url: str) -> int:
    port = urllib.parse.urlparse(url).port
    if port is None:
        raise TorchServeError(f"no port in address {url!r}")
    return port


def server_from_config(config: Path, model_store: Path, token_auth: bool) -> TorchServe:
    if os.environ.get(PORTS_ENV):
        ports = [int(p) for p in os.environ[PORTS_ENV].split(",")]
    else:
        ports = [_port(read_properties(config)[k]) for k in _ADDRESSES]
    inference, management, metrics = ports
    return TorchServe(
        model_store, WORKDIR, config, (inference, management, metrics), token_auth=token_auth
    )


def _fail(server: TorchServe, status: int, body: bytes) -> int:
    print(f"Registration failed: {status} {body.decode(errors='replace')}", file=sys.stderr)
    last = "\n".join(server.log().splitlines()[-25:])
    print(f"Last lines of the model log:\n{last}", file=sys.stderr)
    server.stop()
    return 1


def start(args: argparse.Namespace) -> int:
    token_auth = args.token_auth.lower() not in ("off", "false", "0", "no")
    server = server_from_config(Path(args.config), Path(args.model_store), token_auth)
    if args.async_fix:  # the Java agent fixing 0.12.0's asynchronous frontend (agent/README.md)
        if agent.missing():
            raise TorchServeError(agent.missing() or "")
        existing = read_properties(Path(args.config)).get("vmargs", "")
        server.properties["vmargs"] = agent.vmargs(existing)
    try:
        server.stop()  # a server left by an earlier `make serve`
    except PidFileError as exc:  # nothing was signalled; a server still there keeps its ports
        print(f"warning: {exc}", file=sys.stderr)
    print(f"Starting TorchServe (logs in {server.log_dir}) ...", flush=True)
    server.start()
    model_name, url = Path(args.mar).stem, server.inference_url
    print(
        f"Registering {args.mar}: batch_size={args.batch_size} "
        f"max_batch_delay={args.max_batch_delay} ms ...",
        flush=True,
    )
    resp = server.register(
        args.mar,
        batch_size=args.batch_size,
        max_batch_delay_ms=args.max_batch_delay,
        initial_workers=args.workers,
    )
    if resp.status != 200:
        return _fail(server, resp.status, resp.body)
    answer = server.predict(model_name, Path(args.input).read_bytes())
    print(f"\nPOST {url}/predictions/{model_name} ({args.input}) -> {answer.status}")
    print(json.dumps(answer.json(), indent=2))
    key_file = server.workdir / "key_file.json"
    key = f'import json;print(json.load(open("{key_file}"))["inference"]["key"])'
    auth = f" -H \"Authorization: Bearer $(python3 -c '{key}')\"" if token_auth else ""
    print(
        f"\nTorchServe is running: inference {url}, management "
        f"{server.management_url}, metrics {server.metrics_url}"
    )
    print(f"Try: curl{auth} -T {args.input} {url}/predictions/{model_name}")
    print(
        "Pipeline metrics: python -m ts_microbatch.tools.scrape "
        f"{server.metrics_url}/metrics --model {model_name} --interval 10  (or: make metrics)"
    )
    print("Stop it with: make stop")
    return 0 if answer.status == 200 else 1


def stop(_: argparse.Namespace) -> int:
    server = TorchServe(model_store=Path("."), workdir=WORKDIR, ports=(0, 0, 0))
    none = "No TorchServe started by `make serve` is running"
    if not server.pid_file.exists():
        print(f"{none}.")
        return 0
    try:
        server.stop()  # only the process group its pid file records, verified first
    except StalePidFileError as exc:
        print(f"{none}: {exc}")
        return 0
    except PidFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("TorchServe stopped.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("ts_microbatch.tools.serve"), description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    what = "start TorchServe, register a model, send one request"
    p = sub.add_parser("start", help=what, epilog=SAFE_BESIDE)
    p.add_argument("--mar", required=True, help="file name of the .mar in the model store")
    p.add_argument("--input", "--image", required=True, help="file to send as the sample request")
    p.add_argument("--model-store", default="model_store")
    p.add_argument("--config", default="configs/config.properties")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-batch-delay", type=int, default=50, help="milliseconds")
    p.add_argument("--workers", type=int, default=1)
    what = "on (default) or off; off only for a server on 127.0.0.1"
    p.add_argument("--token-auth", default=os.environ.get("TOKEN_AUTH", "on"), help=what)
    what = "load the agent that fixes TorchServe 0.12.0's asynchronous frontend "
    what += "(vmargs=-javaagent:..., ts_microbatch/agent/README.md)"
    p.add_argument("--async-fix", action="store_true", help=what)
    p.set_defaults(func=start)
    sub.add_parser("stop", help="stop the TorchServe started by start").set_defaults(func=stop)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except TorchServeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
