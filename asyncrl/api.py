"""The seams between asyncrl's parts, as small typed protocols (AReaL-lite ``engine_api`` style).

::

    FullyAsyncTrainer ──update / compute_log_probs / state_dict──► TrainEngine   (cpu | fsdp2 rank)
            │ ParameterSynchronizer: pause -> WeightSender.send(v) -> resume
            ▼
    WeightSender ── named_tensors_for_sync() ──► CheckpointEngine.send_weights ──► replicas
                                                 (cpu/gloo | cpu_rpc | nccl)           │
    RolloutReplica ──generate / abort / pause / resume / weight methods──► InferenceEngine
                                                                         (vllm | hf)

Each protocol lists exactly the methods its callers use, under one name per method, so a backend
that misses one fails the conformance tests (``tests/test_api.py``), not a run. Implementations:
:class:`asyncrl.trainer.engine.TrainEngine`, :class:`asyncrl.trainer.fsdp_engine.FSDPEngine`;
:class:`asyncrl.rollout.vllm_backend.VLLMEngine`, :class:`asyncrl.rollout.hf_backend.HFEngine`;
the engines registered in :mod:`asyncrl.sync`; :class:`asyncrl.sync.sender.LocalWeightSender`,
:class:`asyncrl.trainer.worker_group.TrainWorkerGroup`.

Parameter versions have one owner: the inference engine's ``param_version`` (the weight version it
serves, set by ``finish_weight_update`` / ``*_receive``), reported per generated token in
:attr:`asyncrl.rollout.base.TokenOutput.response_versions`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Literal, Optional, Protocol, Sequence, runtime_checkable

import torch

from asyncrl.rollout.base import SamplingParams, TokenOutput

if TYPE_CHECKING:  # pragma: no cover
    from asyncrl.sync.bucket import ChunkMeta
    from asyncrl.trainer.engine import Batch

LossFn = Callable[[torch.Tensor, Any, Any, Optional[torch.Tensor]], tuple[torch.Tensor, dict]]
"""``loss_fn(log_probs (mb, resp_len) fp32, micro_batch, scale: LossScale, entropy or None) -> (loss, metrics)``;
``loss`` is the micro-batch's share of the step's loss (:func:`asyncrl.trainer.losses.agg_loss`)."""


@runtime_checkable
class TrainEngine(Protocol):
    """A policy model with its optimizer in one process (one rank of a data-parallel trainer)."""

    def compute_log_probs(self, batch: "Batch") -> torch.Tensor:
        """``(batch, resp_len)`` fp32 logprobs of the response tokens under the current weights (0 on pad)."""

    def compute_ref_log_probs(self, batch: "Batch") -> torch.Tensor:
        """Same under the frozen reference model (``use_kl_loss``)."""

    def update(self, batch: "Batch", loss_fn: LossFn, with_entropy: bool = False) -> dict[str, float]:
        """One optimizer step on this process's rows; returns metrics (``actor/grad_norm``, ``actor/lr`` ...).
        ``with_entropy``: pass the per-token entropy to ``loss_fn``."""

    def named_tensors_for_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(hf_name, full tensor)`` of every parameter the inference engine loads (collective on fsdp2)."""

    def state_dict(self) -> dict[str, Any]:
        """Model + optimizer + schedule state for a checkpoint (full tensors on CPU; collective on fsdp2)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


@runtime_checkable
class InferenceEngine(Protocol):
    """What a :class:`asyncrl.rollout.replica.RolloutReplica` calls on its backend. Coroutines unless noted.

    Attributes:
        param_version: the weight version being served (0 until the first sync).
        num_inflight: requests inside :meth:`generate`.
        num_weight_workers: processes that each join a weight broadcast (vLLM: TP x PP; hf: 1).
        iteration_window: optional; an :class:`asyncrl.rollout.engine_stats.IterationWindow` the engine records its
            iterations in (``None`` or absent: no ``rollout/engine_*`` metrics from it).
    """

    param_version: int

    @property
    def num_inflight(self) -> int: ...

    @property
    def num_weight_workers(self) -> int: ...

    async def start(self) -> None:
        """Load the model and get ready to serve."""

    async def shutdown(self) -> None:
        """Release processes, memory and ports."""

    async def generate(self, request_id: str, prompt_ids: Sequence[int], sampling_params: SamplingParams) -> TokenOutput:
        """Generate after ``prompt_ids``; an abort returns the tokens so far with ``stop_reason="aborted"``.
        ``response_versions`` holds the version that produced each token."""

    async def abort_all_requests(self) -> int:
        """Abort every in-flight request; returns how many."""

    async def pause(self, mode: Literal["abort", "wait", "keep"] = "abort") -> None:
        """Stop admitting work. ``abort``: abort in-flight; ``wait``: drain them; ``keep``: freeze them."""

    async def resume(self) -> None:
        """Undo :meth:`pause`."""

    # -- weights, RPC transport (cpu_rpc): buckets arrive as arguments
    async def begin_weight_update(self) -> None:
        """Prepare to receive buckets."""

    async def load_bucket(self, bucket: Any, metas: Sequence["ChunkMeta"]) -> None:
        """Load one ``(nbytes,)`` uint8 bucket (tensor or numpy) laid out by ``metas``."""

    async def finish_weight_update(self, version: int) -> int:
        """Check completeness, adopt ``version``; returns tensors loaded. Raises ``RuntimeError`` if incomplete."""

    # -- weights, broadcast transports: the trainer's rank 0 is the root of a group with every worker
    async def gloo_init(self, host: str, port: int, base_rank: int, world_size: int, timeout_s: float) -> list[int]:
        """Join the trainer's gloo group (ranks ``base_rank..``); returns the ranks taken."""

    async def gloo_receive(self, plan: Sequence[Sequence["ChunkMeta"]], version: int) -> int:
        """Receive and load one broadcast bucket per ``plan`` entry, adopt ``version``; returns tensors loaded."""

    async def nccl_init(self, host: str, port: int, base_rank: int, world_size: int, timeout_s: float) -> list[int]:
        """Connect every worker to the NCCL sender's store at ``host:port``; returns the ranks taken."""

    async def nccl_receive(self, version: int) -> int:
        """Receive one NCCL sync into the engine's own tensors, adopt ``version``; returns tensors loaded."""

    async def nccl_close(self) -> None:
        """Leave the NCCL sender's group (no-op without one). NCCL's teardown is collective: the sender
        calls this on every replica while it leaves itself (:meth:`NCCLReplicaEngine.shutdown`), or both
        sides wait for each other."""

    async def param_checksums(self) -> dict[str, float]:
        """``{name: float64 sum}`` of the live parameters (tests)."""

    async def param_digests(self) -> dict[str, str]:
        """``{name: sha256 of the raw bytes}`` of the live parameters (bit-exact sync checks)."""


@runtime_checkable
class CheckpointEngine(Protocol):
    """One weight transport from the trainer's rank 0 into every rollout replica."""

    async def send_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """Deliver and load every tensor in every replica; returns ``sync/...`` metrics (seconds, bytes)."""

    async def shutdown(self) -> None:
        """Tear down groups and sockets."""


@runtime_checkable
class WeightSender(Protocol):
    """Pushes the trainer's current weights as ``version`` (whatever processes hold them)."""

    async def send(self, version: int) -> dict[str, float]:
        """All replicas load the weights as ``version``; returns ``sync/...`` metrics."""

    async def digests(self) -> dict[str, str]:
        """``{name: sha256}`` of exactly what :meth:`send` delivers (bit-exact checks)."""

    async def shutdown(self) -> None:
        """Release the transport."""


def protocol_methods(proto: type) -> list[str]:
    """Public method names a protocol declares (the conformance tests call each of them)."""
    return sorted(n for n, v in vars(proto).items() if not n.startswith("_") and (callable(v) or isinstance(v, property)))
