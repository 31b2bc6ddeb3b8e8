"""A TorchServe context pinned to one batch.

TorchServe's synchronous worker keeps one ``ts.context.Context`` for the life of the model
and overwrites its ``request_ids`` and ``request_processor`` (headers and statuses) for each
batch. A micro-batch still running after its batch timed out would read the next batch's
requests through it. ``BatchContext`` takes the per-request parts when the batch arrives
and delegates everything else (model name, system properties, metrics) to the live context.
"""

from __future__ import annotations

from typing import Any


class BatchContext:
    """The per-request view of ``context`` as it was when a batch arrived.

    Works with any object shaped like ``ts.context.Context``: when it has no
    ``request_ids`` dict or ``request_processor`` list, the calls go to it unchanged.
    """

    def __init__(self, context: Any) -> None:
        self._context = context
        ids = getattr(context, "request_ids", None)
        self._request_ids: dict[int, str] | None = dict(ids) if isinstance(ids, dict) else None
        # Each batch gets a new list of RequestProcessor objects, so holding the list pins it.
        processors = getattr(context, "request_processor", None)
        self._processors: list[Any] | None = processors if isinstance(processors, list) else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    @property
    def context(self) -> Any:
        """The live context this view was taken from."""
        return self._context

    @property
    def request_ids(self) -> dict[int, str] | None:
        # TorchServe's MockContext (what handler authors unit-test with) has no request ids,
        # no request_processor and no response statuses: the view then knows none.
        if self._request_ids is not None:
            return self._request_ids
        return getattr(self._context, "request_ids", None)

    @property
    def request_count(self) -> int | None:
        """How many requests the batch has, when the context says."""
        ids = self.request_ids
        return len(ids) if isinstance(ids, dict) else None

    def get_request_id(self, idx: int = 0) -> str | None:
        if self._request_ids is None:
            live = getattr(self._context, "get_request_id", None)  # None: MockContext
            return live(idx) if live is not None else None  # type: ignore[no-any-return]
        return self._request_ids.get(idx)

    def _processor(self, idx: int) -> Any:
        processors = self._processors
        if processors is None or not 0 <= idx < len(processors):
            return None
        return processors[idx]

    def get_request_header(self, idx: int, key: str) -> str | None:
        if self._processors is None:
            return self._context.get_request_header(idx, key)  # type: ignore[no-any-return]
        processor = self._processor(idx)
        return None if processor is None else processor.get_request_property(key)

    def get_all_request_header(self, idx: int) -> dict[str, str]:
        if self._processors is None:
            return self._context.get_all_request_header(idx)  # type: ignore[no-any-return]
        processor = self._processor(idx)
        return {} if processor is None else processor.get_request_properties()

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        if self._processors is None:
            live = getattr(self._context, "set_response_status", None)  # None: MockContext
            if live is not None:
                live(code, phrase, idx)
            return
        processor = self._processor(idx)
        if processor is not None:
            processor.report_status(code, reason_phrase=phrase)

    def get_response_status(self, idx: int) -> tuple[int, str]:
        if self._processors is None:
            return self._context.get_response_status(idx)  # type: ignore[no-any-return]
        processor = self._processor(idx)
        return (processor.get_response_status_code(), processor.get_response_status_phrase())

    def set_response_content_type(self, idx: int, value: str) -> None:
        if self._processors is None:
            self._context.set_response_content_type(idx, value)
            return
        processor = self._processor(idx)
        if processor is not None:
            processor.add_response_property("content-type", value)

    def get_response_content_type(self, idx: int) -> str | None:
        if self._processors is None:
            return self._context.get_response_content_type(idx)  # type: ignore[no-any-return]
        processor = self._processor(idx)
        return None if processor is None else processor.get_response_header("content-type")
