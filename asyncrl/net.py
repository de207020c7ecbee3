"""Choosing a TCP port that another process will bind: :func:`free_port`, outside the kernel's ephemeral range.

The race it avoids: ``bind(("", 0))`` / ``getsockname()`` / ``close()`` gets a port from the kernel's
*ephemeral* range (Linux: ``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default), the range
the kernel also draws from for the local end of every outgoing connection of every process. Between the
``close()`` and the moment the real server binds the number, any connection on the machine (Ray's gRPC
channels, a pip download, another test) may be given that port, and the server fails with
``EADDRINUSE`` (``tests/test_nccl_engine_cpu.py`` did, on 33699). A port *outside* the ephemeral range is
never handed out by the kernel on its own, so only a program that picks the same number on purpose can
take it in between; within this process, the ports :func:`free_port` returned lately are not returned again.

The window, always at or above :data:`PORT_FLOOR` (Ray's and the usual services' ports lie below it)::

    ephemeral range starts above the floor    [PORT_FLOOR, low)            (default: 20000-32767)
    else, room above the range's end          [max(PORT_FLOOR, high+1), 65535]
    else                                      a port the kernel picks, with a WARNING (the race is back)

Use :func:`free_port` only where the number must be decided before the process that binds it exists
(torch.distributed's ``MASTER_PORT``, a TCPStore in another process, a subprocess's server). A server this
process owns should bind port 0 itself and report the port it got (``TCPStore(host, 0, ...).port``,
zmq's ``bind_to_random_port``): no window, no race.
"""

from __future__ import annotations

import collections
import logging
import os
import random
import socket
import threading
from typing import Optional

logger = logging.getLogger(__name__)

EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
"""Linux's ephemeral port range, ``"<low>\\t<high>"``; read on every :func:`free_port` call."""
DEFAULT_EPHEMERAL_RANGE = (32768, 65535)
"""Range assumed where the file is absent, unreadable or not two ports ``low <= high``: Linux's low end, and
a high end that also covers IANA's 49152-65535 (macOS, Windows), so no port above it is ever taken for free."""
DEFAULT_EPHEMERAL_LOW = DEFAULT_EPHEMERAL_RANGE[0]
"""Lower bound assumed where the file is absent or unreadable."""
PORT_FLOOR = 20000
"""Lowest port :func:`free_port` picks: above the registered services people run (8080, 6379 Ray GCS,
8265 Ray dashboard, 10001 Ray client) and Ray's default worker ports (10002-19999)."""
RECENT_PORTS = 1024
"""How many of its latest answers :func:`free_port` remembers and does not give again (at most a quarter of
the window, so a small window is never used up by memory alone)."""

_recent: collections.deque[int] = collections.deque(maxlen=RECENT_PORTS)
_lock = threading.Lock()  # guards _recent across the pick, so two threads never get the same port


def _new_lock_in_child() -> None:  # a fork while another thread held the lock would leave the child's locked
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's ephemeral range ``(low, high)``, inclusive, from :data:`EPHEMERAL_RANGE_FILE`, else
    :data:`DEFAULT_EPHEMERAL_RANGE`."""
    try:
        with open(EPHEMERAL_RANGE_FILE) as f:
            low, high = (int(x) for x in f.read().split())
    except (OSError, ValueError):  # absent, garbled, or not exactly two numbers
        return DEFAULT_EPHEMERAL_RANGE
    return (low, high) if 1 <= low <= high <= 65535 else DEFAULT_EPHEMERAL_RANGE


def ephemeral_port_low() -> int:
    """The lowest port of the kernel's ephemeral range (see :func:`ephemeral_port_range`)."""
    return ephemeral_port_range()[0]


def _addresses(host: str) -> list[tuple[int, tuple]]:
    """``(family, sockaddr)`` of each address ``host`` names that this machine can bind.

    ``""`` means every interface: ``0.0.0.0`` and, where the machine has IPv6, ``::`` (a port held by an
    IPv6-only listener, such as a dual-stack server's ``[::1]`` half, is then seen as taken).
    """
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host  # "[::1]" as in URLs
    try:
        infos = socket.getaddrinfo(name or None, 0, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ValueError(f"free_port: cannot resolve host {host!r}: {exc}") from None
    usable, errors = [], []
    for family, _, _, _, sockaddr in infos:
        if (family, sockaddr) in usable:
            continue
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind(sockaddr)  # port 0: may this machine bind the address at all?
        except OSError as exc:  # no IPv6 here (EAFNOSUPPORT), or not a local address (EADDRNOTAVAIL)
            errors.append(f"{sockaddr[0]}: {exc.strerror}")
            continue
        usable.append((family, sockaddr))
    if not usable:
        raise ValueError(f"free_port: host {host!r} has no address this machine can bind ({'; '.join(errors)})")
    return usable


def _bindable(addrs: list[tuple[int, tuple]], port: int) -> bool:
    """Whether ``port`` binds on every address (without ``SO_REUSEADDR``: lingering connections count)."""
    for family, sockaddr in addrs:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((sockaddr[0], port, *sockaddr[2:]))
            except OSError:
                return False
    return True


def _window(low: int, high: int) -> Optional[tuple[int, int]]:
    """The half-open port window :func:`free_port` draws from (module docstring), or None when there is none."""
    if low > PORT_FLOOR:
        return PORT_FLOOR, low
    start = max(PORT_FLOOR, high + 1)
    return (start, 65536) if start <= 65535 else None


def free_port(host: str = "", attempts: int = 64, rng: Optional[random.Random] = None) -> int:
    """A TCP port free now and outside the kernel's ephemeral range, for another process to bind.

    Tries up to ``attempts`` random ports of the window (module docstring: ``[PORT_FLOOR, low)`` by
    default) by binding each briefly on every address of ``host``, skipping the last :data:`RECENT_PORTS`
    ports this process returned. Two processes that pick at random may still collide (about 1 in 12,800
    per pair with the default range); the kernel never will, and one process never gets a port twice in a
    row of :data:`RECENT_PORTS` calls. Thread-safe.

    Args:
        host: address, name or ``[IPv6]`` to test the bind on; each address it resolves to must be free.
            ``""`` (every interface, the default: IPv4 and, where the machine has it, IPv6) is the strictest
            check and what a server listening on all interfaces (a TCPStore master) needs.
        attempts: random candidates to try before giving up.
        rng: random source (tests); default the ``random`` module's.

    Returns:
        The port number, at or above :data:`PORT_FLOOR` and outside the ephemeral range. Where the range
        leaves no such port (it starts at or below the floor and runs to 65535), falls back to a port the
        kernel chose, with a warning: the race described in this module is back there.

    Raises:
        ValueError: ``host`` does not resolve, or names no address this machine can bind; ``attempts < 1``.
        RuntimeError: every candidate was taken (the message names the window and the range's source).
    """
    if attempts < 1:
        raise ValueError(f"free_port: attempts must be at least 1, got {attempts}")
    addrs = _addresses(host)
    low, high = ephemeral_port_range()
    window = _window(low, high)
    with _lock:
        if window is None:
            return _remember(_kernel_port(addrs, attempts, low, high))
        lo, hi = window
        recent = set(list(_recent)[-((hi - lo) // 4):]) if hi - lo >= 4 else set()
        pick = rng or random
        tried, skipped = [], 0
        for _ in range(attempts):
            port = pick.randrange(lo, hi)
            if port in recent:
                skipped += 1
            elif _bindable(addrs, port):
                return _remember(port)
            else:
                tried.append(port)
    lately = f", {skipped} of them because this process returned them lately" if skipped else ""
    raise RuntimeError(f"no free TCP port on host {host!r}: {attempts} random ports in {lo}-{hi - 1} were all taken "
                       f"(the window lies outside the ephemeral range {low}-{high}, from {EPHEMERAL_RANGE_FILE}"
                       f"{lately}); tried e.g. {tried[:5]}")


def _kernel_port(addrs: list[tuple[int, tuple]], attempts: int, low: int, high: int) -> int:
    logger.warning("ephemeral port range %d-%d (%s) leaves no port at or above %d outside it, so a port the kernel "
                   "chose is returned and may be taken before it is bound", low, high, EPHEMERAL_RANGE_FILE, PORT_FLOOR)
    family, sockaddr = addrs[0]
    port = 0
    for _ in range(max(attempts, 1)):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind(sockaddr)
            port = s.getsockname()[1]
        if port not in _recent and _bindable(addrs[1:], port):
            break
    return port


def _remember(port: int) -> int:
    _recent.append(port)
    return port
