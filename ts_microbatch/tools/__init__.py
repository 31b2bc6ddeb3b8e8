"""Tools that drive a TorchServe from outside: start and stop it (``server``, ``serve``),
read its metrics (``scrape``), find a config (``tune``), benchmark a .mar on a corpus
(``benchmark``, with ``measure``, ``runs``, ``drive``, ``corpus``, ``mar``), build a KServe
bundle (``bundle``). After ``pip install ts_microbatch[tools]`` they are the commands
ts-microbatch-serve, -scrape, -tune, -benchmark and -bundle (setup.py's entry points), and
each is also ``python -m ts_microbatch.tools.<module>``. Never imported in a worker; their
own dependencies are the ``tools`` extra."""
