"""Tools that drive a TorchServe from outside, never imported in a worker: start and stop
it (``server``, ``serve``), read its metrics (``scrape``), tune and benchmark a .mar
(``tune``, ``benchmark``), package one (``bundle``). Installed with the ``tools`` extra, they
are the ts-microbatch-serve, -scrape, -tune, -benchmark and -bundle commands."""

from pathlib import Path

# TorchServe's metrics and the pipeline's: a server's metrics_config must declare them.
METRICS_YAML = Path(__file__).with_name("metrics.yaml")
