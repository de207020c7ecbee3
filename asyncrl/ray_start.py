"""Starting (or joining) Ray for a run, a notebook session or a benchmark.

:func:`init_ray` is ``ray.init`` with the project's defaults (no dashboard, ``TOKENIZERS_PARALLELISM=false`` and the
driver's log format and level in every worker: :mod:`asyncrl.logs`) and retries for a local start; :func:`check_reachable` refuses a ``ray.address`` nothing answers at in
seconds (Ray itself retries its GCS for minutes). Used by :class:`asyncrl.experiment.Experiment`,
:func:`asyncrl.notebook.start_ray` and ``benchmarks/async_vs_colocate.py``.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Optional

import ray

from asyncrl.config import ConfigError

logger = logging.getLogger(__name__)


def init_ray(address: Optional[str], num_cpus: Optional[int], attempts: int = 3, log_to_driver: bool = True,
             log_level: Optional[int] = None) -> None:
    """``ray.init`` that survives a slow start: a local raylet has a hard-coded 30 s deadline to
    register, which an overloaded laptop can miss; each failed attempt is shut down and retried.
    ``log_to_driver=False`` keeps actors' output out of the caller (notebooks: ``asyncrl.notebook``). Every worker
    process logs in the driver's format, its ``asyncrl`` loggers at ``log_level`` (``None``: the driver's now;
    :func:`asyncrl.logs.ray_runtime_env`).

    Raises:
        asyncrl.config.ConfigError: ``address`` names a host:port nothing answers on (Ray itself retried its GCS for
            minutes, session 30).
        Exception: Ray's own start error after ``attempts`` tries.
    """
    check_reachable(address)
    for attempt in range(1, attempts + 1):
        try:
            ray.init(address=address, num_cpus=num_cpus if address is None else None, include_dashboard=False,
                     log_to_driver=log_to_driver, runtime_env=runtime_env(log_level))
            return
        except Exception as exc:  # Ray raises a bare Exception for the start timeout
            ray.shutdown()
            if attempt == attempts or address is not None:
                raise
            logger.warning("Ray did not start (attempt %d/%d): %s; retrying", attempt, attempts, exc)
            time.sleep(2.0)


def runtime_env(log_level: Optional[int] = None) -> dict:
    """The job's runtime env: ``TOKENIZERS_PARALLELISM=false`` in every worker, and the driver's log format and
    level (:func:`asyncrl.logs.ray_runtime_env`: Ray's ``worker_process_setup_hook``)."""
    from asyncrl.logs import ray_runtime_env

    env = ray_runtime_env(log_level)
    env["env_vars"] = {"TOKENIZERS_PARALLELISM": "false", **env["env_vars"]}
    return env


def check_reachable(address: Optional[str], timeout_s: float = 5.0) -> None:
    """A ``host:port`` / ``ray://host:port`` Ray address answers a TCP connection within ``timeout_s`` (``None``,
    ``auto`` and ``local`` are Ray's to resolve)."""
    if not address or address in ("auto", "local"):
        return
    host, _, port = address.split("://", 1)[-1].rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        return  # a form Ray resolves itself
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConfigError(f"ray.address={address!r}: nothing answers at {host}:{port} ({type(exc).__name__}: "
                          f"{exc}); start the cluster there (ray start --head), fix the address, or leave it null for "
                          "a local Ray") from None
