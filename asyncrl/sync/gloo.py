"""Stand-alone gloo groups for the ``cpu`` / ``gloo`` weight sync (trainer rank 0 + every engine worker).

Used by both ends: :class:`asyncrl.sync.cpu_engine.GlooCheckpointEngine` (sender) and the receivers
(:mod:`asyncrl.sync.receiver` in-process, :mod:`asyncrl.rollout.vllm_worker_ext` inside vLLM's
worker). The group is built without a global ``init_process_group`` because vLLM (and an FSDP
trainer) own the default group of their processes.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist


def local_address_towards(host: str, port: int) -> str:
    """The local interface address that routes to ``host`` (loopback stays loopback)."""
    if host in ("127.0.0.1", "localhost", "::1"):
        return host
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # no packet is sent
        s.connect((host, port))
        return s.getsockname()[0]


def open_gloo_store(host: str, port: int, world_size: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's TCPStore, listening from now on; ``port`` 0 lets the kernel pick (read it from ``.port``).

    Open it before telling the other ranks where to connect: the port is held from the moment it is
    chosen, so nothing can take it in between (see :mod:`asyncrl.net` for that race).
    """
    return dist.TCPStore(host, port, world_size, is_master=True, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def make_gloo_group(host: str, port: int, rank: int, world_size: int, timeout_s: float,
                    store: Optional[dist.Store] = None) -> dist.ProcessGroup:
    """A stand-alone gloo group; rank 0 (the trainer) hosts the TCPStore at ``host:port``.

    Every rank binds its gloo device to its own interface towards ``host``. Use
    :func:`gloo_broadcast`: the ``dist.broadcast(group=...)`` helpers map global ranks and do not
    apply to this group.

    Args:
        store: rank 0's store from :func:`open_gloo_store` (then ``port`` is its ``.port``); default:
            rank 0 opens one at ``port``, the others connect to it.
    """
    timeout = timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(host, port, world_size, is_master=(rank == 0), timeout=timeout, wait_for_workers=False)
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    device_host = host if rank == 0 else local_address_towards(host, port)
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=device_host)]
    return dist.ProcessGroupGloo(dist.PrefixStore("asyncrl_weights", store), rank, world_size, opts)


def gloo_broadcast(group: dist.ProcessGroup, tensor: torch.Tensor, root: int = 0) -> None:
    """Blocking in-place broadcast of one CPU tensor from ``root``."""
    opts = dist.BroadcastOptions()
    opts.rootRank = root
    group.broadcast([tensor], opts).wait()
