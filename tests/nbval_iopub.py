"""pytest plugin for nbval runs: the test process's kernel client keeps every IOPub message.

nbval reads a cell's IOPub messages only after the kernel's execute reply, so during a long cell they
queue in ZeroMQ. Past the default high-water mark (1,000 messages on the client's SUB socket, 1,000 more on
the kernel's PUB socket) the kernel's PUB socket drops new ones, the kernel's final ``status: idle`` among
them, and nbval fails the cell with "Timeout of 5 seconds exceeded waiting for output" although it ran.
A chapter's live dashboard sends ~10-25 widget updates per poll (0.75 s), so a run cell of a few minutes
on a slow box passes that mark (CI, 2026-12-01: 01_four_modes cell 4). In a browser the server drains
IOPub continuously; papermill/nbclient read it while the cell runs; only nbval's order needs this.

Load with ``pytest -p nbval_iopub --nbval-lax ...`` (``tests/`` on ``PYTHONPATH``): SUB sockets the
test process opens get no receive limit (``RCVHWM=0``), so the client's ZeroMQ I/O thread keeps draining
the kernel's PUB socket and nothing is dropped; the messages wait in the test process's memory.
"""

from __future__ import annotations

import zmq

_socket = zmq.Context.socket


def _socket_without_receive_limit(self, socket_type, *args, **kwargs):
    sock = _socket(self, socket_type, *args, **kwargs)
    if socket_type == zmq.SUB:  # jupyter_client's IOPub channel; set before it connects
        sock.rcvhwm = 0
    return sock


def pytest_configure(config) -> None:
    zmq.Context.socket = _socket_without_receive_limit
