"""Config validation: every bad value is refused with a message naming the key."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.core.fakes import FakeHandler
from ts_microbatch import (
    ConfigError,
    MicroBatching,
    MicroBatchingConfig,
    Parallelism,
    Pipeline,
    load_config,
)
from ts_microbatch.core.autosize import AutoMicroBatchSize
from ts_microbatch.core.config import check_micro_batch_size


def test_defaults_work() -> None:
    config = MicroBatchingConfig()
    assert config.micro_batch_size == 1
    assert config.parallelism == Parallelism(1, 1, 1)
    assert config.isolate_failures is True and config.timeout_s is None


def test_reference_format_is_read() -> None:
    config = MicroBatchingConfig.from_mapping(
        {"micro_batch_size": 4, "parallelism": {"preprocess": 2, "inference": 1, "postprocess": 2}}
    )
    assert config.micro_batch_size == 4
    assert config.parallelism.as_dict() == {"preprocess": 2, "inference": 1, "postprocess": 2}


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        (
            {"micro_batch_size": 0},
            "micro_batching.micro_batch_size: got 0, expected an integer >= 1",
        ),
        ({"micro_batch_size": -3}, "micro_batching.micro_batch_size: got -3"),
        ({"micro_batch_size": "4"}, "micro_batching.micro_batch_size: got '4'"),
        ({"micro_batch_size": True}, "micro_batching.micro_batch_size: got True"),
        ({"micro_batch_size": 2.0}, "micro_batching.micro_batch_size: got 2.0"),
        (
            {"parallelism": {"inference": 0}},
            "micro_batching.parallelism.inference: got 0, expected an integer >= 1",
        ),
        ({"parallelism": {"decode": 2}}, "micro_batching.parallelism.decode: unknown key"),
        (
            {"parallelism": [1, 2, 3]},
            "micro_batching.parallelism: got [1, 2, 3], expected a mapping",
        ),
        (
            {"micro_batch_sise": 4},
            "micro_batching.micro_batch_sise: unknown key; allowed keys are micro_batch_size",
        ),
        ({"max_queued_micro_batches": 0}, "micro_batching.max_queued_micro_batches: got 0"),
        (
            {"isolate_failures": "yes"},
            "micro_batching.isolate_failures: got 'yes', expected true or false",
        ),
        ({"timeout_s": 0}, "micro_batching.timeout_s: got 0, expected a number > 0 or null"),
        ({"timeout_s": float("nan")}, "micro_batching.timeout_s: got nan"),
        (
            {"join_timeout_s": None},
            "micro_batching.join_timeout_s: got None, expected a number > 0",
        ),
        (
            {"metrics_interval_s": -1},
            "micro_batching.metrics_interval_s: got -1, expected a number of seconds from 0",
        ),
        ({"metrics_interval_s": "1s"}, "micro_batching.metrics_interval_s: got '1s'"),
        (
            {"intra_op_threads": {"preprocess": 0}},
            "micro_batching.intra_op_threads.preprocess: got 0, expected an integer >= 1 or null",
        ),
        (
            {"intra_op_threads": {"inference": "all"}},
            "micro_batching.intra_op_threads.inference: got 'all'",
        ),
        (
            {"intra_op_threads": {"decode": 1}},
            "micro_batching.intra_op_threads.decode: unknown key",
        ),
        ({"intra_op_threads": 1}, "micro_batching.intra_op_threads: got 1, expected a mapping"),
        (
            {"max_window_ms": -1},
            "micro_batching.max_window_ms: got -1, expected a number of milliseconds >= 0",
        ),
        ({"max_window_ms": None}, "micro_batching.max_window_ms: got None"),
        (
            {"max_latency_ms": "200ms"},
            "micro_batching.max_latency_ms: got '200ms', expected a number of milliseconds > 0 "
            "or null",
        ),
        ({"max_latency_ms": float("inf")}, "micro_batching.max_latency_ms: got inf"),
        ({"max_latency_ms": 0}, "micro_batching.max_latency_ms: got 0"),
    ],
)
def test_bad_values_name_the_key(mapping: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        MicroBatchingConfig.from_mapping(mapping)
    assert message in str(info.value)


def test_keys_without_effect_are_those_of_continuous_batching_set_off_their_defaults() -> None:
    # Continuous micro-batching was removed; its keys still load (and are checked above).
    assert MicroBatchingConfig().keys_without_effect() == []
    assert MicroBatchingConfig.from_mapping({"max_window_ms": 5}).keys_without_effect() == []
    config = MicroBatchingConfig.from_mapping({"max_latency_ms": 200, "max_window_ms": 0})
    assert config.keys_without_effect() == ["max_window_ms", "max_latency_ms"]


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(ConfigError, match="micro_batching.micro_batch_size: got 0"):
        MicroBatchingConfig(micro_batch_size=0)
    with pytest.raises(ConfigError, match="micro_batching.parallelism.postprocess: got -1"):
        Parallelism(postprocess=-1)


def test_yaml_wins_over_json_key_by_key(tmp_path: Path) -> None:
    (tmp_path / "micro_batching.json").write_text(
        json.dumps({"micro_batch_size": 8, "parallelism": {"preprocess": 3, "inference": 2}})
    )
    yaml_config = {"micro_batching": {"micro_batch_size": 2, "parallelism": {"inference": 1}}}
    config = load_config(tmp_path, yaml_config)
    assert config.micro_batch_size == 2
    assert config.parallelism.as_dict() == {"preprocess": 3, "inference": 1, "postprocess": 1}


def test_intra_op_threads_default_to_one_for_per_item_stages_and_merge_stage_by_stage(
    tmp_path: Path,
) -> None:
    default = {"preprocess": 1, "inference": None, "postprocess": 1}
    assert MicroBatchingConfig().intra_op_threads.as_dict() == default
    (tmp_path / "micro_batching.json").write_text(
        json.dumps({"intra_op_threads": {"preprocess": 4, "inference": 2}})
    )
    yaml_config = {"micro_batching": {"intra_op_threads": {"preprocess": None}}}
    config = load_config(tmp_path, yaml_config)
    assert config.intra_op_threads.as_dict() == {
        "preprocess": None,
        "inference": 2,
        "postprocess": 1,
    }
    assert MicroBatchingConfig.from_mapping(config.as_dict()) == config


def test_no_files_gives_defaults(tmp_path: Path) -> None:
    assert load_config(tmp_path, {"minWorkers": 1}) == MicroBatchingConfig()
    assert load_config(None, None) == MicroBatchingConfig()


def test_json_errors_name_the_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "micro_batching.json"
    path.write_text('{"micro_batch_size": 4, "parallelism": {"inference": 1,},}')
    with pytest.raises(ConfigError, match=r"micro_batching.json: invalid JSON at line 1 column"):
        load_config(tmp_path)
    path.write_text('{"parallelism": {"preprocess": 0}}')
    with pytest.raises(
        ConfigError, match=r"micro_batching.json: micro_batching.parallelism.preprocess: got 0"
    ):
        load_config(tmp_path)
    path.write_text("[4]")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        load_config(tmp_path)


def test_yaml_errors_name_the_section() -> None:
    with pytest.raises(
        ConfigError, match=r"model-config.yaml: micro_batching.micro_batch_size: got 'big'"
    ):
        load_config(None, {"micro_batching": {"micro_batch_size": "big"}})
    with pytest.raises(
        ConfigError, match=r"model-config.yaml: micro_batching: got 4, expected a mapping"
    ):
        load_config(None, {"micro_batching": 4})


def test_shipped_config_is_valid() -> None:
    path = Path(__file__).resolve().parents[2] / "configs" / "micro_batching.json"
    raw = json.loads(path.read_text(encoding="utf-8"))  # fails if the file is missing
    config = load_config(path.parent)
    assert (
        config.micro_batch_size == raw["micro_batch_size"] != MicroBatchingConfig().micro_batch_size
    )
    assert config.parallelism.as_dict() == raw["parallelism"]


def test_micro_batch_size_is_checked_by_one_function_with_one_message() -> None:
    # The config, MicroBatching's setter and Pipeline refused a size over the largest
    # allowed one with three different checks; now each calls check_micro_batch_size.
    assert check_micro_batch_size("auto", (1, 2)) == "auto"
    assert check_micro_batch_size(2, (1, 2)) == 2
    with pytest.raises(ConfigError) as direct:
        check_micro_batch_size(4, (2, 1))
    message = str(direct.value)
    assert message.startswith("micro_batching.micro_batch_size: got 4, expected at most")
    assert "allowed_micro_batch_sizes: got [1, 2], expected the largest to be at least" in message
    with pytest.raises(ConfigError) as from_config:
        MicroBatchingConfig(micro_batch_size=4, allowed_micro_batch_sizes=(2, 1))
    pipeline = Pipeline({"a": lambda x: x}, allowed_sizes=[1, 2], padded_stages=["a"])
    with pipeline, pytest.raises(ConfigError) as from_pipeline:
        pipeline.micro_batch_size = 4
    config = MicroBatchingConfig(allowed_micro_batch_sizes=(1, 2))
    with MicroBatching(FakeHandler(), config=config) as mb, pytest.raises(ConfigError) as setter:
        mb.micro_batch_size = 4
    assert {str(e.value) for e in (from_config, from_pipeline, setter)} == {message}


def test_pipeline_takes_an_automatic_size_at_construction_not_a_string() -> None:
    policy = AutoMicroBatchSize(2, 5)
    with Pipeline({"a": lambda x: x}, micro_batch_size=policy) as pipeline:
        assert pipeline.auto_micro_batch_size is policy
        assert pipeline.micro_batch_size == policy.last_size == 2
        assert [f.result(timeout=10) for f in pipeline.submit(list(range(9)))] == list(range(9))
        with pytest.raises(ConfigError, match='got "auto", expected an integer >= 1 or an Auto'):
            pipeline.micro_batch_size = "auto"  # type: ignore[assignment]
        assert pipeline.auto_micro_batch_size is policy  # a refused size changes nothing
        pipeline.micro_batch_size = 3
        assert pipeline.auto_micro_batch_size is None and pipeline.micro_batch_size == 3


def test_warmup_sizes_per_bucket_are_those_a_token_budget_can_cut() -> None:
    # Under a budget of 2048 a micro-batch holds at most 8 texts of 256 tokens and 2 of 512
    # (3 or 4 would be padded to 8 rows: 4096 tokens, over the budget): warm-up compiling
    # (32, 256) or (8, 512) would be graphs never used.
    config = MicroBatchingConfig.from_mapping(
        {
            "micro_batch_size": 32,
            "allowed_micro_batch_sizes": [2, 8, 32],
            "allowed_sequence_lengths": [64, 256, 512],
            "max_micro_batch_tokens": 2048,
            "warmup": {},
        }
    )
    assert config.warmup_sizes() == (2, 8, 32)
    assert [config.warmup_sizes(n) for n in (64, 256, 512)] == [(2, 8, 32), (2, 8), (2,)]
    unbudgeted = replace(config, max_micro_batch_tokens=None)
    assert unbudgeted.warmup_sizes(512) == (2, 8, 32)
    automatic = replace(config, micro_batch_size="auto", min_micro_batch_size=1)
    assert automatic.warmup_sizes(512) == automatic.warmup_sizes()  # its budget moves
