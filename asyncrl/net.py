"""Choosing a TCP port that another process will bind: :func:`free_port`, below the kernel's ephemeral range.

The race it avoids: ``bind(("", 0))`` / ``getsockname()`` / ``close()`` gets a port from the kernel's
*ephemeral* range (Linux: ``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default), the range
the kernel also draws from for the local end of every outgoing connection of every process. Between the
``close()`` and the moment the real server binds the number, any connection on the machine (Ray's gRPC
channels, a pip download, another test) may be given that port, and the server fails with
``EADDRINUSE`` (``tests/test_nccl_engine_cpu.py`` did, on 33699). A port *below* the ephemeral range is
never handed out by the kernel on its own, so only a program that picks the same number on purpose can
take it in between.

Use :func:`free_port` only where the number must be decided before the process that binds it exists
(torch.distributed's ``MASTER_PORT``, a TCPStore in another process, a subprocess's server). A server this
process owns should bind port 0 itself and report the port it got (``TCPStore(host, 0, ...).port``,
zmq's ``bind_to_random_port``): no window, no race.
"""

from __future__ import annotations

import logging
import random
import socket
from typing import Optional

logger = logging.getLogger(__name__)

EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
"""Linux's ephemeral port range, ``"<low>\\t<high>"``; read on every :func:`free_port` call."""
DEFAULT_EPHEMERAL_LOW = 32768
"""Lower bound assumed where the file is absent or unreadable (Linux's and IANA's ranges start at or above it)."""
PORT_FLOOR = 20000
"""Lowest port :func:`free_port` picks: above the registered services people run (8080, 6379 Ray GCS,
8265 Ray dashboard, 10001 Ray client) and Ray's default worker ports (10002-19999)."""


def ephemeral_port_low() -> int:
    """The lowest port of the kernel's ephemeral range (from :data:`EPHEMERAL_RANGE_FILE`, else 32768)."""
    try:
        with open(EPHEMERAL_RANGE_FILE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "", attempts: int = 64, rng: Optional[random.Random] = None) -> int:
    """A TCP port free now and outside the kernel's ephemeral range, for another process to bind.

    Tries up to ``attempts`` random ports in ``[PORT_FLOOR, ephemeral low)`` by binding each briefly
    (without ``SO_REUSEADDR``, so a port with lingering connections counts as taken). Two callers that
    pick at random may still collide (about 1 in 12,800 per pair with the default range); the kernel
    never will.

    Args:
        host: address to test the bind on; ``""`` (every interface, the default) is the strictest check
            and what a server listening on all interfaces (a TCPStore master) needs.
        attempts: random candidates to try before giving up.
        rng: random source (tests); default the ``random`` module's.

    Returns:
        The port number, below the ephemeral range. Where that range starts at or below 1024 (no
        unprivileged port lies below it), falls back to a kernel-chosen port with a warning: the race
        described in this module is back there.

    Raises:
        RuntimeError: every candidate was taken (the message names the window and the range's source).
    """
    low = ephemeral_port_low()
    lo = PORT_FLOOR if low > PORT_FLOOR else 1024
    if low <= lo:
        logger.warning("ephemeral port range starts at %d (%s): no port below it to pick, so a port the kernel "
                       "chose is returned and may be taken before it is bound", low, EPHEMERAL_RANGE_FILE)
        with socket.socket() as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    pick = rng or random
    tried = []
    for _ in range(attempts):
        port = pick.randrange(lo, low)
        if _bindable(host, port):
            return port
        tried.append(port)
    raise RuntimeError(f"no free TCP port on host {host!r}: {attempts} random ports in {lo}-{low - 1} were all taken "
                       f"(the window ends below the ephemeral range's start {low}, from {EPHEMERAL_RANGE_FILE}); "
                       f"tried e.g. {tried[:5]}")
