"""The micro-batching pipeline, independent of any model server: it imports nothing from
TorchServe (a test checks it). Requests are items, failures are exceptions, and the core
decides with its own error kinds (``errors``): a request's own bad input, a stage's
failure, a timeout. HTTP status codes are the adapter's (``ts_microbatch.torchserve``)."""
