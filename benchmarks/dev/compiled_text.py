#!/usr/bin/env python3
"""Compiled BERT with sequence-length buckets through a real TorchServe (issue #19): what
warm-up costs, whether anything compiles after it, and compiled against eager.

The BERT example (examples/bert_classifier, untrained 4 x 256 model made here) packed twice
(three times with ``--frozen``):
``compiled`` with benchmarks/dev/bert_compiled.yaml (``pt2:`` inductor, dynamic=False;
allowed sizes [2, 8, 32] x buckets [64, 256, 512], order by length, 2,048 tokens per
micro-batch, warm-up of the grid), and ``eager``, the same config without ``pt2:`` (it pads
to the same buckets); with ``--frozen`` also ``frozen``, the compiled config with inductor's
``freezing``. One TorchServe serves them all, its TORCHINDUCTOR_CACHE_DIR a new empty
directory, so the compiled model compiles from scratch; TORCH_LOGS=recompiles makes Dynamo
log every recompile, with its reason, into the model log.

1. Register ``compiled`` (synchronous POST /models: the time is the warm-up) and send ONE
   request, alone: the first request after ready. Then one lone request of each other
   bucket, the first of its shape. The same for ``eager``.
2. Rounds of the corpus (ts_microbatch.tools.drive: ``--requests`` bodies in its fixed order
   from ``--concurrency`` clients), the models in turn (the order alternates per round):
   throughput, P50/P99, and from /metrics the recompiles, padding and useful-token share.
3. The same lone requests again, ``--lone`` times each: the steady-state latency the first
   request is compared with (a lone request waits the frontend's maxBatchDelay, both times).
4. Recompiles after warm-up: MicroBatchRecompiles over everything after registration, and
   the model log's recompile lines (Dynamo's and the pipeline's) after registration.

    python benchmarks/dev/compiled_text.py --corpus /tmp/text_corpora/long_tail --rounds 5 \\
        --frozen --out benchmarks/dev/results/compiled_text

writes results.json and model_log_excerpt.txt (warm-up and compile lines) into ``--out``.
The corpus: ``benchmarks/text_lengths.py corpus`` (docs/compiled.md has the command).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE.parent), str(ROOT), str(ROOT / "examples" / "bert_classifier")]

import bench_lib  # noqa: E402
import build_mar  # noqa: E402

from ts_microbatch.tools.corpus import Body, Corpus, read_corpus  # noqa: E402
from ts_microbatch.tools.drive import send_corpus  # noqa: E402
from ts_microbatch.tools.scrape import parse_prometheus, summarize  # noqa: E402
from ts_microbatch.tools.server import TorchServe  # noqa: E402

CONFIG = HERE / "bert_compiled.yaml"
VARIANTS = ("compiled", "eager")
# --frozen: also the compiled config with inductor's freezing (weights folded in as
# constants, prepacked for the CPU's matmul kernels; TorchServe's CPU guidance turns it on).
FROZEN = {"freezing": True}
TIMEOUT_S = 1500  # registration: the warm-up compiles before POST /models returns
# Lines of the model log that say something compiled on the request path: Dynamo's own
# (TORCH_LOGS=recompiles, and the recompile-limit warning) and the pipeline's.
RECOMPILE_LINES = re.compile(
    r"Recompiling function|recompile_limit reached|hit config\.recompile_limit|"
    r"recompiled on the request path"
)
WARMUP_LINES = re.compile(
    r"warm-up of sizes .* took [\d.]+ s|warm-up compiled \d+ graphs.*|"
    r"recompile_limit raised from \d+ to \d+"
)


def variant_config(variant: str) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    if variant == "eager":
        del config["pt2"]
    elif variant == "frozen":
        config["pt2"]["compile"]["options"] = FROZEN
    return config


def build(work: Path, weights: str | None, variants: tuple[str, ...]) -> Path:
    """The .mar files in ``work/store``, from one model directory; returns that directory."""
    model = build_mar.make_model_dir(work / "model", weights)
    for variant in variants:
        config = work / f"{variant}.yaml"
        config.write_text(yaml.safe_dump(variant_config(variant), sort_keys=False))
        build_mar.build_mar(
            work / "store",
            model_name=f"bert_{variant}",
            weights=model,
            work_dir=work / f"build-{variant}",
            model_config=config,
            archive_format="zip-store",
        )
    return model


def bucket_of(length: int, buckets: list[int]) -> int | None:
    return next((b for b in buckets if b >= length), None)


def token_lengths(corpus: Corpus, model: Path) -> list[int]:
    """Each body's token count as the handler's item_length counts it ([CLS] and [SEP])."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = [b.data.decode("utf-8") for b in corpus.bodies]
    return [len(ids) for ids in tokenizer(texts)["input_ids"]]


def lone_bodies(corpus: Corpus, lengths: list[int], buckets: list[int]) -> list[dict[str, Any]]:
    """Per bucket, the body of median length among the corpus's bodies in it; the
    shortest bucket first (its body is the first request)."""
    chosen = []
    for bucket in buckets:
        members = sorted(
            (length, i) for i, length in enumerate(lengths) if bucket_of(length, buckets) == bucket
        )
        if members:
            length, i = members[(len(members) - 1) // 2]
            chosen.append({"bucket": bucket, "tokens": length, "body": corpus.bodies[i]})
    return chosen


def timed_predict(server: TorchServe, model: str, body: Body) -> float:
    sent = time.monotonic()
    answer = server.predict(model, body.data, timeout_s=300, content_type=body.content_type)
    elapsed_ms = 1000 * (time.monotonic() - sent)
    if answer.status != 200:
        raise RuntimeError(f"{model} {body.name}: {answer.status} {answer.body!r}")
    return elapsed_ms


def register(server: TorchServe, variant: str, lone: list[dict[str, Any]]) -> dict[str, Any]:
    """Registers ``variant`` (the warm-up runs before it returns), then one lone request of
    each bucket's body, the shortest first: the first requests after ready."""
    model = f"bert_{variant}"
    log_from = len(server.log())
    started = time.monotonic()
    resp = server.register(
        f"{model}.mar", batch_size=32, max_batch_delay_ms=50, timeout_s=TIMEOUT_S
    )
    register_s = time.monotonic() - started
    if resp.status != 200:
        raise RuntimeError(f"register {model}: {resp.status} {resp.body!r}\n{server.log()[-3000:]}")
    loaded = server.log()[log_from:]
    first_ms = {str(b["bucket"]): timed_predict(server, model, b["body"]) for b in lone}
    return {
        "register_s": register_s,
        "warmup_log": WARMUP_LINES.findall(loaded),
        "warmup_recompile_lines": len(re.findall(r"Recompiling function", loaded)),
        "first_request_ms": first_ms[str(lone[0]["bucket"])],
        "first_per_bucket_ms": first_ms,
        "to_first_answer_s": register_s + first_ms[str(lone[0]["bucket"])] / 1000,
        "log_offset_after_registration": log_from + len(loaded),
    }


def mix_run(server: TorchServe, variant: str, corpus: Corpus, args: Any, label: str) -> dict:
    model = f"bert_{variant}"
    before, cpu_before = server.scrape_metrics(), bench_lib.cpu_seconds(server)
    summary, latency = send_corpus(
        f"{server.inference_url}/predictions/{model}",
        corpus,
        args.requests,
        args.concurrency,
        token=server.token("inference"),
        timeout_s=300,
        label=label,
        progress=bench_lib.log,
    )
    time.sleep(2)  # the worker's metric lines reach the frontend asynchronously
    pipeline = summarize(server.scrape_metrics(), before, model)
    cpu = bench_lib.cpu_seconds(server)
    cpu_ms = {k: 1000 * (cpu[k] - cpu_before[k]) / args.requests for k in cpu}
    return {
        "requests_per_s": summary["requests_per_s"],
        **latency,
        "statuses": summary["statuses"],
        "recompiles": pipeline["recompiles"],
        "mean_batch_size": pipeline["mean_batch_size"],
        "mean_micro_batch_size": pipeline["mean_micro_batch_size"],
        "micro_batches_per_batch": pipeline["micro_batches_per_batch"],
        "padded_share": pipeline["padded_share"],
        "useful_token_share": pipeline["useful_token_share"],
        "inference_ms": pipeline["stage_ms"]["inference"],
        "worker_cpu_ms_per_request": cpu_ms["workers"],
    }


def lone_later(server: TorchServe, variant: str, lone: list[dict[str, Any]], n: int) -> dict:
    model = f"bert_{variant}"
    out = {}
    for b in lone:
        times = [timed_predict(server, model, b["body"]) for _ in range(n)]
        out[str(b["bucket"])] = {"p50_ms": statistics.median(times), "ms": times}
    return out


def recompiles_after_registration(
    server: TorchServe, variant: str, first: dict[str, Any], scrape_at_ready: str
) -> dict[str, Any]:
    """MicroBatchRecompiles since just after registration, whether the metric exists at
    all on /metrics, and the model's own recompile lines in the model log since then
    (Dynamo's and ours; the log is shared, so only lines of this model's worker count:
    a model registered later warms up in the same file)."""
    now = server.scrape_metrics()
    present = any(
        s.name.startswith("MicroBatchRecompiles") and s.labels.get("ModelName") == f"bert_{variant}"
        for s in parse_prometheus(now)
    )
    lines = [
        line
        for line in server.log()[first["log_offset_after_registration"] :].splitlines()
        if RECOMPILE_LINES.search(line) and f"-bert_{variant}_" in line
    ]
    return {
        "metric": summarize(now, scrape_at_ready, f"bert_{variant}")["recompiles"],
        "metric_present": present,
        "log_lines": len(lines),
        "log_examples": lines[:5],
    }


def serve(work: Path, corpus: Corpus, lone: list[dict[str, Any]], args: Any) -> dict[str, Any]:
    """Everything that needs TorchServe, in one server; returns the measurements."""
    cache = work / "inductor"  # new and empty: the compiled model compiles from scratch
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache), "TORCH_LOGS": "recompiles"}
    server = bench_lib.project_server(work / "store", work / "server", env=env)
    first: dict[str, Any] = {}
    at_ready: dict[str, str] = {}
    runs: list[dict[str, Any]] = []
    began = time.monotonic()
    try:
        server.start()
        for variant in args.variants:
            bench_lib.log(f"{variant}: registering (warm-up; inductor cache {cache}, empty)")
            at_ready[variant] = server.scrape_metrics()
            first[variant] = register(server, variant, lone)
            bench_lib.log(f"{variant}: {first[variant]}")
        for round_ in range(1, args.rounds + 1):
            order = args.variants if round_ % 2 else args.variants[::-1]
            for variant in order:
                label = f"round {round_} {variant}"
                run = mix_run(server, variant, corpus, args, label)
                runs.append({"variant": variant, "round": round_, **run})
                bench_lib.log(f"{label}: {run}")
        later = {v: lone_later(server, v, lone, args.lone) for v in args.variants}
        time.sleep(2)
        recompiles = {
            v: recompiles_after_registration(server, v, first[v], at_ready[v])
            for v in args.variants
        }
        log = server.log()
        (work / "model_log.log").write_text(log)
    finally:
        server.stop()
    return {
        "first": first,
        "runs": runs,
        "lone_later": later,
        "recompiles_after_registration": recompiles,
        "torchserve_s": time.monotonic() - began,
        "log_excerpt": excerpt(log),
    }


EXCERPT_LINES = re.compile(
    r"warm-up|recompile_limit|Recompiling function|size mismatch|pt2: torch.compile|"
    r"recompiled on the request path"
)
WORKER_PREFIX = re.compile(r"^(\S+) \[[A-Z]+ *\] (W-\d+-\S+?)-std(?:out|err) MODEL_LOG - ")


def excerpt(log: str) -> str:
    """The model log's lines about warm-up and compiles, each with its time and worker."""
    lines = (WORKER_PREFIX.sub(r"\1 \2 ", line) for line in log.splitlines())
    return "".join(f"{line[:260]}\n" for line in lines if EXCERPT_LINES.search(line))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=Path("/tmp/text_corpora/long_tail"))
    parser.add_argument("--requests", type=int, default=400, help="per run of the mix")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lone", type=int, default=5, help="later lone requests per bucket")
    parser.add_argument("--weights", default=None, help="a save_pretrained BERT directory")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--frozen", action="store_true", help="also compiled with freezing")
    parser.add_argument("--dry-run", action="store_true", help="build and pick bodies only")
    args = parser.parse_args()
    args.variants = VARIANTS + (("frozen",) if args.frozen else ())
    work = bench_lib.scratch_dir("compiled_text_")
    bench_lib.log(f"work directory {work}")
    model = build(work, args.weights, args.variants)
    corpus = read_corpus(args.corpus)
    lengths = token_lengths(corpus, model)
    buckets = variant_config("compiled")["micro_batching"]["allowed_sequence_lengths"]
    lone = lone_bodies(corpus, lengths, buckets)
    described = describe_corpus(corpus, lengths, buckets, lone)
    bench_lib.log(f"corpus: {described}")
    if args.dry_run:
        return 0
    measured = serve(work, corpus, lone, args)
    log_excerpt = measured.pop("log_excerpt")
    bench_lib.save_json(work, "measured.json", measured)  # kept if the report fails
    report = report_of(measured, described, args)
    bench_lib.save_json(args.out, "results.json", report)
    if args.out is not None:
        (args.out / "model_log_excerpt.txt").write_text(log_excerpt)
    return 0


def describe_corpus(
    corpus: Corpus, lengths: list[int], buckets: list[int], lone: list[dict[str, Any]]
) -> dict[str, Any]:
    per_bucket = {str(b): sum(bucket_of(n, buckets) == b for n in lengths) for b in buckets}
    return {
        "label": corpus.label,
        "tokens": {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)},
        "bodies_per_bucket": per_bucket,
        "over_the_largest_bucket": sum(bucket_of(n, buckets) is None for n in lengths),
        "lone_bodies": [
            {"bucket": b["bucket"], "tokens": b["tokens"], "name": b["body"].name} for b in lone
        ],
    }


def report_of(measured: dict[str, Any], corpus: dict[str, Any], args: Any) -> dict[str, Any]:
    runs = measured["runs"]
    medians = {}
    for variant in args.variants:
        rows = [r for r in runs if r["variant"] == variant]
        medians[variant] = {
            key: statistics.median(r[key] for r in rows)
            for key in ("requests_per_s", "p50_ms", "p99_ms", "inference_ms", "useful_token_share")
        }
        medians[variant]["recompiles_per_round"] = [r["recompiles"] for r in rows]
        medians[variant]["statuses"] = [r["statuses"] for r in rows]
    ratios = ratios_to_eager(runs, args)
    first, later = measured["first"], measured["lone_later"]
    bucket = str(corpus["lone_bodies"][0]["bucket"])
    print("variant | register s | first request ms | later lone P50 ms | req/s | P50 | P99")
    for v in args.variants:
        m = medians[v]
        print(
            f"{v} | {first[v]['register_s']:.1f} | {first[v]['first_request_ms']:.0f} | "
            f"{later[v][bucket]['p50_ms']:.0f} | {m['requests_per_s']:.1f} | "
            f"{m['p50_ms']:.0f} | {m['p99_ms']:.0f} | recompiles {m['recompiles_per_round']}"
        )
    print(f"recompiles after registration: {measured['recompiles_after_registration']}")
    for r in ratios:
        print(
            f"round {r['round']}: {r['variant']} / eager throughput {r['throughput']:.2f}x, "
            f"P50 {r['p50']:.2f}x, P99 {r['p99']:.2f}x"
        )
    return {
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "machine": bench_lib.machine_info(),
        "settings": {
            "config": variant_config("compiled"),
            "eager": "the same config without pt2",
            "frozen": "with --frozen: the same config, pt2.compile.options " + str(FROZEN),
            "variants": list(args.variants),
            "requests": args.requests,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "lone_repeats": args.lone,
            "weights": args.weights or "untrained (4 x 256, made by build_mar.py)",
            "inductor_cache": "a new empty TORCHINDUCTOR_CACHE_DIR: compiled from scratch",
        },
        "corpus": corpus,
        "first_requests": first,
        "lone_later": later,
        "recompiles_after_registration": measured["recompiles_after_registration"],
        "medians": medians,
        "ratios_to_eager": ratios,
        "runs": runs,
        "torchserve_s": measured["torchserve_s"],
    }


def ratios_to_eager(runs: list[dict[str, Any]], args: Any) -> list[dict[str, Any]]:
    """Each compiled variant against eager within each round (the machine is shared)."""
    ratios = []
    for round_ in range(1, args.rounds + 1):
        got = {r["variant"]: r for r in runs if r["round"] == round_}
        eager = got["eager"]
        for variant in (v for v in args.variants if v != "eager"):
            ratios.append(
                {
                    "round": round_,
                    "variant": variant,
                    **{
                        name: got[variant][key] / eager[key]
                        for name, key in (
                            ("throughput", "requests_per_s"),
                            ("p50", "p50_ms"),
                            ("p99", "p99_ms"),
                            ("inference_ms", "inference_ms"),
                        )
                    },
                }
            )
    return ratios


if __name__ == "__main__":
    raise SystemExit(main())
