"""TorchServe's inference, management and metrics APIs over HTTP, as the tools call them.

``ServerAPI`` is the HTTP half of ts_microbatch.tools.server.TorchServe (which adds the
process): the addresses, the token of TorchServe's token authorization read from the key
file the frontend writes, one request with any status as a Response, and the calls the
tools make (register, unregister after draining, describe, predict, scrape).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .ports import LOOPBACK

__all__ = ["Response", "ServerAPI", "TorchServeError"]


@dataclass
class Response:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body)


class TorchServeError(RuntimeError):
    """TorchServe did not start, or answered the management API with an error."""


class ServerAPI:
    """The HTTP calls on a TorchServe at ``ports`` (inference, management, metrics) on
    loopback, with the keys from ``workdir``'s key file when ``token_auth`` is on."""

    ports: tuple[int, int, int] | None
    token_auth: bool
    workdir: Path

    # -- addresses -----------------------------------------------------------------------

    def _url(self, which: int) -> str:
        if self.ports is None:  # only before __post_init__ has chosen them
            raise TorchServeError("the server's ports are not chosen yet")
        return f"http://{LOOPBACK}:{self.ports[which]}"

    @property
    def inference_url(self) -> str:
        return self._url(0)

    @property
    def management_url(self) -> str:
        return self._url(1)

    @property
    def metrics_url(self) -> str:
        return self._url(2)

    # -- HTTP ----------------------------------------------------------------------------

    def token(self, kind: str) -> str | None:
        """The ``"inference"`` or ``"management"`` key, None with token authorization off."""
        if not self.token_auth:
            return None
        key_file = self.workdir / "key_file.json"
        if not key_file.exists():
            return None
        try:
            keys = json.loads(key_file.read_text())
        except json.JSONDecodeError:  # still being written by the frontend
            return None
        token: str | None = keys.get(kind, {}).get("key")
        return token

    def request(
        self,
        method: str,
        url: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float = 120.0,
    ) -> Response:
        """One HTTP request; any status comes back as a Response, network errors raise OSError."""
        headers = dict(headers or {})
        kind = "management" if url.startswith(self.management_url) else "inference"
        token = self.token(kind)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return Response(resp.status, resp.read(), dict(resp.headers))
        except urllib.error.HTTPError as err:
            return Response(err.code, err.read(), dict(err.headers or {}))

    def register(
        self,
        mar: str,
        *,
        batch_size: int = 1,
        max_batch_delay_ms: int = 100,
        initial_workers: int = 1,
        response_timeout_s: int | None = None,
        model_name: str | None = None,
        timeout_s: float = 300.0,
    ) -> Response:
        """POST /models synchronously; the response says whether the workers started."""
        params = {
            "url": mar,
            "batch_size": batch_size,
            "max_batch_delay": max_batch_delay_ms,
            "initial_workers": initial_workers,
            "synchronous": "true",
        }
        if response_timeout_s is not None:
            params["response_timeout"] = response_timeout_s
        if model_name:
            params["model_name"] = model_name
        query = urllib.parse.urlencode(params)
        return self.request("POST", f"{self.management_url}/models?{query}", timeout_s=timeout_s)

    def unregister(
        self, model_name: str, *, drain: bool = True, timeout_s: float = 120.0
    ) -> Response:
        """DELETE /models/<name>, by default once the requests queued for it are answered.

        TorchServe 0.12 drops the requests still queued for a model it unregisters: their
        clients wait until they time out (pytorch/serve#1101). Draining first, by watching
        ``jobQueueStatus.pendingRequests``, is the way around it; requests sent after the
        DELETE get 404.
        """
        deadline = time.monotonic() + timeout_s
        while drain and time.monotonic() < deadline:
            resp = self.request("GET", f"{self.management_url}/models/{model_name}")
            if resp.status != 200 or resp.json()[0]["jobQueueStatus"]["pendingRequests"] == 0:
                break
            time.sleep(0.05)  # TorchServe has no drain event to wait on
        return self.request(
            "DELETE",
            f"{self.management_url}/models/{model_name}",
            timeout_s=max(1.0, deadline - time.monotonic()),
        )

    def describe(self, model_name: str) -> dict[str, Any]:
        resp = self.request("GET", f"{self.management_url}/models/{model_name}")
        if resp.status != 200:
            raise TorchServeError(f"GET /models/{model_name}: {resp.status} {resp.body!r}")
        described: list[dict[str, Any]] = resp.json()
        return described[0]

    def predict(
        self,
        model_name: str,
        body: bytes,
        timeout_s: float = 120.0,
        content_type: str = "application/octet-stream",
        headers: dict[str, str] | None = None,
    ) -> Response:
        # Without a content type urllib sends a form encoding, which TorchServe would parse.
        return self.request(
            "POST",
            f"{self.inference_url}/predictions/{model_name}",
            body=body,
            headers={"Content-Type": content_type, **(headers or {})},
            timeout_s=timeout_s,
        )

    def scrape_metrics(self) -> str:
        return self.request("GET", f"{self.metrics_url}/metrics").body.decode()
