"""Run directory names: ``{experiment_name}__{seed}__{YYYYmmdd-HHMMSS}`` made (:func:`run_name`), found again
(:func:`run_name_pattern`, for ``trainer.resume_mode=auto``) and kept within the file system's limit on one name
(:func:`name_max`, :func:`run_name_bytes`: a name past it failed with an OSError when the run started).

Standard library only: the config check, the data-derived names and the checkpoint lookup import it.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Optional

TIME_FORMAT = "%Y%m%d-%H%M%S"
"""The time stamp of a run directory's name (local time, to the second)."""

_TIME_PATTERN = r"\d{8}-\d{6}"  # what TIME_FORMAT writes (years 1000-9999)

NAME_MAX = 255
"""Bytes one file name may hold on Linux (ext4, xfs, btrfs, tmpfs) and macOS: the fallback of :func:`name_max`."""

SEED_ROOM = len(str(2**32 - 1))
"""Digits a derived name leaves for the seed: 10 (``trainer.seed < 2**32``, :data:`asyncrl.config_ranges.SEED_SPACE`)."""

DERIVED_NAME_MAX = NAME_MAX - len(f"__{'0' * SEED_ROOM}__YYYYmmdd-HHMMSS")
"""Bytes of an ``experiment_name`` the library derives (:func:`asyncrl.config_data.data_experiment_name`): 226, so its
run directory name fits :data:`NAME_MAX` whatever the seed."""


def run_name(experiment_name: str, seed: int, when: Optional[float] = None) -> str:
    """``{experiment_name}__{seed}__{YYYYmmdd-HHMMSS}`` (``when``: seconds since the epoch, default now)."""
    return f"{experiment_name}__{seed}__{time.strftime(TIME_FORMAT, time.localtime(when or time.time()))}"


def claim_run_dir(parent: str | os.PathLike, experiment_name: str, seed: int, when: float,
                  tries: int = 3600) -> Path:
    """Create and return a run directory ``parent/{experiment_name}__{seed}__{YYYYmmdd-HHMMSS}`` no other run holds.

    The name is :func:`run_name` at ``when`` (seconds since the epoch); when a directory of that name exists (a run of
    the same experiment and seed started in the same second: two test workers, two notebooks, a sweep's processes),
    the next second's name is tried, so each run gets its own directory and the names keep their form and order
    (:func:`run_name_pattern` still finds them). The claim is ``mkdir`` without ``exist_ok``: atomic across processes.

    Raises:
        FileExistsError: ``tries`` names in a row were taken (a directory filled by hand with future time stamps).
        OSError: the parent cannot be created or written.
    """
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    for k in range(tries):
        path = parent / run_name(experiment_name, seed, when=when + k)
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free run directory for {experiment_name!r} seed {seed} under {parent}: the {tries} "
                          f"names from {run_name(experiment_name, seed, when=when)} on are taken")


def run_name_pattern(experiment_name: str, seed: int) -> re.Pattern:
    """What matches (``fullmatch``) exactly the names :func:`run_name` makes for ``experiment_name`` and ``seed``:
    the name and seed taken literally, then the time stamp's form. A glob ``{name}__{seed}__*`` also matched the
    runs of another experiment whose name starts with ``{name}__{seed}__`` (experiment ``x`` seed 1 took the runs of
    ``x__1__y``)."""
    return re.compile(rf"{re.escape(experiment_name)}__{re.escape(str(seed))}__{_TIME_PATTERN}")


def run_name_bytes(experiment_name: str, seed: int) -> int:
    """Bytes (UTF-8) of the run directory name of ``experiment_name`` and ``seed``."""
    return len(run_name(experiment_name, seed, when=0).encode("utf-8", "surrogateescape"))


def name_max(directory: str | os.PathLike) -> int:
    """The longest file name, in bytes, the file system of ``directory`` takes (``os.pathconf``'s ``PC_NAME_MAX``
    of it, or of its nearest existing parent when it does not exist yet); :data:`NAME_MAX` where that cannot be
    asked (another platform, no such parent)."""
    path = Path(directory).expanduser().absolute()
    for candidate in (path, *path.parents):
        if candidate.exists():
            try:
                limit = os.pathconf(candidate, "PC_NAME_MAX")
            except (OSError, ValueError, AttributeError):  # no pathconf (Windows), or the file system will not say
                return NAME_MAX
            return limit if isinstance(limit, int) and limit > 0 else NAME_MAX
    return NAME_MAX


def run_name_length_problem(experiment_name: object, seed: int, default_local_dir: object) -> Optional[str]:
    """Why ``trainer.experiment_name`` cannot name runs, or ``None``: its run directory name
    (``{name}__{seed}__{YYYYmmdd-HHMMSS}``) is longer than the file system of ``trainer.default_local_dir`` takes in one
    name (:func:`name_max`, 255 bytes on Linux and macOS): it failed with an OSError once the run had started (a
    derived name always fits 255: :func:`asyncrl.config_data.data_experiment_name`)."""
    name = str(experiment_name)
    limit = name_max(default_local_dir)
    over = run_name_bytes(name, seed) - limit
    if over <= 0:
        return None
    n = len(name.encode("utf-8", "surrogateescape"))
    shown = name if len(name) <= 40 else f"{name[:37]}..."
    return (f"trainer.experiment_name={shown!r} is too long: {n} bytes, and its run directories "
            f"<name>__{seed}__<YYYYmmdd-HHMMSS> would be named with {limit + over} bytes, {over} "
            f"over the file system's limit of {limit} bytes per file name (under "
            f"trainer.default_local_dir={default_local_dir!r}): use a name of at most {n - over} bytes")
