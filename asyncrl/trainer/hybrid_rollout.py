"""verl's hybrid engine on CPU with the hf backend: the rollout runs inside the trainer's process.

::

    driver ──RolloutForward──► trainer actor .call_rollouter(name, ...) ─┐
                                                                         ▼
    trainer process:  FullyAsyncTrainer.fit ── generate_round ──► FullyAsyncRollouter body (local handle)
                           │                                       │ agent loops (num_workers=0)
                           │ update (TrainEngine.model)            ▼
                           │                                   LocalRequestLoadBalancer ─► replica body
                           │                                       ─► SharedModuleHFEngine over the SAME module
                           └─ sync: SharedWeightsSender.send(v) = refresh the fused q/k/v, gate/up copies
                                                                  + param_version = v   (no transfer)
                      MessageQueue body in this process too: groups handed over as objects (no ray.put)
    driver ──QueueForward──► trainer actor .call_message_queue(name, ...)  (stats, shutdown)

With ``actor_rollout_ref.hybrid_engine=True``, ``rollout.name=hf``, ``actor.strategy=cpu`` and agent
loops in the rollouter (``rollout.agent.num_workers=0``; :func:`in_process_rollout`), :class:`~asyncrl.experiment.Experiment` starts no replica actor and no
rollouter actor: the trainer builds the rollouter body and an hf engine over its own actor module, as
verl's ``ActorRolloutRefWorker`` with ``hybrid_engine=True`` does (the rollout shares the actor's
weights in the actor's process, so the weight "sync" is free and no Ray hop sits between a request
and the engine). The MessageQueue lives there as well (:func:`in_process_queue`): a finished group reaches
the trainer as the object itself, where a ``ray.put`` and a queue-actor call per group took a third of the
event loop's busy time in a colocated arith step (session 28's profile), time the engine's decode waits
for (both need the GIL). The control flow is the colocated one of :mod:`asyncrl.hybrid_engine`; the async
modes are untouched. The engine's step runs under ``torch.no_grad`` (:mod:`asyncrl.rollout.hf_forward`),
so generation leaves no autograd state on the actor's parameters.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

import torch

from asyncrl.compute_thread import run_compute
from asyncrl.placement import in_process_rollout  # noqa: F401 - public here (the module's predicate)
from asyncrl.rollout.hf_backend import HFEngine
from asyncrl.rollout.hf_batch import ContinuousBatcher
from asyncrl.rollout.hf_forward import StaticCacheLM
from asyncrl.rollout.replica import _ReplicaActor, engine_kwargs_from_config

logger = logging.getLogger(__name__)

SERVER_ID = "replica_0"
"""The in-process engine's name in the load balancer and the rollouter's replica map."""


def _fused_groups(layer: Any) -> list[list[Any]]:
    return [[layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj],
            [layer.mlp.gate_proj, layer.mlp.up_proj]]


class SharedModuleHFEngine(HFEngine):
    """:class:`~asyncrl.rollout.hf_backend.HFEngine` over a module another component trains.

    The engine's forward fuses q/k/v and gate/up into one buffer each and re-points the linears at it
    (:func:`asyncrl.rollout.hf_forward.fuse_linears`); here every linear gets its own storage back, so
    the trainer's parameters, optimizer and checkpoints see ordinary tensors, and the fused buffers
    are refreshed in place from them by :meth:`adopt_weights` (a memcpy of those matrices; every other
    weight - embeddings, norms, o_proj, down_proj, lm_head - is the module's own tensor).

    Args:
        model: the trainer's HF causal LM (``TrainEngine.model``), on its device.
        model_path: its checkpoint directory (EOS ids, stop-string tokenizer).
        **engine_kwargs: :class:`HFEngine` settings (``max_num_seqs``, ``max_model_len``, ``kv_cache_gb``, ``seed``).
    """

    def __init__(self, model: Any, model_path: str, **engine_kwargs: Any):
        p = next(model.parameters())
        engine_kwargs.update(dtype=str(p.dtype).removeprefix("torch."), device=str(p.device), cuda_graphs=False)
        super().__init__(model_path, **engine_kwargs)
        self.model = model
        if self.max_model_len is None:
            self.max_model_len = min(int(getattr(model.config, "max_position_embeddings", 4096)), 4096)
        self.max_model_len = int(self.max_model_len)
        lm = StaticCacheLM(model, self._num_slots(), self.max_model_len)
        self._fused = []  # (fused weight, fused bias or None, [linears]) per fused group
        for layer, qkv, gate_up in zip(lm.layers, lm.qkv, lm.gate_up):
            for (w, b), lins in zip((qkv, gate_up), _fused_groups(layer)):
                for m in lins:  # own storage again: the optimizer steps these, not views of the fused buffer
                    m.weight.data = m.weight.data.clone()
                    if m.bias is not None:
                        m.bias.data = m.bias.data.clone()
                self._fused.append((w, b, lins))
        self.batcher = ContinuousBatcher(lm, cuda_graphs=False, max_prefill_tokens=self.max_prefill_tokens)

    async def start(self) -> None:
        """Built in the constructor; only binds the scheduler to the running loop."""
        self._ensure_loop()

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the module's current q/k/v and gate/up weights into the engine's fused buffers."""
        for w, b, lins in self._fused:
            torch.cat([m.weight for m in lins], dim=0, out=w)
            if b is not None:
                torch.cat([m.bias for m in lins], dim=0, out=b)

    async def adopt_weights(self, version: int) -> None:
        """The module's weights become parameter version ``version`` (between engine steps)."""
        self._ensure_loop()
        async with self._lock:
            await run_compute(self.refresh)  # on the thread the steps run on (asyncrl.compute_thread)
            self.param_version = int(version)

    async def shutdown(self) -> None:
        """Stop serving; the module stays the trainer's."""
        await self.abort_all_requests()
        self.batcher = None


class SharedWeightsSender:
    """:class:`asyncrl.api.WeightSender` for an engine that serves the trainer's own module: nothing moves."""

    def __init__(self, engine: SharedModuleHFEngine):
        self.engine = engine

    async def send(self, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        await self.engine.adopt_weights(version)
        return {"sync/refresh_s": time.perf_counter() - t0}

    async def digests(self) -> dict[str, str]:
        from asyncrl.sync.receiver import tensor_digest

        return {n: tensor_digest(t.detach()) for n, t in self.engine.model.named_parameters()}

    async def shutdown(self) -> None:
        return None


class LocalReplica(_ReplicaActor):
    """The replica actor body around an engine built elsewhere (no Ray actor, no engine start)."""

    def __init__(self, engine: Any, replica_rank: int = 0):
        self.backend, self.replica_rank, self.engine = "hf", replica_rank, engine
        self._start_task = None
        self._stats = self.fresh_stats()
        self.init_pause_state()
        self.restarted, self.weights_current = False, True


def in_process_queue(maxsize: int) -> Any:
    """The MessageQueue body in the trainer's process (:class:`asyncrl.message_queue.MessageQueue` with
    ``in_process=True`` over a :class:`asyncrl.sim.handles.LocalActorHandle`): the same waits, counters and
    shutdown as the actor, on the trainer's event loop; the driver reaches it through :class:`QueueForward`."""
    from asyncrl.message_queue import MessageQueue, _MessageQueueActor
    from asyncrl.sim.handles import LocalActorHandle

    return MessageQueue.from_handle(LocalActorHandle(_MessageQueueActor(maxsize)), maxsize, in_process=True)


def build_local_rollout(trainer: Any, message_queue: Any, train_rows: list[dict], val_rows: list[dict],
                        resume: Optional[dict] = None) -> tuple[Any, dict, SharedWeightsSender]:
    """The trainer's in-process rollout: ``(rollouter handle, {server_id: replica handle}, weight sender)``.

    Handles are :class:`asyncrl.sim.handles.LocalActorHandle` (``.method.remote()`` on the trainer's
    event loop), so the rollouter, client and synchronizer code run unchanged.
    """
    from asyncrl.rollout.load_balancer import LocalRequestLoadBalancer
    from asyncrl.rollouter import FullyAsyncRollouter
    from asyncrl.sim.handles import LocalActorHandle

    cfg = trainer.cfg
    kw = engine_kwargs_from_config(cfg)
    keys = ("seed", "max_num_seqs", "max_model_len", "kv_cache_gb", "iteration_stats", "decode_threads")
    engine = SharedModuleHFEngine(trainer.engine.model, cfg.actor_rollout_ref.model.path,
                                  **{k: kw[k] for k in keys if k in kw})
    replicas = {SERVER_ID: LocalActorHandle(LocalReplica(engine))}
    rollouter = FullyAsyncRollouter(cfg, train_rows, val_rows, replicas, LocalRequestLoadBalancer(replicas),
                                    message_queue, resume)
    logger.info("hybrid engine: rollout in the trainer process (hf engine over the actor module, %d slots)",
                engine.batcher.lm.num_slots)
    return LocalActorHandle(rollouter), replicas, SharedWeightsSender(engine)


class _Forwarded:
    def __init__(self, trainer: Any, via: str, name: str):
        self._trainer, self._via, self._name = trainer, via, name

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._trainer, self._via).remote(self._name, *args, **kwargs)


class RolloutForward:
    """The driver's handle on a rollouter that lives in the trainer actor: ``h.method.remote(...)`` is
    ``trainer.call_rollouter.remote("method", ...)`` (an ``ObjectRef``, as from the rollouter actor)."""

    _via = "call_rollouter"

    def __init__(self, trainer: Any):
        self._trainer = trainer

    def __getattr__(self, name: str) -> _Forwarded:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Forwarded(self._trainer, self._via, name)


class QueueForward(RolloutForward):
    """The driver's handle on the :func:`in_process_queue` of the trainer actor: ``h.stats.remote()`` is
    ``trainer.call_message_queue.remote("stats")``; wrap it with ``MessageQueue.from_handle``."""

    _via = "call_message_queue"
