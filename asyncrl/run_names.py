"""Run directory names: ``{experiment_name}__{seed}__{YYYYmmdd-HHMMSS}`` made (:func:`run_name`), found again
(:func:`run_name_pattern`, for ``trainer.resume_mode=auto``).

Standard library only: the checkpoint lookup imports it.
"""

from __future__ import annotations

import re
import time
from typing import Optional

TIME_FORMAT = "%Y%m%d-%H%M%S"
"""The time stamp of a run directory's name (local time, to the second)."""

_TIME_PATTERN = r"\d{8}-\d{6}"  # what TIME_FORMAT writes (years 1000-9999)


def run_name(experiment_name: str, seed: int, when: Optional[float] = None) -> str:
    """``{experiment_name}__{seed}__{YYYYmmdd-HHMMSS}`` (``when``: seconds since the epoch, default now)."""
    return f"{experiment_name}__{seed}__{time.strftime(TIME_FORMAT, time.localtime(when or time.time()))}"


def run_name_pattern(experiment_name: str, seed: int) -> re.Pattern:
    """What matches (``fullmatch``) exactly the names :func:`run_name` makes for ``experiment_name`` and ``seed``:
    the name and seed taken literally, then the time stamp's form. A glob ``{name}__{seed}__*`` also matched the
    runs of another experiment whose name starts with ``{name}__{seed}__`` (experiment ``x`` seed 1 took the runs of
    ``x__1__y``)."""
    return re.compile(rf"{re.escape(experiment_name)}__{re.escape(str(seed))}__{_TIME_PATTERN}")
