"""Poller: one asyncio task per dashboard that awaits snapshots and pushes them to the widgets.

::

    kernel event loop ──> Poller._run():  every `interval` s
                              snapshot = await fetch()          (e.g. Experiment.status_async: Ray refs,
                                                                  awaited, so the kernel stays responsive)
                              sink(snapshot)                    (one batched widget update)
                          until: cancelled (stop(), or a new Poller under the same key: re-run of the
                                 cell), the snapshot's state is "done", or `max_errors` fetches fail in a row

The task runs on the kernel's own running loop (ipykernel >= 7.4 processes widget messages while
it runs); no nest_asyncio. Outside a running loop (scripts), call ``await poller.poll_once()``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Optional

logger = logging.getLogger(__name__)

_LIVE: dict[Any, "Poller"] = {}  # key -> the one live poller for that key


class Poller:
    """Periodic async snapshot -> sink loop, at most one live per ``key``.

    Args:
        fetch: async callable returning a snapshot dict.
        sink: called with each snapshot (synchronously, on the loop thread).
        interval: seconds between polls (0.5-1.0 s = 1-2 Hz).
        key: identity of what is polled (e.g. the experiment name); starting a poller with a key
            that already has a live one cancels the old one.
        timeout: per-fetch timeout in seconds.
        max_errors: consecutive failed fetches before giving up.
        stop_when: predicate on a snapshot; when true, the poller delivers it and stops.
        on_exit: called with the poller when its loop ends (finished, gave up, cancelled).
    """

    def __init__(self, fetch: Callable[[], Awaitable[dict]], sink: Callable[[dict], None], interval: float = 0.75,
                 key: Any = None, timeout: float = 10.0, max_errors: int = 5,
                 stop_when: Optional[Callable[[dict], bool]] = None,
                 on_exit: Optional[Callable[["Poller"], None]] = None):
        self.fetch, self.sink = fetch, sink
        self.interval, self.key, self.timeout, self.max_errors = interval, key, timeout, max_errors
        self.stop_when = stop_when or (lambda s: s.get("state") == "done")
        self.on_exit = on_exit
        self.task: Optional[asyncio.Task] = None
        self.polls = 0
        self.errors = 0
        self.last_error: Optional[str] = None
        self.last_poll_s: Optional[float] = None
        self.max_poll_s = 0.0
        self.reason: str = "not started"

    # ---------------------------------------------------------------- control
    def start(self) -> "Poller":
        """Schedule the loop on the running event loop (cancels a live poller with the same key).

        Raises:
            RuntimeError: no running event loop (use :meth:`poll_once` from scripts).
        """
        loop = asyncio.get_running_loop()
        old = _LIVE.get(self.key) if self.key is not None else None
        if old is not None and old is not self:
            old.stop("replaced")
        self.task = loop.create_task(self._run(), name=f"asyncrl-poller-{self.key}")
        if self.key is not None:
            _LIVE[self.key] = self
        self.reason = "running"
        return self

    def stop(self, reason: str = "stopped") -> None:
        """Cancel the polling task (idempotent)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self.reason = reason
        if self.key is not None and _LIVE.get(self.key) is self:
            del _LIVE[self.key]

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    @staticmethod
    def stop_all() -> int:
        """Cancel every live poller; returns how many were running."""
        live = list(_LIVE.values())
        for p in live:
            p.stop("stop_all")
        return len(live)

    # ---------------------------------------------------------------- loop
    async def poll_once(self) -> Optional[dict]:
        """Fetch one snapshot and deliver it; returns it (``None`` on a failed fetch)."""
        t0 = time.monotonic()
        try:
            snap = await asyncio.wait_for(self.fetch(), self.timeout)
        except asyncio.CancelledError:
            raise
        except asyncio.TimeoutError:
            self.errors += 1
            self.last_error = f"snapshot took longer than {self.timeout:g} s"
            logger.info("snapshot fetch timed out (%d in a row)", self.errors)
            return None
        except Exception as exc:  # reported in the dashboard; the loop keeps going
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            logger.info("snapshot fetch failed (%d in a row): %s", self.errors, self.last_error)
            return None
        self.errors = 0
        self.polls += 1
        self.last_poll_s = time.monotonic() - t0
        self.max_poll_s = max(self.max_poll_s, self.last_poll_s)
        try:
            self.sink(snap)
        except Exception:
            logger.exception("widget update failed")
        return snap

    async def _run(self) -> None:
        try:
            while True:
                t0 = time.monotonic()
                snap = await self.poll_once()
                if snap is not None and self.stop_when(snap):
                    self.reason = f"finished ({snap.get('state')})"
                    break
                if self.errors >= self.max_errors:
                    self.reason = f"gave up after {self.errors} failed fetches: {self.last_error}"
                    logger.warning("poller %r %s", self.key, self.reason)
                    break
                await asyncio.sleep(max(0.05, self.interval - (time.monotonic() - t0)))
        except asyncio.CancelledError:
            logger.debug("poller %r cancelled", self.key)
            raise
        finally:
            if self.key is not None and _LIVE.get(self.key) is self:
                del _LIVE[self.key]
            if self.on_exit is not None:
                try:
                    self.on_exit(self)
                except Exception:
                    logger.exception("poller on_exit hook failed")

    def __repr__(self) -> str:
        return f"Poller(key={self.key!r}, {self.reason}, polls={self.polls}, interval={self.interval}s)"
