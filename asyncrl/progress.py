"""The progress bar of a run in a terminal (:meth:`asyncrl.experiment.Experiment.wait`), which other output never
glues onto.

tqdm redraws its bar in place: ``\\r`` and the bar, no newline. Ray's driver prints each actor's output line
(``(FullyAsyncTrainer pid=...) ... WARNING asyncrl...: ...``) from its log thread to ``sys.stdout`` / ``sys.stderr``,
so a line began at the end of the bar's line, and so did the driver's own log lines. While the bar shows,
:func:`progress_bar` does what tqdm documents for this ("Redirecting writing" and
``tqdm.contrib.logging.logging_redirect_tqdm``): ``sys.stdout`` and ``sys.stderr`` are files that write whole lines
with the bar cleared and then redraw it (:class:`AboveTheBar`, through ``tqdm.external_write_mode``; tqdm's own
``DummyTqdmFile`` clears only a bar on the stream written to, and Ray writes an actor's stdout to ``sys.stdout``
while the bar is on ``sys.stderr``, as the terminal shows both), and the console handlers of the root and ``ray``
loggers write through ``tqdm.write``. Ray itself hides only its own ``ray.experimental.tqdm_ray`` bars around an
actor's line. A notebook's bar (a widget) and a hidden one change nothing.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from typing import Any, Iterator, TextIO


class AboveTheBar:
    """A text stream that writes each whole line above ``bar`` (cleared, written, redrawn); a partial line waits for
    its newline (``print`` writes the text and the newline apart). Other attributes are ``stream``'s.

    Args:
        stream: where the lines go (the terminal's ``sys.stdout`` or ``sys.stderr``).
        bar: a terminal ``tqdm`` bar; its class's ``external_write_mode`` clears every bar on ``bar.fp``.
    """

    def __init__(self, stream: TextIO, bar: Any):
        self._stream, self._bar = stream, bar
        self._pending = ""
        self._lock = threading.Lock()  # Ray's log thread and the main thread both print

    def write(self, text: str) -> int:
        with self._lock:
            head, newline, self._pending = (self._pending + text).rpartition("\n")
            if newline:
                self._emit(head + newline)
        return len(text)

    def _emit(self, text: str) -> None:
        with self._bar.external_write_mode(file=self._bar.fp):
            self._stream.write(text)
            self._stream.flush()

    def flush(self) -> None:
        self._stream.flush()  # a partial line stays pending: written now, the bar would be drawn after it

    def close_pending(self) -> None:
        """Write what is left of an unfinished line (the bar is going away)."""
        with self._lock:
            if self._pending:
                self._emit(self._pending)
                self._pending = ""

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ...
        return getattr(self._stream, name)


def _in_terminal(bar: Any) -> bool:
    """Whether ``bar`` draws text on a stream (not ``tqdm.notebook``'s widget) and is shown."""
    if getattr(bar, "disable", False):
        return False
    try:
        from tqdm.notebook import tqdm_notebook
    except ImportError:  # pragma: no cover - part of tqdm
        return True
    return not isinstance(bar, tqdm_notebook)


@contextlib.contextmanager
def progress_bar(desc: str, total: int, show: bool = True, unit: str = "step") -> Iterator[Any]:
    """A ``tqdm.auto`` bar (a widget in a notebook) on ``sys.stderr``; in a terminal, everything printed or logged while
    it shows goes above it (module docstring). Closed, and ``sys.stdout`` / ``sys.stderr`` and the log handlers
    restored, on exit, also on an exception (Ctrl-C).

    Args:
        desc: the bar's label (the run's name).
        total: steps of the run.
        show: ``False``: a disabled bar (no output, nothing redirected).
        unit: the unit of ``total``.

    Yields:
        The bar (``update``, ``set_postfix``).
    """
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    bar = tqdm(total=total, desc=desc, unit=unit, disable=not show, file=sys.stderr)
    if not _in_terminal(bar):
        try:
            yield bar
        finally:
            bar.close()
        return
    streams = sys.stdout, sys.stderr
    above = AboveTheBar(streams[0], bar), AboveTheBar(streams[1], bar)
    try:
        with logging_redirect_tqdm([logging.root, logging.getLogger("ray")], tqdm_class=type(bar)):
            sys.stdout, sys.stderr = above
            try:
                yield bar
            finally:
                sys.stdout, sys.stderr = streams
                for stream in above:
                    stream.close_pending()
    finally:
        bar.close()


def draw_progress(bar: Any, status: dict, eval_history: list, done_steps: int) -> int:
    """One poll of a run on ``bar``: the steps logged and, beside the count, the last logged step's ``reward/mean``,
    version lag and the latest held-out accuracy. The count is the last logged row's ``step``: the trainer counts a
    step (``global_steps``) before its sync and its row, so counting ``global_steps`` showed ``1/2 ... reward=0.00``
    while step 1's row said 0.52 (a fresh user's pass, session 32).

    Args:
        bar: a tqdm bar (:func:`progress_bar`).
        status: ``FullyAsyncTrainer.status()`` (``history``: the trainer's rows, each with its ``step``).
        eval_history: the rollouter's evaluations (``accuracy`` of each).
        done_steps: the steps the bar counts so far.

    Returns:
        The steps the bar counts now.
    """
    last = status["history"][-1] if status["history"] else {}
    steps = int(last.get("step", done_steps))  # no row yet: the count stays
    bar.set_postfix(reward=f"{last.get('reward/mean', 0):.2f}", lag=f"{last.get('staleness/lag_max', 0):.0f}",
                    acc=f"{eval_history[-1]['accuracy']:.2f}" if eval_history else "-", refresh=False)
    bar.update(steps - done_steps)
    bar.refresh()  # also without a new step: an evaluation's accuracy
    return steps
