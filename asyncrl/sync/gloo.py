"""Stand-alone gloo groups for the ``cpu`` / ``gloo`` weight sync (trainer rank 0 + every engine worker).

Used by both ends: :class:`asyncrl.sync.cpu_engine.GlooCheckpointEngine` (sender) and the receivers
(:mod:`asyncrl.sync.receiver` in-process, :mod:`asyncrl.rollout.vllm_worker_ext` inside vLLM's
worker). The group is built without a global ``init_process_group`` because vLLM (and an FSDP
trainer) own the default group of their processes.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist


def local_address_towards(host: str, port: int) -> str:
    """The local interface address that routes to ``host`` (loopback stays loopback)."""
    if host in ("127.0.0.1", "localhost", "::1"):
        return host
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # no packet is sent
        s.connect((host, port))
        return s.getsockname()[0]


def make_gloo_group(host: str, port: int, rank: int, world_size: int, timeout_s: float) -> dist.ProcessGroup:
    """A stand-alone gloo group; rank 0 (the trainer) hosts the TCPStore at ``host:port``.

    Every rank binds its gloo device to its own interface towards ``host``. Use
    :func:`gloo_broadcast`: the ``dist.broadcast(group=...)`` helpers map global ranks and do not
    apply to this group.
    """
    timeout = timedelta(seconds=timeout_s)
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
