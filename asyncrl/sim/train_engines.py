"""Cost-model engines of the trainer's side: its train engine and its weight transport.

::

    FullyAsyncTrainer ──to_thread(update)──► CostModelTrainEngine: charge(TrainCostModel.update_time)
    ParameterSynchronizer ──send_weights──► CostModelCheckpointEngine: sleep(transfer) -> replicas load

They implement the real engines' protocols (:mod:`asyncrl.api`: ``TrainEngine``, ``CheckpointEngine``), so the
real trainer and synchronizer drive them unchanged; the rollout side is :mod:`asyncrl.sim.engines`. Token units
as there: a simulated token stands for ``token_scale`` real tokens; costs are computed in real tokens.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, Callable, Iterator, Optional

import torch

from asyncrl.sim.clock import charge
from asyncrl.sim.cost_models import SyncCostModel, TrainCostModel
from asyncrl.sim.engines import Timeline
from asyncrl.sim.host import HostLoad
from asyncrl.sync.base import CheckpointEngine


class CostModelTrainEngine:
    """The trainer's engine, priced by a :class:`TrainCostModel` (the methods ``FullyAsyncTrainer`` calls).

    Runs inside the trainer's ``asyncio.to_thread`` calls, which the virtual loop runs inline; each
    call :func:`~asyncrl.sim.clock.charge`-s its time. Lengths come from the batch's response mask (plus
    ``prompt_tokens``); the rows' ``group_ids`` and ``prompt_tokens`` go with them, for a cost model that prices
    the prefix grouper (:attr:`TrainCostModel.shared_prefix`).

    Args:
        cost: trainer cost model.
        token_scale: real tokens per simulated token.
        prompt_tokens: real prompt tokens per row (replaces the simulated prompt's length).
        lr: reported as ``actor/lr``.
        timeline: optional :class:`Timeline` receiving ``trainer`` spans.
        gradient_fraction: ``fraction(real response tokens)``, the chance a row of that length has a gradient
            (:func:`asyncrl.sim.workload.gradient_fraction` of a measured run). Each row of an update is kept with
            that chance (a seeded draw) and only the kept rows are priced, as ``TrainEngine(skip_zero_advantage)``
            trains only rows with a non-zero advantage (at least one row is kept, as there). Rows are drawn one
            by one, where the real rows without a gradient come as whole groups of ``rollout.n``: the expected
            share at each length is the run's, the spread between updates is smaller. The simulated rewards
            carry no signal of their own, so without it every row is priced.
        seed: of the draws above.
        host: the :class:`~asyncrl.sim.host.HostLoad` the replicas beside it read: each priced call is reported
            there as a busy span (their decode pays its contention term then).
    """

    def __init__(self, cost: TrainCostModel, token_scale: int = 1, prompt_tokens: int = 64, lr: float = 0.0,
                 timeline: Optional[Timeline] = None, with_reference: bool = False,
                 gradient_fraction: Optional[Callable[[float], float]] = None, seed: int = 0,
                 host: Optional[HostLoad] = None, **_: Any):
        self.cost, self.scale, self.prompt_tokens, self.lr, self.timeline = cost, token_scale, prompt_tokens, lr, timeline
        self.ref_model = object() if with_reference else None  # the trainer only tests it for None
        self.gradient_fraction = gradient_fraction
        self._rng = random.Random(seed)
        self.updates = 0
        self.busy_s = 0.0
        self.host = host

    def _lengths(self, batch: Any) -> list[float]:
        resp = batch.response_mask.sum(-1).tolist()
        if self.cost.padded and self.cost.pad_to_step and not self.cost.max_token_len:  # every row at the step's width
            resp = [batch.response_mask.shape[-1]] * len(resp)
        return [self.prompt_tokens + r * self.scale for r in resp]

    def _spend(self, seconds: float, label: str) -> None:
        if self.timeline is None and self.host is None:  # priced alone (a test, gpu_sim's update model): no loop
            self.busy_s += seconds
            charge(seconds)
            return
        loop = asyncio.get_running_loop()
        start = loop.time() + getattr(loop, "_charged", 0.0)  # after what this inline call has charged so far
        if self.timeline is not None:
            self.timeline.add("trainer", start, start + seconds, label)
        if self.host is not None:
            self.host.trainer_busy(start, start + seconds)
        self.busy_s += seconds
        charge(seconds)

    def _rows(self, batch: Any) -> tuple[list[float], Optional[list], Optional[list[float]]]:
        """``(lengths, group ids, prompt tokens)`` of the batch's rows (ids and prompts None without ``group_ids``)."""
        lengths = self._lengths(batch)
        groups = getattr(batch, "group_ids", None)
        return lengths, (list(groups) if groups is not None else None), \
            ([float(self.prompt_tokens)] * len(lengths) if groups is not None else None)

    def update(self, batch: Any, loss_fn: Callable[..., tuple[torch.Tensor, dict]], with_entropy: bool = False) -> dict:
        lengths, groups, prompts = self._rows(batch)
        if self.gradient_fraction is not None and lengths:
            resp = batch.response_mask.sum(-1).tolist()
            keep = [i for i, r in enumerate(resp) if self._rng.random() < self.gradient_fraction(r * self.scale)] or [0]
            lengths = [lengths[i] for i in keep]
            if groups is not None:  # the kept rows keep their groups (the grouper plans over what trains)
                groups, prompts = [groups[i] for i in keep], [prompts[i] for i in keep]
        self._spend(self.cost.update_time(lengths, groups, prompts), "update")
        self.updates += 1
        return {"actor/pg_loss": 0.0, "actor/grad_norm": 0.0, "actor/lr": self.lr,
                "actor/trained_rows_frac": len(lengths) / max(1, len(batch.response_mask))}

    def compute_log_probs(self, batch: Any) -> torch.Tensor:
        self._spend(self.cost.log_prob_time(*self._rows(batch)), "log_prob")
        return torch.zeros_like(batch.response_mask)

    def compute_ref_log_probs(self, batch: Any) -> torch.Tensor:
        self._spend(self.cost.log_prob_time(*self._rows(batch)), "ref_log_prob")
        return torch.zeros_like(batch.response_mask)

    def named_tensors_for_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(())

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state.get("updates", 0))


class CostModelCheckpointEngine(CheckpointEngine):
    """Weight transport priced by a :class:`SyncCostModel`: wait the transfer, then every replica
    loads (the real replica actor body's ``update_weights``, which prices its own load time)."""

    name = "sim"

    def __init__(self, replicas: list, cost: SyncCostModel, timeline: Optional[Timeline] = None, label: str = "sync",
                 **_: Any):
        self.replicas, self.cost, self.timeline, self.label = replicas, cost, timeline, label

    async def send_weights(self, named_tensors: Any, version: int) -> dict[str, float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.sleep(self.cost.transfer_time())
        t1 = loop.time()
        await asyncio.gather(*[r.update_weights.remote([], version) for r in self.replicas])
        if self.timeline is not None:
            self.timeline.add("sync", t0, loop.time(), self.label)
        return {"sync/transfer_s": t1 - t0, "sync/load_s": loop.time() - t1}
