"""A handler that does nothing: measures TorchServe's own per-request overhead."""


def handle(data, context):
    if data is None:  # the initialize call
        return None
    return ["ok"] * len(data)
