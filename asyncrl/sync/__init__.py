"""Weight synchronisation: bucket layout, checkpoint-engine contract and the built-in engines.

Engines register lazily (``get_engine_cls(name)``): ``cpu`` (the faster CPU transport, measured
in ``benchmarks/weight_sync_cpu.py``), ``gloo`` (torch gloo broadcast) and ``cpu_rpc`` (Ray object
refs + vLLM collective RPC) and ``nccl`` (GPU bucketed broadcast, double-buffered, into the replicas:
:mod:`asyncrl.sync.nccl_replicas` around :mod:`asyncrl.sync.nccl_engine`) and ``cuda_ipc`` (a colocated
trainer rank shares its GPU buckets with the replica on the same GPU: :mod:`asyncrl.sync.cuda_ipc`).
"""

from asyncrl.sync.base import CHECKPOINT_ENGINES, CheckpointEngine, _lazy, get_engine_cls, register_engine

register_engine("cpu", _lazy("asyncrl.sync.cpu_engine", "CPUCheckpointEngine"))
register_engine("gloo", _lazy("asyncrl.sync.cpu_engine", "GlooCheckpointEngine"))
register_engine("cpu_rpc", _lazy("asyncrl.sync.cpu_engine", "RayRPCCheckpointEngine"))
register_engine("nccl", _lazy("asyncrl.sync.nccl_replicas", "NCCLReplicaEngine"))
register_engine("cuda_ipc", _lazy("asyncrl.sync.cuda_ipc", "CudaIpcCheckpointEngine"))

__all__ = ["CHECKPOINT_ENGINES", "CheckpointEngine", "get_engine_cls", "register_engine"]
