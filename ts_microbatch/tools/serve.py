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


def _port(url: str) -> int:
    port = urllib.parse.urlparse(url).port
    if port is None:
        raise TorchServeError(f"no port in address {url!r}")
    return port


def server_from_config(config: Path, model_store: Path, token_auth: bool) -> TorchServe:
    props = read_properties(config)
    if os.environ.get(PORTS_ENV):
        inference, management, metrics = (int(p) for p in os.environ[PORTS_ENV].split(","))
    else:
        inference, management, metrics = (
            _port(props[k]) for k in ("inference_address", "management_address", "metrics_address")
        )
    return TorchServe(
        model_store=model_store,
        workdir=WORKDIR,
        base_config=config,
        ports=(inference, management, metrics),
        token_auth=token_auth,
    )


def start(args: argparse.Namespace) -> int:
    token_auth = args.token_auth.lower() not in ("off", "false", "0", "no")
    server = server_from_config(Path(args.config), Path(args.model_store), token_auth)
    if args.async_fix:
        # The Java agent fixing 0.12.0's asynchronous frontend (ts_microbatch/agent/README.md),
        # after any JVM options the config already passes.
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
    model_name = Path(args.mar).stem
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
        print(
            f"Registration failed: {resp.status} {resp.body.decode(errors='replace')}",
            file=sys.stderr,
        )
        print(
            "Last lines of the model log:\n" + "\n".join(server.log().splitlines()[-25:]),
            file=sys.stderr,
        )
        server.stop()
        return 1
    answer = server.predict(model_name, Path(args.input).read_bytes())
    print(
        f"\nPOST {server.inference_url}/predictions/{model_name} ({args.input}) -> {answer.status}"
    )
    print(json.dumps(answer.json(), indent=2))
    auth = ""
    if token_auth:
        auth = (
            " -H \"Authorization: Bearer $(python3 -c 'import json;print(json.load(open("
            f'"{server.workdir / "key_file.json"}"))["inference"]["key"])\')"'
        )
    print(
        f"\nTorchServe is running: inference {server.inference_url}, management "
        f"{server.management_url}, metrics {server.metrics_url}"
    )
    print(f"Try: curl{auth} -T {args.input} {server.inference_url}/predictions/{model_name}")
    print(
        "Pipeline metrics: python -m ts_microbatch.tools.scrape "
        f"{server.metrics_url}/metrics --model {model_name} --interval 10  (or: make metrics)"
    )
    print("Stop it with: make stop")
    return 0 if answer.status == 200 else 1


def stop(_: argparse.Namespace) -> int:
    server = TorchServe(model_store=Path("."), workdir=WORKDIR, ports=(0, 0, 0))
    if not server.pid_file.exists():
        print("No TorchServe started by `make serve` is running.")
        return 0
    try:
        server.stop()  # only the process group its pid file records, verified first
    except StalePidFileError as exc:
        print(f"No TorchServe started by `make serve` is running: {exc}")
        return 0
    except PidFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("TorchServe stopped.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("ts_microbatch.tools.serve"), description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "start", help="start TorchServe, register a model, send one request", epilog=SAFE_BESIDE
    )
    p.add_argument("--mar", required=True, help="file name of the .mar in the model store")
    p.add_argument("--input", "--image", required=True, help="file to send as the sample request")
    p.add_argument("--model-store", default="model_store")
    p.add_argument("--config", default="configs/config.properties")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-batch-delay", type=int, default=50, help="milliseconds")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument(
        "--token-auth",
        default=os.environ.get("TOKEN_AUTH", "on"),
        help="on (default) or off; off only for a server on 127.0.0.1",
    )
    p.add_argument(
        "--async-fix",
        action="store_true",
        help="load the agent that fixes TorchServe 0.12.0's asynchronous frontend "
        "(vmargs=-javaagent:..., ts_microbatch/agent/README.md)",
    )
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
