"""A variant's JSON: its micro-batching override, and the frontend's batch size and window
for that variant alone (ts_microbatch.tools.mar)."""

from __future__ import annotations

import argparse

import pytest

from ts_microbatch.tools.benchmark import parse_variant
from ts_microbatch.tools.mar import split_frontend


def test_frontend_keys_go_to_the_frontend_and_the_rest_to_the_section() -> None:
    name, override = parse_variant('w5={"maxBatchDelay": 5, "micro_batch_size": 8}')
    assert name == "w5"
    assert split_frontend(override) == ({"micro_batch_size": 8}, {"maxBatchDelay": 5})
    # Only the window: the section is as packaged.
    assert split_frontend({"batchSize": 16, "maxBatchDelay": 0}) == (
        None,
        {"batchSize": 16, "maxBatchDelay": 0},
    )
    assert split_frontend(None) == (None, {})
    assert split_frontend({}) == ({}, {})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('w={"maxBatchDelay": -1}', "maxBatchDelay: got -1, expected an integer >= 0"),
        ('w={"batchSize": 0}', "batchSize: got 0, expected an integer >= 1"),
        ('w={"batchSize": true}', "batchSize: got True"),
        ('w={"maxBatchDelay": 2.5}', "maxBatchDelay: got 2.5"),
    ],
)
def test_a_bad_window_is_refused_naming_the_key(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse_variant(text)
