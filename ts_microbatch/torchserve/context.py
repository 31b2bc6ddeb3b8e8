"""A TorchServe context pinned to one batch, and the view of it a stage call gets.

TorchServe's synchronous worker keeps one ``ts.context.Context`` for the life of the model
and overwrites its ``request_ids`` and ``request_processor`` for each batch
(``ts.service.Service.predict``). Everything per request lives there: the request ids, the
request headers (and the sequence id, which is one), the response status and the response
headers (content type included). A micro-batch still running after its batch timed out
would read and write the next batch's requests through the live context. ``BatchContext``
pins all of it when the batch arrives; what is the model's (name, manifest, system
properties, metrics) is read from the live context.

Indexing. A ``BatchContext`` is indexed by request, as TorchServe's: index i is row i of the
batch ``handle()`` got. A stage call sees items, not requests (a KServe request of n
instances is n items; a malformed one none), so ``BatchContext.for_rows(owners)`` gives the
view a stage call gets: index i is row i of the stage's input, resolved to the request that
row came from (``owners[i]``). Every row of one KServe request resolves to that request; a
row that holds no request (padding, out of range) resolves to none: it reads as unknown
(None, {}) and writes to it are dropped. So no index can reach a request outside the
micro-batch, let alone another batch's. ``get_response_status`` of such a row raises
IndexError, as TorchServe's does for an index past its batch.

Not pinned: ``context.metrics`` is TorchServe's metrics cache, which looks request ids up in
the live batch; the pipeline's own metric lines carry their micro-batch's request id
(``ts_microbatch.torchserve.metrics``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_SEQUENCE_ID_HEADER = "ts_request_sequence_id"  # TorchServe's default (TS_REQUEST_SEQUENCE_ID)
_NO_REQUEST = -1  # in a view's rows: a row that holds no request


class BatchContext:
    """The per-request view of ``context`` as it was when a batch arrived.

    Works with any object shaped like ``ts.context.Context``. When it has no
    ``request_ids`` dict or ``request_processor`` list (TorchServe's ``MockContext``, what
    handler authors unit-test with), calls go to it when it has the method, and otherwise
    read as unknown and write nothing.
    """

    def __init__(self, context: Any) -> None:
        self._context = context
        ids = getattr(context, "request_ids", None)
        self._request_ids: dict[int, str] | None = dict(ids) if isinstance(ids, dict) else None
        # Each batch gets a new list of RequestProcessor objects, so holding the list pins it.
        processors = getattr(context, "request_processor", None)
        self._processors: list[Any] | None = processors if isinstance(processors, list) else None
        self._rows: tuple[int, ...] | None = None  # set on a view made by for_rows

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_context":  # copy, pickle, a half-built view
            raise AttributeError(name)
        return getattr(self._context, name)

    def for_rows(self, owners: Sequence[int | None]) -> BatchContext:
        """The view of this batch a stage call gets: index i is row i of the stage's input,
        whose request is ``owners[i]``, an index of this context, or None for a row of
        padding, which reaches no request (``for_rows(())`` reaches none at all)."""
        rows = self._rows

        def request(owner: int | None) -> int:
            if owner is None or owner < 0:
                return _NO_REQUEST
            if rows is None:
                return owner
            return rows[owner] if owner < len(rows) else _NO_REQUEST

        return self._view(tuple(request(owner) for owner in owners))

    def private_row(self, request: int) -> BatchContext:
        """A context of its own for request ``request`` alone (as its row 0), for a
        known-good probe that runs it again (``ts_microbatch.core.breaker``): its request id
        and its request headers read as they did; a status or response header written to it
        goes nowhere, never to a batch that may still be in flight. It holds that row only:
        no other request's, and no RequestProcessor."""
        request_id = self.get_request_id(request)
        headers = self.get_all_request_header(request)  # held, not copied: read only
        row = BatchContext.__new__(BatchContext)
        row._context = self._context  # the model's parts (name, manifest) are read live
        row._request_ids = {} if request_id is None else {0: request_id}
        row._processors = [_PrivateRow(headers)]
        row._rows = None
        return row

    def _view(self, rows: tuple[int, ...] | None) -> BatchContext:
        view = BatchContext.__new__(BatchContext)
        view._context = self._context
        view._request_ids = self._request_ids  # shared: pinned when the batch arrived
        view._processors = self._processors
        view._rows = rows
        return view

    @property
    def context(self) -> Any:
        """The live context this view was taken from."""
        return self._context

    # -- index resolution --------------------------------------------------------------

    def _row(self, idx: object) -> int | None:
        """The request index (a row of the live batch) ``idx`` resolves to; None for none."""
        if not isinstance(idx, int) or idx < 0:
            return None
        if self._rows is None:
            return idx
        request = self._rows[idx] if idx < len(self._rows) else _NO_REQUEST
        return None if request == _NO_REQUEST else request

    def _indices(self) -> list[int]:
        """The distinct requests this view reaches, in order."""
        if self._rows is not None:
            return [r for r in dict.fromkeys(self._rows) if r != _NO_REQUEST]
        if self._processors is not None:
            return list(range(len(self._processors)))
        return list(self._request_ids or {})

    def _processor(self, idx: Any) -> Any:
        request = self._row(idx)
        processors = self._processors
        if request is None or processors is None or request >= len(processors):
            return None
        return processors[request]

    def _live(self, name: str, idx: Any, *args: Any, default: Any = None) -> Any:
        """Calls the live context's ``name`` for ``idx``'s request (no processor list)."""
        request = self._row(idx)
        method = getattr(self._context, name, None)  # None: MockContext lacks it
        if request is None or method is None:
            return default
        return method(request, *args)

    # -- request ids ---------------------------------------------------------------------

    @property
    def request_ids(self) -> dict[int, str] | None:
        ids = self._request_ids
        if ids is None:
            ids = getattr(self._context, "request_ids", None)
            if not isinstance(ids, dict):
                return None
        if self._rows is None:
            return ids
        return {row: ids[r] for row, r in enumerate(self._rows) if r in ids}

    @property
    def request_count(self) -> int | None:
        """How many requests (rows, on a stage's view) the batch has, when the context says."""
        if self._rows is not None:
            return len(self._rows)
        ids = self.request_ids
        return len(ids) if isinstance(ids, dict) else None

    def get_request_id(self, idx: int = 0) -> str | None:
        if self._request_ids is None:
            live_id: str | None = self._live("get_request_id", idx)
            return live_id
        request = self._row(idx)
        return None if request is None else self._request_ids.get(request)

    # -- request headers -----------------------------------------------------------------

    @property
    def request_processor(self) -> list[Any] | None:
        """The batch's RequestProcessors (one per row, on a stage's view)."""
        if self._processors is None:
            return getattr(self._context, "request_processor", None)
        if self._rows is None:
            return self._processors
        return [self._processor(row) for row in range(len(self._rows))]

    def get_request_header(self, idx: int, key: str) -> str | None:
        if self._processors is None:
            header: str | None = self._live("get_request_header", idx, key)
            return header
        processor = self._processor(idx)
        return None if processor is None else processor.get_request_property(key)

    def get_all_request_header(self, idx: int) -> dict[str, str]:
        if self._processors is None:
            headers: dict[str, str] = self._live("get_all_request_header", idx, default={})
            return headers
        processor = self._processor(idx)
        return {} if processor is None else processor.get_request_properties()

    def get_sequence_id(self, idx: int) -> str | None:
        if self._processors is None:
            sequence_id: str | None = self._live("get_sequence_id", idx)
            return sequence_id
        header = getattr(self._context, "header_key_sequence_id", _SEQUENCE_ID_HEADER)
        return self.get_request_header(idx, header)

    # -- response status -----------------------------------------------------------------

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        if self._processors is None:
            request = self._row(idx)
            live = getattr(self._context, "set_response_status", None)  # None: MockContext
            if request is not None and live is not None:
                live(code, phrase, request)
            return
        processor = self._processor(idx)
        if processor is not None:
            processor.report_status(code, reason_phrase=phrase)

    def set_all_response_status(self, code: int = 200, phrase: str = "") -> None:
        """Sets the status of every request this view reaches (a stage's: its own)."""
        if self._processors is None and self._rows is None:
            live = getattr(self._context, "set_all_response_status", None)
            if live is not None:
                live(code, phrase)
            return
        by_request = self._view(None)
        for request in self._indices():
            by_request.set_response_status(code, phrase, request)

    def get_response_status(self, idx: int) -> tuple[int, str | None]:
        if self._row(idx) is None:
            raise IndexError(f"no request at index {idx!r}")
        if self._processors is None:
            # A context with no statuses (MockContext) has set none: TorchServe's default.
            status: tuple[int, str | None] = self._live(
                "get_response_status", idx, default=(200, None)
            )
            return status
        processor = self._processor(idx)
        if processor is None:
            raise IndexError(f"no request at index {idx!r}")
        return (processor.get_response_status_code(), processor.get_response_status_phrase())

    # -- response headers ----------------------------------------------------------------

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        if self._processors is None:
            self._live("set_response_header", idx, key, value)
            return
        processor = self._processor(idx)
        if processor is not None:
            processor.add_response_property(key, value)

    def get_response_headers(self, idx: int) -> dict[str, str]:
        if self._processors is None:
            response_headers: dict[str, str] = self._live("get_response_headers", idx, default={})
            return response_headers
        processor = self._processor(idx)
        return {} if processor is None else processor.get_response_headers()

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.set_response_header(idx, "content-type", value)

    def get_response_content_type(self, idx: int) -> str | None:
        return self.get_response_headers(idx).get("content-type")


class _PrivateRow:
    """A RequestProcessor's reading side, for ``BatchContext.private_row``: the headers it
    had; its writes are dropped and its status reads as TorchServe's default."""

    def __init__(self, headers: dict[str, str]) -> None:
        self._headers = headers

    def get_request_property(self, key: str) -> str | None:
        return self._headers.get(key)

    def get_request_properties(self) -> dict[str, str]:
        return self._headers

    def report_status(self, code: int, reason_phrase: str | None = None) -> None:
        pass

    def add_response_property(self, key: str, value: str) -> None:
        pass

    def get_response_status_code(self) -> int:
        return 200

    def get_response_status_phrase(self) -> str | None:
        return None

    def get_response_headers(self) -> dict[str, str]:
        return {}


def stage_context(info: Any) -> Any:
    """The context a stage call sees for its micro-batch ``info`` (a ``MicroBatchInfo``),
    indexed by the rows of its input; None outside a stage call (``info`` None) or without
    a context. A context that is not a ``BatchContext`` is returned as it is."""
    if info is None or info.context is None:
        return None
    if not isinstance(info.context, BatchContext):
        return info.context
    return info.context.for_rows(info.row_requests)


def stage_request_ids(info: Any) -> list[str | None]:
    """The request id of each row of the stage call ``info`` describes; None for a row of
    padding; empty outside a stage call."""
    if info is None or info.context is None:
        return []
    # info.context is indexed by request, whether or not it is a BatchContext.
    get_request_id = getattr(info.context, "get_request_id", None)
    return [
        None if request is None or get_request_id is None else get_request_id(request)
        for request in info.row_requests
    ]
