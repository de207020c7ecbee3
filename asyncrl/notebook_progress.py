"""Status lines of a teaching notebook: a line that ticks while something slow starts, and a run's line
that, when the run ends, says so (steps, final version, wall time) or gives the failure.

::

    Progress("starting the vllm engine")   ⏳ ... 12 s  (ticks)  -> ✓ final text | ✗ failed after N s
    RunLine(exp, line, up_s).watch()       the run's start line, rewritten when exp.summary appears
         |                                 (or when the run is stopped without one)
         v
    ✓ mode_a__0__... done: 3 steps, final version v3, in 31 s (actors up in 20 s)
    ✗ mode_a__0__... failed after 12 s: trainer error at step 2: ... (actors up in 9 s)

Used through :class:`asyncrl.notebook.NotebookSession`; nothing here is needed outside a notebook.
"""

from __future__ import annotations

import asyncio
import html
import logging
import time
from typing import Any, Optional

logger = logging.getLogger("asyncrl.notebook")  # one logger for the notebook helper, whichever file logs

OK_COLOR, FAIL_COLOR = "#237804", "#a8071a"


def in_notebook() -> bool:
    """True inside an IPython kernel (Jupyter, papermill, nbval)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class _Line:
    """A one-line rich output (HTML in Jupyter, plain text elsewhere)."""

    def __init__(self, text: str, color: str = "#555"):
        self.text, self.color = text, color

    def _repr_html_(self) -> str:
        return f'<span style="font-family:monospace;color:{self.color}">{html.escape(self.text)}</span>'

    def __repr__(self) -> str:
        return self.text


def show(text: str, color: str = "#555") -> None:
    """One plain line as an output (``print`` in scripts)."""
    if in_notebook():
        from IPython.display import display

        display(_Line(text, color))
    else:
        print(text)  # noqa: T201 - scripts running a notebook's code want the line on stdout


class Progress:
    """A status line that ticks while something slow runs (engine start, actor start).

    In a notebook it is one output updated in place; elsewhere it logs the start and the end.

    Args:
        what: e.g. ``"starting vLLM engine replica_0"``.
        tick_s: seconds between updates of the elapsed time.
    """

    def __init__(self, what: str, tick_s: float = 1.0):
        self.what, self.tick_s = what, tick_s
        self.t0 = time.monotonic()
        self._handle = None
        self._task: Optional[asyncio.Task] = None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0

    def _show(self, text: str, color: str = "#555") -> None:
        if self._handle is not None:
            self._handle.update(_Line(text, color))

    def __enter__(self) -> "Progress":
        self.t0 = time.monotonic()
        if in_notebook():
            from IPython.display import display

            self._handle = display(_Line(f"⏳ {self.what} ..."), display_id=True)
        else:
            logger.info("%s ...", self.what)
        return self

    async def __aenter__(self) -> "Progress":
        self.__enter__()
        if self._handle is not None:
            self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            self._show(f"⏳ {self.what} ... {self.elapsed_s:.0f} s")

    def done(self, text: str) -> None:
        """Replace the line by its final text (call inside the ``with`` block)."""
        self._final = text

    def rewrite(self, text: str, ok: bool = True) -> None:
        """Replace the finished line by a later state (``✓ text`` or ``✗ text``); logged outside a notebook."""
        self._show(f"{'✓' if ok else '✗'} {text}", OK_COLOR if ok else FAIL_COLOR)
        if self._handle is None:
            logger.log(logging.INFO if ok else logging.WARNING, "%s", text)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._task is not None:
            self._task.cancel()
        if exc_type is None:
            text = getattr(self, "_final", None) or f"{self.what}: done in {self.elapsed_s:.0f} s"
            self._show(f"✓ {text}", OK_COLOR)
            if self._handle is None:
                logger.info("%s", text)
        else:
            self._show(f"✗ {self.what}: failed after {self.elapsed_s:.0f} s ({exc_type.__name__})", FAIL_COLOR)

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)


def run_end_text(name: str, summary: Any, up_s: float) -> tuple[str, bool]:
    """The final words of a run's status line, and whether it ended well.

    Args:
        name: the experiment name.
        summary: its :class:`~asyncrl.summary.Summary`, or ``None`` (stopped before it finished).
        up_s: seconds the actors took to come up.

    Returns:
        ``("<name> done: 3 steps, final version v3, in 31 s (actors up in 20 s)", True)``; a trainer
        error gives ``("<name> failed after 12 s: trainer error at step 2: ...", False)``.
    """
    up = f"(actors up in {up_s:.0f} s)"
    if summary is None:
        return f"{name} stopped before its end {up}", False
    reason = summary.stop_reason or ""
    if reason.startswith("trainer error"):
        return f"{name} failed after {summary.wall_s:.0f} s: {reason} {up}", False
    why = "" if not reason or "total_training_steps" in reason else f" ({reason})"
    return (f"{name} done: {summary.steps} steps, final version v{summary.param_version}, "
            f"in {summary.wall_s:.0f} s{why} {up}"), True


class RunLine:
    """A run's start line, rewritten when the run ends (``exp.summary`` set by ``finish``), or when the
    run is stopped without a summary: whoever waits for the run (``nb.run`` or ``exp.wait_async``).

    Args:
        exp: the started :class:`~asyncrl.experiment.Experiment`.
        line: its start :class:`Progress` (already exited).
        up_s: seconds its actors took to come up.
        poll_s: how often :meth:`watch` looks at ``exp`` (an attribute read; no Ray call).
    """

    def __init__(self, exp: Any, line: Progress, up_s: float, poll_s: float = 0.5):
        self.exp, self.line, self.up_s, self.poll_s = exp, line, up_s, poll_s
        self.final: Optional[str] = None
        self._task: Optional[asyncio.Task] = None

    def _ended(self) -> bool:
        return self.exp.summary is not None or (self.exp.trainer is None and self.exp.rollouter is None)

    def settle(self) -> str:
        """Write the final text now (idempotent); returns it."""
        try:
            current = asyncio.current_task()
        except RuntimeError:  # no running loop (a script's close())
            current = None
        if self._task is not None and self._task is not current:
            self._task.cancel()
        if self.final is None:
            self.final, ok = run_end_text(self.exp.name, self.exp.summary, self.up_s)
            self.line.rewrite(self.final, ok)
        return self.final

    async def _watch(self) -> None:
        while not self._ended():
            await asyncio.sleep(self.poll_s)
        self.settle()

    def watch(self) -> "RunLine":
        """Settle the line in the background when the run ends (needs a running event loop)."""
        self._task = asyncio.get_running_loop().create_task(self._watch())
        return self

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
