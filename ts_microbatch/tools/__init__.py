"""Tools that drive a TorchServe from outside: start and stop it (``server``, ``serve``),
read its metrics (``scrape``), find a config (``tune``), build a KServe bundle (``bundle``).
Never imported in a worker; their own dependencies are the ``tools`` extra."""
