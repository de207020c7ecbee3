"""Failed samples: counters keyed by exception type, the last few messages with their sample uid, and
telling a task's own cancellation from a callee's.

A counter keyed by message (``failed["ValueError: row 17 ..."]``) grows without bound; keyed by type it
has one key per kind of failure, and :class:`FailureLog` keeps the most recent messages (with the
sample uid) for the dashboard and the logs.

``asyncio.CancelledError`` has two meanings. When the rollouter stops, it cancels its own tasks:
that is a shutdown. But a callee can raise ``CancelledError`` too (an engine request cancelled by its
server, a Ray task cancelled under us); then the sample failed and the run goes on.
:func:`own_cancellation` tells them apart with ``Task.cancelling()`` (Python 3.11), which counts
only cancellation *requests made to this task*.
"""

from __future__ import annotations

import asyncio
import collections
import textwrap
import time
from typing import Any, Optional


def short_message(exc: BaseException, width: int = 400) -> str:
    """``exc``'s first line, cut at a word to ``width`` characters with `` ...`` (a reward error names the file,
    the function, the data_source and the fix: cut at 200 characters mid-word, session 31, it lost the fix)."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return textwrap.shorten(first, width, placeholder=" ...") if len(first) > width else first


class RolloutStopped(RuntimeError):
    """The rollouter stopped the run: ``actor_rollout_ref.rollout.max_consecutive_failures`` prompt
    groups failed in a row (the message names the most common failure and the key)."""


def failure_type(exc: BaseException) -> str:
    """The counter key of a failure: the exception's type name, unwrapping Ray's task errors."""
    cause = getattr(exc, "cause", None)
    if cause is None and hasattr(exc, "as_instanceof_cause"):
        try:
            cause = exc.as_instanceof_cause()
        except Exception:  # pragma: no cover - malformed Ray error
            cause = None
    if cause is not None and cause is not exc:
        name = type(cause).__name__
        return name.removeprefix("RayTaskError(").removesuffix(")")
    return type(exc).__name__


def own_cancellation() -> bool:
    """True when the running task itself was asked to cancel (``task.cancel()``), not a callee."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class FailureLog:
    """Failure counts by type and the last ``keep`` failures with their sample uid.

    Args:
        keep: how many recent failures to keep (the dashboard shows these).
    """

    def __init__(self, keep: int = 20):
        self.counts: collections.Counter = collections.Counter()
        self.recent: collections.deque = collections.deque(maxlen=keep)
        self.consecutive = 0  # failures since the last success
        self.storm: collections.Counter = collections.Counter()  # their types

    def success(self) -> None:
        """A sample succeeded: the run of consecutive failures ends."""
        self.consecutive = 0
        self.storm.clear()

    def storm_message(self, limit: int) -> Optional[str]:
        """The reason to stop the run when ``limit`` (> 0) failures came in a row, else ``None``."""
        if limit <= 0 or self.consecutive < limit:
            return None
        kinds = ", ".join(f"{k} x{v}" for k, v in self.storm.most_common(3))
        last = next((r["message"] for r in reversed(self.recent) if r["type"] == self.storm.most_common(1)[0][0]), "")
        return (f"{self.consecutive} prompt groups failed in a row and none succeeded ({kinds}); the most common: "
                f"{last!r} (its traceback is logged at its first occurrence). Fix the cause, or raise "
                f"actor_rollout_ref.rollout.max_consecutive_failures (0 = never stop)")

    def record(self, exc: BaseException, uid: Optional[str] = None, **details: Any) -> str:
        """Count one failure and remember its message.

        Args:
            exc: the exception.
            uid: the sample uid (the prompt group).
            details: extra fields for the record (row index, cancelled siblings, ...).

        Returns:
            The counter key (exception type name).
        """
        key = failure_type(exc)
        self.counts[key] += 1
        self.consecutive += 1
        self.storm[key] += 1
        message = short_message(exc) or key
        self.recent.append({"uid": uid, "type": key, "message": message, "time": time.time(), **details})
        return key

    def first_of_kind(self, key: str) -> bool:
        """True for the first failure of type ``key`` and then at 10, 100, 1000 ... (log it then: the first with its
        traceback, the others as a count; :meth:`asyncrl.rollouter.FullyAsyncRollouter._log_failure`)."""
        n = self.counts[key]
        return n == 1 or (n >= 10 and str(n).strip("0") == "1")

    def snapshot(self) -> list[dict]:
        """The recent failures, oldest first (plain dicts: picklable, JSON-able)."""
        return list(self.recent)


async def raise_if_rollout_stopped(mq) -> None:
    """After the MessageQueue closed: raise :class:`RolloutStopped` when the rollouter closed it with a
    reason (``MessageQueue.shutdown(reason)``); a normal shutdown returns."""
    reason = (await mq.stats_async()).shutdown_reason
    if reason:
        raise RolloutStopped(reason)
