"""Engine cost models for the simulator: how long generation, training and a weight sync take.

Rollout (one replica, continuous batching; vLLM-style iteration-level scheduling)::

    decode iteration  t = step_s + per_seq_s * B + per_ctx_token_s * S       B running sequences,
                                                                             S = their summed context
    prefill           t = prefill_s + per_prefill_token_s * P                (blocks the replica)
    weight load       t = weight_load_s                                     (after the transfer)

On CPU the decode term is a table measured by probe (``per_iteration_s``: seconds per iteration by batch
size, linear between the probed sizes) and ``prefill_s`` the cost a request pays once, fitted so that a
rollout-only of the workload is reproduced (:func:`asyncrl.sim.calibrate.fit_per_request`).

``step_s`` is the weight-read floor of a decode step (memory bound: bytes of weights / HBM
bandwidth, plus launch overhead), ``per_seq_s`` the per-sequence compute (2 x params FLOP / usable
FLOP/s), ``per_ctx_token_s`` the KV-cache read per context token (KV bytes per token / HBM
bandwidth). This is the standard roofline picture of LLM decoding (e.g. the vLLM and
"LLM inference unveiled" analyses).

Training (data parallel over ``n_ranks``; a sequence is never split across ranks)::

    work(L)  = per_row_s + per_token_s * L + per_token_ctx_s * L^2 / 2   one sequence of L tokens, fwd+bwd
    update   = per_update_s + max over ranks of the summed work of its sequences
               + per_micro_batch_s per forward + backward call (micro-batches of a rank)
               (sequences dealt longest-first to the least loaded rank: dynamic batch balancing)
    padded   : the CPU trainer pads every row to the batch's longest, so work = rows * work(L_max)
    grouper  : with ``shared_prefix`` (``actor.use_prefix_grouper``) each micro-batch the engine would plan
               prices each group's prefix once, then its rows' suffixes against it (:mod:`asyncrl.sim.prefix_pricing`)

The max over ranks is why a long tail slows data-parallel training too: an update waits for the
rank that got the longest response, and adding ranks does not shorten that one.

Weight sync: ``sync_s = fixed_s + model_gb / bandwidth_gb_s`` (then each replica's ``weight_load_s``).

Contention (both sides): ``contention`` stretches every decode iteration (rollout) and every
training pass (trainer) by ``1 + contention`` while the two sides run at the same time. It is the
price of sharing a host: on the 2-core CPU box the replica and the trainer each have a core, but
the processes that glue them (Ray's core workers and raylet, the rollouter, the MessageQueue, the
replica's output relay) float over both, and vLLM's EngineCore busy-waits for its worker on the
same core; measured on the 2-core box, decode iterations took ~1.2-1.9x as long with the trainer
busy as alone (``benchmarks/RESULTS.md``). Calibrate it from two micro-measurements of the same
engine, alone and with the other side busy (:func:`asyncrl.sim.calibrate.contention`), never from
the runs it is meant to predict. 0 (the default) for separate machines or GPUs; colocated runs
never overlap the phases, so the simulator applies it to fully async runs only. In a simulation the
rollout side pays it inside the trainer's busy spans only (:class:`asyncrl.sim.host.HostLoad`,
since session 25: a rollout-bound run's trainer computes half the time or less), the trainer side on
every pass (an async run's replica decodes 80-100% of the time).

Presets (machines measured or documented, by name) live in :mod:`asyncrl.sim.presets`.
"""

from __future__ import annotations

import heapq
import math
import numbers
from dataclasses import dataclass, field, fields, replace
from typing import Any, Optional, Sequence


class _Checked:
    """Base of the cost models: every numeric field is checked at construction (``dataclasses.replace`` included)
    and on every later assignment (``cost.rollout.contention = x``), so a model that would price time as negative,
    infinite or zero (a simulation that never advances) is refused where it is made.

    Subclasses name their fields by kind: ``_SECONDS`` (and other non-negative rates: finite, >= 0), ``_COUNTS``
    (whole numbers >= 1), ``_OPTIONAL_COUNTS`` (None or >= 1), ``_OPTIONAL_SECONDS`` (None or finite >= 0);
    :meth:`_check_more` adds what depends on several fields.
    """

    _SECONDS: tuple = ()
    _COUNTS: tuple = ()
    _OPTIONAL_COUNTS: tuple = ()
    _OPTIONAL_SECONDS: tuple = ()

    def __post_init__(self) -> None:
        self._check()

    def __setattr__(self, name: str, value: Any) -> None:
        missing = object()
        old = self.__dict__.get(name, missing)
        object.__setattr__(self, name, value)
        if name in self.__dataclass_fields__ and all(f.name in self.__dict__ for f in fields(self)):
            try:  # an assignment after construction (during __init__ the last field's comes before __post_init__)
                self._check()
            except (TypeError, ValueError):
                if old is missing:
                    object.__delattr__(self, name)
                else:
                    object.__setattr__(self, name, old)
                raise

    def _check(self) -> None:
        """Raises ``TypeError`` for a value that is not a number, ``ValueError`` for one out of range, both
        naming the class, the field and the value."""
        cls = type(self).__name__
        for name in self._SECONDS + self._OPTIONAL_SECONDS:
            v = getattr(self, name)
            if v is None and name in self._OPTIONAL_SECONDS:
                continue
            _real(cls, name, v)
            if not math.isfinite(v):
                raise ValueError(f"{cls}.{name}={v!r} is not valid: not finite; times and rates must be finite and >= 0")
            if v < 0:
                raise ValueError(f"{cls}.{name}={v!r} is not valid: negative constants price negative time; "
                                 "times and rates must be finite and >= 0")
        for name in self._COUNTS + self._OPTIONAL_COUNTS:
            v = getattr(self, name)
            if v is None and name in self._OPTIONAL_COUNTS:
                continue
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise TypeError(f"{cls}.{name}={v!r} ({type(v).__name__}) is not valid: expected a whole number >= 1"
                                + (" or None" if name in self._OPTIONAL_COUNTS else ""))
            if v < 1:
                raise ValueError(f"{cls}.{name}={v!r} is not valid: expected a whole number >= 1"
                                 + (" or None" if name in self._OPTIONAL_COUNTS else ""))
        self._check_more(cls)

    def _check_more(self, cls: str) -> None:
        return None


def _real(cls: str, name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{cls}.{name}={v!r} ({type(v).__name__}) is not valid: expected a number")


@dataclass
class RolloutCostModel(_Checked):
    """Time model of one inference replica (seconds; token counts in real tokens).

    Raises:
        TypeError: a field that is not a number (a count that is not a whole number).
        ValueError: a time that is negative or not finite, ``max_num_seqs`` or ``gpus`` below 1, a
            ``per_iteration_s`` entry <= 0, or no decode term that takes time (``step_s``, ``per_seq_s``,
            ``per_ctx_token_s`` all 0 and no ``per_iteration_s``): the virtual clock would never advance.
    """

    _SECONDS = ("step_s", "per_seq_s", "per_ctx_token_s", "prefill_s", "per_prefill_token_s", "weight_load_s",
                "contention")
    _COUNTS = ("max_num_seqs", "gpus")

    step_s: float
    """Decode iteration floor (weights read once per iteration + launch overhead)."""
    per_seq_s: float
    """Extra decode time per running sequence (compute of one token)."""
    per_ctx_token_s: float
    """Extra decode time per context token of the running sequences (KV-cache read)."""
    prefill_s: float = 0.0
    """Fixed cost of admitting one request (scheduling, first forward), once per request: a partial rollout
    resumed after an abort pays only ``per_prefill_token_s`` for its prompt + partial tokens."""
    per_prefill_token_s: float = 0.0
    """Prefill compute per prompt token (also paid again for prompt + partial tokens on a resume)."""
    weight_load_s: float = 0.0
    """Loading a new weight version into the engine once the bytes have arrived."""
    max_num_seqs: int = 256
    """Scheduler batch limit; further requests queue."""
    gpus: int = 1
    """Devices one replica occupies (tensor parallel size), for the rollout:trainer split."""
    contention: float = 0.0
    """Fractional slowdown of every decode iteration from sharing the host with a busy trainer
    (module docstring: Contention); 0.3 = each iteration takes 30% longer."""
    static_slots: bool = False
    """Fixed KV-cache slots, as the ``hf`` engine (:mod:`asyncrl.rollout.hf_batch`): an iteration computes
    ``R`` rows, the power-of-two bucket above the highest occupied slot (slots handed out lowest first),
    and every row attends over the longest running context ``K``, so it costs
    ``step_s + per_seq_s * R + per_ctx_token_s * R * K`` (``B`` and ``S`` of the paged form above
    replaced by ``R`` and ``R * K``). False: vLLM's paged form."""
    compact_slots: bool = False
    """With ``static_slots``: the engine moves its running requests down to the lowest slots before every
    step (:meth:`asyncrl.rollout.hf_batch.ContinuousBatcher.compact`, since session 26), so ``R`` is the
    power-of-two bucket above the *number* of running requests, wherever their slots were. False: the
    engine before that change (a long request kept its slot, ``R`` followed the highest occupied one), for
    the runs recorded with it."""

    per_iteration_s: Optional[dict] = None
    """Measured seconds per decode iteration by batch size ``{B: s}`` (a probe, prefill taken out), used
    instead of ``step_s + per_seq_s * B`` when set: linear between the measured sizes, the last segment's
    slope beyond the largest (:meth:`iteration_s`). A straight line fitted through a probe whose cost is
    not linear in ``B`` misprices the sizes a run spends its time at (CPU vLLM: 8% short at B = 8..32)."""

    def _check_more(self, cls: str) -> None:
        """A probe table entry <= 0, or no decode term at all: an iteration that costs no time never advances the
        virtual clock, and the simulation would spin at one instant forever."""
        table = self.per_iteration_s
        if table is not None:
            if not isinstance(table, dict):
                raise TypeError(f"{cls}.per_iteration_s={table!r} ({type(table).__name__}) is not valid: expected "
                                "None or a dict {batch size: seconds per decode iteration}")
            for b, t in table.items():
                try:
                    size = float(b)
                except (TypeError, ValueError):
                    raise TypeError(f"{cls}.per_iteration_s key {b!r} is not a batch size (a number >= 1)") from None
                _real(cls, f"per_iteration_s[{b!r}]", t)
                if not size >= 1 or not math.isfinite(size):
                    raise ValueError(f"{cls}.per_iteration_s key {b!r} is not a batch size (a number >= 1)")
            bad = {b: t for b, t in table.items() if not (t > 0 and math.isfinite(t))}
            if bad:
                raise ValueError(f"{cls}: per_iteration_s entries <= 0 (or not finite) {bad} (a probe taken net of "
                                 "a per-request cost larger than the probe's own time per request? see "
                                 "asyncrl.sim.calibrate.per_request_cap)")
        if not table and not (self.step_s > 0 or self.per_seq_s > 0 or self.per_ctx_token_s > 0):
            raise ValueError(f"{cls}: step_s={self.step_s!r}, per_seq_s={self.per_seq_s!r} and per_ctx_token_s="
                             f"{self.per_ctx_token_s!r} with no per_iteration_s table: a decode iteration would take "
                             "no time and the simulation would never advance; give at least one of them > 0")

    def iteration_s(self, batch: float) -> float:
        """Seconds of one decode iteration of ``batch`` sequences, context term excluded."""
        table = self.per_iteration_s
        if not table:
            return self.step_s + self.per_seq_s * batch
        pts = sorted((float(b), float(t)) for b, t in table.items())
        if len(pts) == 1:
            return pts[0][1]
        if batch <= pts[0][0]:
            (b0, t0), (b1, t1) = pts[0], pts[1]
            return max(1e-9, t0 + (t1 - t0) / (b1 - b0) * (batch - b0)) if batch > 0 else t0
        for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
            if batch <= b1:
                return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
        (b0, t0), (b1, t1) = pts[-2], pts[-1]  # beyond the largest probed size: the last segment's slope
        return t1 + max(0.0, (t1 - t0) / (b1 - b0)) * (batch - b1)

    def decode_time(self, iterations: float, batch: int, ctx: float) -> float:
        """Seconds for ``iterations`` decode steps of ``batch`` sequences whose summed context starts
        at ``ctx`` and grows by ``batch`` per step (closed form of the per-step sum), times
        ``1 + contention``."""
        a = self.iteration_s(batch) + self.per_ctx_token_s * ctx
        return (a * iterations + self.per_ctx_token_s * batch * iterations * iterations / 2.0) * (1.0 + self.contention)

    def decode_iterations(self, seconds: float, batch: int, ctx: float) -> float:
        """Inverse of :meth:`decode_time`: decode steps done in ``seconds``."""
        seconds = seconds / (1.0 + self.contention)
        a = self.iteration_s(batch) + self.per_ctx_token_s * ctx
        q = self.per_ctx_token_s * batch
        if q <= 0:
            return seconds / a
        return (-a + math.sqrt(a * a + 2.0 * q * seconds)) / q

    def prefill_time(self, tokens: int) -> float:
        return self.prefill_s + self.per_prefill_token_s * tokens


@dataclass
class TrainCostModel(_Checked):
    """Time model of the trainer (seconds; lengths in real tokens, prompt + response).

    With ``shared_prefix`` ``per_token_s`` stays a price per token through the model: a micro-batch the prefix
    grouper plans pays its groups' prefixes once, then its rows' suffixes, so a price fitted at one ``rollout.n``
    carries to another.

    Raises:
        TypeError / ValueError: as :class:`RolloutCostModel` (times finite and >= 0, ``n_ranks`` and
            ``gpus_per_rank`` whole numbers >= 1, ``max_token_len`` / ``micro_batch_rows`` None or >= 1,
            ``shared_prefix`` None or a bool).
    """

    _SECONDS = ("per_token_s", "per_row_s", "per_token_ctx_s", "per_update_s", "forward_fraction", "contention",
                "per_micro_batch_s")
    _OPTIONAL_SECONDS = ("per_packed_micro_batch_s",)
    _COUNTS = ("n_ranks", "gpus_per_rank")
    _OPTIONAL_COUNTS = ("max_token_len", "micro_batch_rows")

    per_token_s: float
    """Forward + backward time per token on one rank (linear part: matmuls)."""
    per_row_s: float = 0.0
    """Fixed forward + backward time per row whatever its length (per-micro-batch launches, host work and
    low-occupancy kernels spread over its rows): what makes short rows cost more than their tokens."""
    per_token_ctx_s: float = 0.0
    """Attention part: a sequence of L tokens costs ``per_token_ctx_s * L^2 / 2`` more."""
    per_update_s: float = 0.0
    """Fixed cost of one optimizer update (optimizer step, gradient all-reduce)."""
    n_ranks: int = 1
    """Data-parallel ranks of the trainer (groups of ``gpus_per_rank`` GPUs)."""
    gpus_per_rank: int = 1
    """GPUs per data-parallel rank (sequence / tensor parallel size), for the rollout:trainer split."""
    padded: bool = False
    """Rows are padded to the longest in the batch (the CPU trainer) instead of packed."""
    pad_to_step: bool = False
    """With ``padded``: to the longest row of the whole trainer step, not of the mini-batch (the FSDP2
    engine: ``collate`` pads the step, its mini-batches keep that width, micro-batches are not trimmed)."""
    forward_fraction: float = 1.0 / 3.0
    """Log-prob recompute (forward only) relative to forward + backward."""
    contention: float = 0.0
    """Fractional slowdown of every training pass from sharing the host with a busy rollout
    (module docstring: Contention)."""
    max_token_len: Optional[int] = None
    """verl's ``use_dynamic_bsz``: micro-batches packed by this token budget (``ppo_max_token_len_per_gpu``,
    rows x longest, as :func:`asyncrl.trainer.engine.chunk_rows` packs them) and each padded to its own
    longest row; overrides ``padded`` / ``pad_to_step``. Set by the simulator from the config."""
    per_micro_batch_s: float = 0.0
    """Fixed forward + backward time per micro-batch (one call of the model, whatever its rows): kernel
    launches and host work. The FSDP2 engine on one H200 pays ~0.15 s per call up to ~8k tokens
    (``benchmarks/RESULTS.md``, "The FSDP2 update is host-bound per micro-batch")."""
    micro_batch_rows: Optional[int] = None
    """Rows per micro-batch without ``max_token_len`` (verl's ``ppo_micro_batch_size``; set by the simulator
    from the config): how many calls a mini-batch takes (``per_micro_batch_s``, the grouper's plans). None: one."""
    per_packed_micro_batch_s: Optional[float] = None
    """Fixed time per micro-batch packed by ``max_token_len``, when it differs from ``per_micro_batch_s``
    (the FSDP2 engine's packed calls: many rows of varying length per call). None: ``per_micro_batch_s``."""
    shared_prefix: Optional[bool] = None
    """Price ``actor.use_prefix_grouper``: each GRPO group's prompt once per micro-batch where the engine would
    (:mod:`asyncrl.sim.prefix_pricing`; one rank, and only for callers that pass the rows' groups and prompts).
    None: as the simulated config says (:func:`asyncrl.trainer.shared_prefix.uses_prefix_grouper`, resolved by
    the runner); False for engines without it (FSDP2) and for prices measured without it."""

    def _check_more(self, cls: str) -> None:
        if not isinstance(self.shared_prefix, (bool, type(None))):
            raise TypeError(f"{cls}.shared_prefix={self.shared_prefix!r} is not valid: expected None, True or False")

    def work(self, length: float) -> float:
        """Forward + backward seconds of one row of ``length`` tokens (module docstring)."""
        return self.per_row_s + self.per_token_s * length + self.per_token_ctx_s * length * length / 2.0

    def suffix_work(self, suffix: float, prefix: float) -> float:
        """One row's ``suffix`` tokens run against ``prefix`` cached ones: its per-row cost, the linear part on the
        suffix and the suffix's part of the attention triangle, ``ctx x ((prefix + suffix)^2 - prefix^2) / 2``
        (``work(prefix) + suffix_work(L - prefix, prefix) == work(L) + per_row_s``)."""
        full = prefix + suffix
        return self.per_row_s + self.per_token_s * suffix + self.per_token_ctx_s * (full * full - prefix * prefix) / 2.0

    def pass_time(self, lengths: Sequence[float], groups: Optional[Sequence] = None,
                  prompts: Optional[Sequence[float]] = None) -> float:
        """Forward + backward over ``lengths`` (``(rows,)`` real tokens; one mini-batch), without the update
        overhead. ``groups`` / ``prompts`` (``(rows,)`` group ids, prompt tokens): with ``shared_prefix`` and one rank,
        each micro-batch priced as the grouper runs it (:func:`asyncrl.sim.prefix_pricing.grouped_pass_time`, which
        raises ``ValueError`` unless they are one per row); else ignored."""
        if not len(lengths):
            return 0.0
        if self.shared_prefix and self.n_ranks == 1 and groups is not None and prompts is not None:
            from asyncrl.sim.prefix_pricing import grouped_pass_time

            return grouped_pass_time(self, lengths, groups, prompts) * (1.0 + self.contention)
        if self.max_token_len:
            return self._packed_time(lengths) / self.n_ranks * (1.0 + self.contention)
        if self.padded:
            per_rank = math.ceil(len(lengths) / self.n_ranks)
            calls = math.ceil(per_rank / self.micro_batch_rows) if self.micro_batch_rows else 1
            return (len(lengths) * self.work(max(lengths)) / self.n_ranks
                    + calls * self.per_micro_batch_s) * (1.0 + self.contention)
        if self.n_ranks == 1:
            return sum(self.work(x) for x in lengths) * (1.0 + self.contention)
        loads = [0.0] * self.n_ranks
        for w in sorted((self.work(x) for x in lengths), reverse=True):  # longest first, least loaded rank
            heapq.heapreplace(loads, loads[0] + w)
        return max(loads) * (1.0 + self.contention)

    def _packed_time(self, lengths: Sequence[float]) -> float:
        """Micro-batches packed by ``max_token_len`` over the lengths sorted ascending, each row costing
        the chunk's longest (``chunk_rows``'s rule; one row at least per chunk)."""
        from asyncrl.trainer.engine import pack_by_token_budget

        chunks = [[lengths[i] for i in c] for c in pack_by_token_budget(list(lengths), self.max_token_len)]
        call = self.per_micro_batch_s if self.per_packed_micro_batch_s is None else self.per_packed_micro_batch_s
        return sum(len(c) * self.work(max(c)) + call for c in chunks)

    def update_time(self, lengths: Sequence[float], groups: Optional[Sequence] = None,
                    prompts: Optional[Sequence[float]] = None) -> float:
        """One optimizer update over one mini-batch (arguments as :meth:`pass_time`)."""
        return self.per_update_s + self.pass_time(lengths, groups, prompts)

    def log_prob_time(self, lengths: Sequence[float], groups: Optional[Sequence] = None,
                      prompts: Optional[Sequence[float]] = None) -> float:
        """Recomputing log-probs (old / reference) over ``lengths`` (arguments as :meth:`pass_time`)."""
        return self.forward_fraction * self.pass_time(lengths, groups, prompts)


@dataclass
class SyncCostModel(_Checked):
    """Time to move one weight version from the trainer to every replica (before ``weight_load_s``).

    Raises:
        TypeError / ValueError: ``fixed_s`` or ``model_gb`` negative or not finite, ``bandwidth_gb_s`` not > 0
            (``inf``, the default, is an instant transfer).
    """

    _SECONDS = ("fixed_s", "model_gb")

    fixed_s: float = 0.0
    """Per-sync overhead (group set-up, metadata, barriers)."""
    model_gb: float = 0.0
    """Bytes of weights moved, in GB."""
    bandwidth_gb_s: float = float("inf")
    """Transport bandwidth (NCCL broadcast / object store), GB/s."""

    def _check_more(self, cls: str) -> None:
        _real(cls, "bandwidth_gb_s", self.bandwidth_gb_s)
        if not self.bandwidth_gb_s > 0:
            raise ValueError(f"{cls}.bandwidth_gb_s={self.bandwidth_gb_s!r} is not valid: expected GB/s > 0 "
                             "(inf for an instant transfer)")

    def transfer_time(self) -> float:
        return self.fixed_s + self.model_gb / self.bandwidth_gb_s


@dataclass
class ClusterCostModel(_Checked):
    """Everything a simulation needs to price a run: replicas, trainer, sync, and the resources.

    Raises:
        TypeError: ``rollout`` / ``train`` / ``sync`` not of their cost-model classes, or a field not a number.
        ValueError: ``prompt_tokens`` below 1, ``hybrid_switch_s`` negative or not finite.
    """

    _SECONDS = ("hybrid_switch_s",)
    _COUNTS = ("prompt_tokens",)

    name: str
    rollout: RolloutCostModel
    train: TrainCostModel
    sync: SyncCostModel = field(default_factory=SyncCostModel)
    prompt_tokens: int = 64
    """Prompt length of the simulated requests (real tokens)."""
    hybrid_switch_s: float = 0.0
    """Colocated (``hybrid_engine``) runs only: seconds per step to hand the devices from generation
    to training and back (vLLM sleep / wake, trainer parameter and optimizer on- / off-load), paid
    with the weight sync."""
    notes: str = ""

    def _check_more(self, cls: str) -> None:
        for name, kind in (("rollout", RolloutCostModel), ("train", TrainCostModel), ("sync", SyncCostModel)):
            v = getattr(self, name)
            if not isinstance(v, kind):
                raise TypeError(f"{cls}.{name}={v!r} ({type(v).__name__}) is not valid: expected a {kind.__name__}")

    def with_split(self, rollout_gpus: int, train_gpus: int) -> tuple[int, "ClusterCostModel"]:
        """Replica count for ``rollout_gpus`` and a copy whose trainer spans ``train_gpus`` GPUs."""
        replicas = max(1, rollout_gpus // self.rollout.gpus)
        ranks = max(1, train_gpus // self.train.gpus_per_rank)
        return replicas, replace(self, train=replace(self.train, n_ranks=ranks))
