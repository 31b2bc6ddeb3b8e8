"""A plain body's way from ``MicroBatching.handle`` to its bytes, counted (issue 42, item 3).

One request goes through TorchServe's own ``Service.predict`` into a real ``MicroBatching``
(default config, enabled), with a profile hook on every thread (``sys.setprofile`` on this
one, ``threading.setprofile`` before the stage threads start). The way is read from the
``call`` events the hook sees while ``handle`` runs, by this rule:

- A call counts when it enters a function of the adapter (``ts_microbatch.torchserve``), or
  when a function of the adapter calls into the core: what the adapter does with the body,
  and each step it hands to the core. The core's calls among themselves are the pipeline's
  own work, the same for every body whatever its protocol; they are printed beside the way
  (``core calls``) but not held to the bound. The user's handler, the stdlib, torch and
  TorchServe are not counted.
- The stage threads that carry the body count: their calls are placed where ``handle``'s
  thread waits for them (its calls made before the last stage-thread call, then the stage
  threads' in the order they were made, then the rest of its own), so the way does not
  depend on how the threads happen to interleave.
- A stay is a maximal run of consecutive counted calls in one module, whichever thread
  makes them (three stage threads copying their known-good rows one after another are one
  stay in ``context``); a module is entered once per stay in it.

Counted so, on the tree before this test (a plain JSON body): 40 stays in 9 modules,
``context`` entered 10 times, ``answers`` 6, and 15 functions of the KServe reader. Every
package call counted, the core's included, the way is about 160 stays, three quarters of
them the stage threads' own loop (``micro_batch`` entered 33 times): the bound is on what
the adapter does, which decides how a body is read and answered.

The bound: at most 15 stays, no module entered more than twice, and no function of the
KServe reader (``torchserve/kserve*.py``) called for a plain body. A KServe body goes
through the same hook, to prove that it sees the reader.
"""

from __future__ import annotations

import importlib
import itertools
import pkgutil
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from types import CodeType, FrameType
from typing import Any, NamedTuple

import pytest

import ts_microbatch
from tests.torchserve.test_micro_batching import RowHandler, ts_request, ts_service, v2_body
from tests.torchserve.ts_machinery import decode
from ts_microbatch import MicroBatching

PACKAGE = "ts_microbatch."
ADAPTER = "ts_microbatch.torchserve."
KSERVE = "torchserve.kserve"
MAX_STAYS = 15
MAX_ENTRIES = 2


class Call(NamedTuple):
    thread: str
    module: str  # without the "ts_microbatch." prefix
    function: str
    counted: bool  # on the way (the adapter, or the adapter calling the core)


class Way(NamedTuple):
    calls: list[Call]  # in the way's order (module docstring), counted ones only
    core_calls: int  # the core's calls among themselves, not counted

    @property
    def stays(self) -> list[tuple[str, list[Call]]]:
        return [(module, list(run)) for module, run in itertools.groupby(self.calls, _module)]

    @property
    def entries(self) -> Counter[str]:
        return Counter(module for module, _ in self.stays)

    @property
    def kserve_calls(self) -> list[Call]:
        return [call for call in self.calls if call.module.startswith(KSERVE)]

    def __str__(self) -> str:
        lines = [
            f"{module:26} {run[0].thread:28} {', '.join(c.function for c in run)}"
            for module, run in self.stays
        ]
        lines.append(
            f"{len(self.stays)} stays in {len(self.entries)} modules, "
            f"{len(self.stays) - len(self.entries)} returns to a module already left; "
            f"entered: {dict(self.entries.most_common())}; "
            f"KServe reader functions: {len(self.kserve_calls)}; core calls: {self.core_calls}"
        )
        return "\n".join(lines)


def _module(call: Call) -> str:
    return call.module


def qualnames() -> dict[CodeType, str]:
    """Each of the package's code objects and its qualified name, nested functions as
    ``f.<locals>.g``: what ``co_qualname`` holds from Python 3.11 on, which 3.9 (the
    official image's) lacks."""
    names: dict[CodeType, str] = {}

    def walk(code: CodeType, qualname: str) -> None:
        names[code] = qualname
        for const in code.co_consts:
            if isinstance(const, CodeType):
                walk(const, f"{qualname}.<locals>.{const.co_name}")

    def visit(owner: Any, module: str, seen: set[int]) -> None:
        for value in vars(owner).values():
            value = getattr(value, "__func__", value)  # classmethod, staticmethod
            if getattr(value, "__module__", None) != module or id(value) in seen:
                continue
            seen.add(id(value))
            code = getattr(value, "__code__", None)
            if isinstance(code, CodeType):
                walk(code, value.__qualname__)
            elif isinstance(value, type):
                visit(value, module, seen)

    for info in pkgutil.walk_packages(ts_microbatch.__path__, PACKAGE):
        if info.name.endswith(".__main__"):
            continue  # a command, which importing would run
        module = importlib.import_module(info.name)
        visit(module, info.name, set())
    return names


@contextmanager
def recording() -> Iterator[list[tuple[int, Call]]]:
    """Every call into the package made while ``MicroBatching.handle`` runs, on any thread
    started inside the block: (sequence number, call)."""
    events: list[tuple[int, Call]] = []
    counter = itertools.count()
    lock = threading.Lock()
    depth = [0]  # handle's frames open (its thread only)
    names = qualnames()

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(PACKAGE):
            return
        qualname = names.get(frame.f_code, frame.f_code.co_name)
        is_handle = qualname == "MicroBatching.handle"
        if event == "return" and is_handle:
            depth[0] -= 1
        if event != "call":
            return
        depth[0] += is_handle
        if not depth[0]:
            return
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        counted = name.startswith(ADAPTER) or caller.startswith(ADAPTER)
        call = Call(
            threading.current_thread().name,
            name.removeprefix(PACKAGE),
            qualname,
            counted,
        )
        with lock:
            events.append((next(counter), call))

    threading.setprofile(hook)  # type: ignore[arg-type]
    sys.setprofile(hook)  # type: ignore[arg-type]
    try:
        yield events
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
        sys.setprofile(None)


def way_of(events: list[tuple[int, Call]], handle_thread: str) -> Way:
    """The counted calls in the way's order (module docstring)."""
    counted = [(seq, call) for seq, call in events if call.counted]
    others = [(seq, call) for seq, call in counted if call.thread != handle_thread]
    woken = others[-1][0] if others else -1
    own = [(seq, call) for seq, call in counted if call.thread == handle_thread]
    ordered = (
        [c for seq, c in own if seq < woken]
        + [c for _, c in others]
        + [c for seq, c in own if seq > woken]
    )
    return Way(ordered, sum(1 for _, call in events if not call.counted))


def walk(body: bytes) -> tuple[Way, tuple[int, list[tuple[str, int, bytes]]]]:
    """The way of one request with ``body`` through TorchServe's ``Service.predict`` into a
    real ``MicroBatching`` (default config), and the response the frontend reads."""
    with recording() as events, MicroBatching(RowHandler()) as mb:
        service = ts_service(mb)
        service.predict([ts_request(0, b"warm")])  # the first batch's one-time work
        events.clear()
        message = service.predict([ts_request(0, body)])
    return way_of(events, threading.current_thread().name), decode(message)


# A JSON object, which must be parsed to be found plain (not the strict v2 shape), and raw
# bytes, found plain by their first byte.
PLAIN_BODIES = [b'{"text": "plain"}', b"plain text"]


@pytest.mark.parametrize("body", PLAIN_BODIES, ids=["json", "bytes"])
def test_a_plain_body_takes_a_short_way_that_never_enters_the_kserve_reader(body: bytes) -> None:
    way, (code, answers) = walk(body)
    print(way)
    # It was served: the way seen is that of an answered request.
    assert code == 200 and answers == [("req-0", 200, body.upper())], f"\n{way}"
    assert any(call.function == "MicroBatching.handle" for call in way.calls), f"\n{way}"
    assert not way.kserve_calls, f"\n{way}"
    assert len(way.stays) <= MAX_STAYS, f"\n{way}"
    assert max(way.entries.values()) <= MAX_ENTRIES, f"\n{way}"


def test_a_kserve_body_goes_through_the_kserve_reader() -> None:
    # The same hook sees the reader when a body is KServe's: the test above can see it.
    way, (code, answers) = walk(v2_body("kserve"))
    print(way)
    assert code == 200 and b"KSERVE" in answers[0][2], f"\n{way}"
    assert way.kserve_calls, f"\n{way}"
