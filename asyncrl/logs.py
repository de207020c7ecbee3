"""One log line format for the driver and every Ray actor of a run: the level word and the logger's name.

::

    2026-12-01 12:00:00,123 WARNING asyncrl.experiment: <message>                             (the driver)
    (FullyAsyncRollouter pid=4242) 2026-12-01 12:00:00,123 WARNING asyncrl.rollouter: <message>   (an actor)

Set in one place per process: the CLI's ``logging.basicConfig`` with :data:`LOG_FORMAT` in the driver, and in every
Ray worker process of a run Ray's ``worker_process_setup_hook`` (:func:`setup_worker_logging`), which
:func:`asyncrl.ray_start.init_ray` puts in the job's runtime env with the driver's ``asyncrl`` level
(:func:`ray_runtime_env`), so it runs before any actor of the run is created. Before it, an actor had no handler:
Python's last-resort handler printed a WARNING as its bare message (no level, no logger) and dropped INFO; only the
trainer configured itself. Ray's ``ray.init(logging_config=ray.LoggingConfig(encoding="TEXT"))`` gives the level word
too, but appends about 300 characters of job, worker, node, actor and task ids to every line, sets the root logger's
level (every library's INFO: httpx, vLLM, transformers) and adds a second handler to the driver's root logger.
"""

from __future__ import annotations

import logging
import os
from typing import Optional, Union

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""Every asyncrl process's log line: time, level word, logger name, message."""
LEVEL_ENV = "ASYNCRL_LOG_LEVEL"
"""Environment variable carrying the driver's ``asyncrl`` level (a number) to the Ray workers of a run."""
SETUP_HOOK = "asyncrl.logs.setup_worker_logging"
"""Ray's ``worker_process_setup_hook`` for a run's job (imported by name in each worker)."""


def configure_logging(level: Union[int, str, None] = None) -> None:
    """This process's log lines in :data:`LOG_FORMAT` and its ``asyncrl`` loggers at ``level``.

    Args:
        level: a level number or name (``"INFO"``, ``"20"``); ``None`` leaves the ``asyncrl`` level as it is. Only the
            ``asyncrl`` logger is set: other libraries keep the root logger's level (WARNING in a Ray worker), so
            their INFO lines (an httpx line per request) stay out.

    The format goes on a handler of the root logger, added once (``logging.basicConfig``: a process that already has
    one keeps it), so other libraries' warnings carry the level word too.
    """
    logging.basicConfig(format=LOG_FORMAT)
    if level is not None:
        logging.getLogger("asyncrl").setLevel(int(level) if str(level).isdigit() else str(level).upper())


def setup_worker_logging() -> None:
    """Ray's ``worker_process_setup_hook``: :func:`configure_logging` at the level :data:`LEVEL_ENV` carries (the
    driver's when the run's Ray started)."""
    configure_logging(os.environ.get(LEVEL_ENV) or None)


def ray_runtime_env(level: Optional[int] = None) -> dict:
    """The part of a Ray job's runtime env that logs every worker as the driver does: the setup hook and the
    ``asyncrl`` level (``None``: the driver's effective one now), merged by :func:`asyncrl.ray_start.init_ray`."""
    if level is None:
        level = logging.getLogger("asyncrl").getEffectiveLevel()
    return {"worker_process_setup_hook": SETUP_HOOK, "env_vars": {LEVEL_ENV: str(int(level))}}
