"""Ctrl-C during a run: the first stops it as a normal end, a second aborts that, however soon after the first.

::

    SIGINT --C handler--> a flag, and one byte (the signal number) on the wakeup fd per signal
           --Python handler (once for all the signals since it last ran, when the main thread next runs bytecode:
                            after the C call it is in returns, e.g. Experiment.wait's ray.wait, up to ~1 s later)
                 SigintCounter._handle: count += SIGINT bytes on the fd -> KeyboardInterrupt
    Experiment.wait  KeyboardInterrupt, count 1    -> Experiment.interrupt() (stop after the running step) -> RunInterrupted
                     KeyboardInterrupt, count >= 2 -> re-raised: abort (the two came before the first was handled)
                     a Ctrl-C during interrupt()   -> KeyboardInterrupt out of it: abort

CPython runs a Python signal handler once however many signals arrived while the main thread was in C code, so with
the default handler two Ctrl-C within the second ``ray.wait`` blocks read as one, and the run stopped gently instead
of aborting. The C-level handler does write one byte per signal to the wakeup fd (``signal.set_wakeup_fd``), which
is what :class:`SigintCounter` counts.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Optional

from asyncrl.summary import Summary


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during :meth:`~asyncrl.experiment.Experiment.wait`: the run was stopped as a normal end (the running step
    finished, final sync, evaluation, accounting, artifacts); ``summary`` is its :class:`Summary`. A
    ``KeyboardInterrupt``, so code that does not know it still stops."""

    def __init__(self, summary: Summary):
        super().__init__(summary.stop_reason)
        self.summary = summary


class SigintCounter:
    """While entered, counts every SIGINT delivered (``count``), those that arrived together included; each batch
    still raises ``KeyboardInterrupt`` as Python's default handler does.

    It changes nothing, and ``count`` stays 0, outside the main thread or when SIGINT has another handler than
    Python's default (a notebook kernel's, a caller's). With another wakeup fd set (an asyncio loop's in this thread)
    that fd is left in place and ``count`` counts the handler's runs (signals that came together count once). On
    exit the previous handler and wakeup fd are back.
    """

    def __init__(self) -> None:
        self.count = 0
        self._fds: Optional[tuple[int, int]] = None
        self._installed = False
        self._old_fd = -1

    def __enter__(self) -> "SigintCounter":
        if (threading.current_thread() is not threading.main_thread()
                or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
            return self
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        self._old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        if self._old_fd != -1:  # someone else's: keep it
            signal.set_wakeup_fd(self._old_fd)
            os.close(r)
            os.close(w)
        else:
            self._fds = (r, w)
        signal.signal(signal.SIGINT, self._handle)
        self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        if not self._installed:
            return
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if self._fds is not None:
            signal.set_wakeup_fd(self._old_fd)
            for fd in self._fds:
                os.close(fd)
            self._fds = None
        self._installed = False

    def _drained(self) -> int:
        """SIGINTs on the wakeup fd since it was last read (bytes of other signals are dropped: the fd is ours)."""
        if self._fds is None:
            return 0
        n = 0
        while True:
            try:
                data = os.read(self._fds[0], 512)
            except BlockingIOError:
                return n
            if not data:
                return n
            n += data.count(signal.SIGINT)

    def _handle(self, signum, frame) -> None:
        self.count += max(1, self._drained())
        raise KeyboardInterrupt
