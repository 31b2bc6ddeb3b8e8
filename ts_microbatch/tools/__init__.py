"""Tools that drive a TorchServe from outside: start and stop it (``server``, ``serve``),
read its metrics (``scrape``), find a config (``tune``), benchmark a .mar on a corpus
(``benchmark``, with ``measure``, ``runs``, ``drive``, ``corpus``, ``mar``), build a KServe
bundle (``bundle``). After ``pip install ts_microbatch[tools]`` they are the commands
ts-microbatch-serve, -scrape, -tune, -benchmark and -bundle (setup.py's entry points), and
each is also ``python -m ts_microbatch.tools.<module>``. Never imported in a worker; their
own dependencies are the ``tools`` extra."""

from pathlib import Path

# TorchServe's metrics plus the pipeline's (MicroBatch*), installed with the package: a
# server's ``metrics_config`` must declare them for ``/metrics`` to carry them.
METRICS_YAML = Path(__file__).with_name("metrics.yaml")
