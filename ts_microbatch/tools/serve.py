"""`make serve` / `make stop`: a local TorchServe with one model, answering one request.

    ts-microbatch-serve start --mar my_model.mar --input sample.json --model-store .
    ts-microbatch-serve stop      # from the same directory: its state is ./logs/torchserve

Without ``--config`` the server runs with the package's defaults (``DEFAULT_PROPERTIES``,
Prometheus metrics) on 127.0.0.1:8080-8082, TorchServe's own (``TS_MICROBATCH_PORTS`` names
others: ``inference,management,metrics``); a port taken is an error naming it. The model is
registered with its .mar's batchSize and maxBatchDelay unless the flags say otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
from pathlib import Path

from .. import agent
from ._cli import prog
from .mar import frontend_of
from .ports import listening
from .processes import PidFileError, StalePidFileError
from .server import DEFAULT_PROPERTIES, TorchServe, TorchServeError, read_properties

# Overridable so that tests can run the README commands verbatim on free ports.
WORKDIR = Path(os.environ.get("TS_MICROBATCH_WORKDIR", "logs/torchserve"))
PORTS_ENV = "TS_MICROBATCH_PORTS"  # "inference,management,metrics"
_ADDRESSES = ("inference_address", "management_address", "metrics_address")
DEFAULT_PORTS = (8080, 8081, 8082)  # TorchServe's own


def _port(url: str) -> int:
    port = urllib.parse.urlparse(url).port
    if port is None:
        raise TorchServeError(f"no port in address {url!r}")
    return port


def server_from_config(config: Path | None, model_store: Path, token_auth: bool) -> TorchServe:
    """A TorchServe on ``config``'s addresses (8080-8082 without one, or TS_MICROBATCH_PORTS);
    without ``config``, on the package's defaults."""
    if os.environ.get(PORTS_ENV):
        ports = [int(p) for p in os.environ[PORTS_ENV].split(",")]
    elif config is not None:
        ports = [_port(read_properties(config)[k]) for k in _ADDRESSES]
    else:
        ports = list(DEFAULT_PORTS)
    inference, management, metrics = ports
    properties = {} if config else {**DEFAULT_PROPERTIES, "metrics_mode": "prometheus"}
    return TorchServe(
        model_store,
        WORKDIR,
        config,
        (inference, management, metrics),
        token_auth=token_auth,
        properties=properties,
    )


def _fail(server: TorchServe, status: int, body: bytes) -> int:
    print(f"Registration failed: {status} {body.decode(errors='replace')}", file=sys.stderr)
    last = "\n".join(server.log().splitlines()[-25:])
    print(f"Last lines of the model log:\n{last}", file=sys.stderr)
    server.stop()
    return 1


def start(args: argparse.Namespace) -> int:
    token_auth = args.token_auth.lower() not in ("off", "false", "0", "no")
    config = Path(args.config) if args.config else None
    server = server_from_config(config, Path(args.model_store), token_auth)
    if args.async_fix:  # the Java agent fixing 0.12.0's asynchronous frontend (agent/README.md)
        if agent.missing():
            raise TorchServeError(agent.missing() or "")
        existing = read_properties(config).get("vmargs", "") if config else ""
        server.properties["vmargs"] = agent.vmargs(existing)
    try:
        server.stop()  # a server left by an earlier `make serve`
    except PidFileError as exc:  # nothing was signalled; a server still there keeps its ports
        print(f"warning: {exc}", file=sys.stderr)
    # Another server there would answer /ping for ours and get our model registered.
    roles = ("inference", "management", "metrics")
    taken = [f"{port} ({role})" for role, port in zip(roles, server.ports or ()) if listening(port)]
    if taken:
        raise TorchServeError(
            f"port {', '.join(taken)} taken: another server listens there. Stop it, or give "
            f"--config a config.properties with free addresses, or set {PORTS_ENV}="
            "<inference>,<management>,<metrics>"
        )
    print(f"Starting TorchServe (logs in {server.log_dir}) ...", flush=True)
    server.start()
    model_name, url = Path(args.mar).stem, server.inference_url
    mar = Path(args.mar) if Path(args.mar).is_absolute() else Path(args.model_store) / args.mar
    frontend = frontend_of(mar, args.batch_size, args.max_batch_delay)
    print(
        f"Registering {args.mar}: batch_size={frontend['batchSize']} "
        f"max_batch_delay={frontend['maxBatchDelay']} ms ...",
        flush=True,
    )
    resp = server.register(
        args.mar,
        batch_size=frontend["batchSize"],
        max_batch_delay_ms=frontend["maxBatchDelay"],
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
        f"Pipeline metrics: {prog('ts_microbatch.tools.scrape')} "
        f"{server.metrics_url}/metrics --model {model_name} --interval 10"
    )
    print(f"Stop it with: {prog('ts_microbatch.tools.serve')} stop (from {Path.cwd()})")
    return 0 if answer.status == 200 else 1


def stop(_: argparse.Namespace) -> int:
    server = TorchServe(model_store=Path("."), workdir=WORKDIR, ports=(0, 0, 0))
    none = f"No TorchServe started from this directory is running (none in {server.workdir})"
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
    beside = (
        "Safe beside a running TorchServe: it listens on --config's addresses (8080-8082 "
        "without one) and takes free gRPC ports, a block of worker ports no other server uses "
        "and a temp directory of its own for the worker sockets, so it never takes over "
        "another server's workers."
    )
    p = sub.add_parser("start", help=what, epilog=beside)
    p.add_argument("--mar", required=True, help="file name of the .mar in the model store")
    p.add_argument("--input", "--image", required=True, help="file to send as the sample request")
    p.add_argument("--model-store", default="model_store")
    what = "a config.properties whose addresses it listens on (default: the package's "
    what += "defaults on 127.0.0.1:8080-8082)"
    p.add_argument("--config", help=what)
    p.add_argument("--batch-size", type=int, help="default: the .mar's batchSize, else 32")
    what = "milliseconds; default: the .mar's maxBatchDelay, else 50"
    p.add_argument("--max-batch-delay", type=int, help=what)
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
