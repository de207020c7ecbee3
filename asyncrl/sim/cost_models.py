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
               (sequences dealt longest-first to the least loaded rank: dynamic batch balancing)
    padded   : the CPU trainer pads every row to the batch's longest, so work = rows * work(L_max)

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
never overlap the phases, so the simulator applies it to fully async runs only.

Presets: :func:`cpu_embedded_vllm` (calibrated from measured runs on the 2-core CPU machine, see
``benchmarks/RESULTS.md``), :func:`h20_qwen25_7b` / :func:`h100_qwen25_7b` (from datasheets and
the Qwen2.5-7B shapes; the H20 one is checked against verl's published component timings) and
:func:`h200_qwen25_05b_hf` (the GPU rows of ``benchmarks/async_vs_colocate.py``: hf engine + FSDP2
trainer on H200s, every constant from a measurement in ``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence


@dataclass
class RolloutCostModel:
    """Time model of one inference replica (seconds; token counts in real tokens)."""

    step_s: float
    """Decode iteration floor (weights read once per iteration + launch overhead)."""
    per_seq_s: float
    """Extra decode time per running sequence (compute of one token)."""
    per_ctx_token_s: float
    """Extra decode time per context token of the running sequences (KV-cache read)."""
    prefill_s: float = 0.0
    """Fixed cost of admitting one request (scheduling, first forward)."""
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

    per_iteration_s: Optional[dict] = None
    """Measured seconds per decode iteration by batch size ``{B: s}`` (a probe, prefill taken out), used
    instead of ``step_s + per_seq_s * B`` when set: linear between the measured sizes, the last segment's
    slope beyond the largest (:meth:`iteration_s`). A straight line fitted through a probe whose cost is
    not linear in ``B`` misprices the sizes a run spends its time at (CPU vLLM: 8% short at B = 8..32)."""

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
class TrainCostModel:
    """Time model of the trainer (seconds; lengths in real tokens, prompt + response)."""

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

    def work(self, length: float) -> float:
        return self.per_row_s + self.per_token_s * length + self.per_token_ctx_s * length * length / 2.0

    def pass_time(self, lengths: Sequence[float]) -> float:
        """Forward + backward over ``lengths`` (one mini-batch), without the update overhead."""
        if not len(lengths):
            return 0.0
        if self.max_token_len:
            return self._packed_time(lengths) / self.n_ranks * (1.0 + self.contention)
        if self.padded:
            return len(lengths) * self.work(max(lengths)) / self.n_ranks * (1.0 + self.contention)
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
        # per_row_s stays per row: fitted on 8-row micro-batches, it could as well be a per-micro-batch cost
        # (x8); on the one measured packed run (tests/data/avc_gpu_colocated_dyn_h200_2048.json) per row
        # priced the update 30% long and per micro-batch 27% short: the truth lies between, not fitted
        return sum(len(c) * self.work(max(c)) for c in chunks)

    def update_time(self, lengths: Sequence[float]) -> float:
        """One optimizer update over one mini-batch."""
        return self.per_update_s + self.pass_time(lengths)

    def log_prob_time(self, lengths: Sequence[float]) -> float:
        """Recomputing log-probs (old / reference) over ``lengths``."""
        return self.forward_fraction * self.pass_time(lengths)


@dataclass
class SyncCostModel:
    """Time to move one weight version from the trainer to every replica (before ``weight_load_s``)."""

    fixed_s: float = 0.0
    """Per-sync overhead (group set-up, metadata, barriers)."""
    model_gb: float = 0.0
    """Bytes of weights moved, in GB."""
    bandwidth_gb_s: float = float("inf")
    """Transport bandwidth (NCCL broadcast / object store), GB/s."""

    def transfer_time(self) -> float:
        return self.fixed_s + (self.model_gb / self.bandwidth_gb_s if self.bandwidth_gb_s > 0 else 0.0)


@dataclass
class ClusterCostModel:
    """Everything a simulation needs to price a run: replicas, trainer, sync, and the resources."""

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

    def with_split(self, rollout_gpus: int, train_gpus: int) -> tuple[int, "ClusterCostModel"]:
        """Replica count for ``rollout_gpus`` and a copy whose trainer spans ``train_gpus`` GPUs."""
        replicas = max(1, rollout_gpus // self.rollout.gpus)
        ranks = max(1, train_gpus // self.train.gpus_per_rank)
        return replicas, replace(self, train=replace(self.train, n_ranks=ranks))


# ------------------------------------------------------------------------------------------ presets


def cpu_embedded_vllm(cores: int = 1) -> ClusterCostModel:
    """The embedded 0.56M-parameter model on the 2-core CPU box, one vLLM-CPU replica and the torch
    trainer, each on ``cores`` cores (1: the async split, a core each; 2: colocated, both phases on both).

    Calibrated with :mod:`asyncrl.sim.calibrate` on this machine (command and numbers in
    ``benchmarks/RESULTS.md``): vLLM-CPU decode on this model is overhead-bound (the per-iteration
    floor dominates; the per-sequence term is small), the trainer's cost is linear in tokens (dynamic
    micro-batches), and a second core speeds decode up less than training.
    """
    if cores not in (1, 2):
        raise ValueError(f"cores must be 1 or 2, got {cores}")
    decode, train = (1.0, 1.0) if cores == 1 else (0.8, 0.6)
    return ClusterCostModel(
        name=f"cpu-embedded-vllm-{cores}core",
        rollout=RolloutCostModel(step_s=0.012 * decode, per_seq_s=0.00012 * decode, per_ctx_token_s=0.0,
                                 weight_load_s=0.03, max_num_seqs=256),
        train=TrainCostModel(per_token_s=6e-5 * train, per_update_s=0.01),
        sync=SyncCostModel(fixed_s=0.15),
        prompt_tokens=50,
        notes="2-core CPU box; see benchmarks/RESULTS.md",
    )


def _qwen25_7b(peak_tflops: float, hbm_tb_s: float, name: str, *, tp: int = 4, sp: int = 4, mfu: float = 0.6,
               launch_s: float = 0.0045, per_update_s: float = 1.0, hybrid_switch_s: float = 30.0,
               notes: str = "") -> ClusterCostModel:
    """Qwen2.5-7B (7.6B params, 28 layers, hidden 3584, 4 KV heads x 128, bf16) on one GPU type.

    Rollout replica = ``tp`` GPUs (vLLM tensor parallel): a decode iteration reads the 15.2 GB of
    weights once (split over the TP GPUs, 80% of HBM bandwidth) plus ``launch_s`` (kernel launches,
    TP all-reduces, the scheduler); each running sequence adds 2 x 7.6 GFLOP (50% of peak) and
    each context token 57,344 B of KV cache (28 layers x 2 x 4 heads x 128 x 2 B). Prefill at 60%
    of peak.

    Trainer: FSDP2 data parallel with Ulysses sequence parallelism ``sp`` (a rank group of ``sp``
    GPUs holds one sequence at a time, so a 28K-token response is spread over ``sp`` GPUs, not
    split across groups): 6 x 7.6 GFLOP per token plus causal attention 6 x 28 x 3584 x L FLOP
    per token, at ``mfu`` of peak; ``per_update_s`` per optimizer update (reduce-scatter of the
    gradients, optimizer step); a log-prob recompute is a forward pass (a third of a training pass).

    Sync: 15.2 GB over NCCL at 20 GB/s plus 2 s set-up, then 1 s to load into vLLM per replica.
    Colocated runs also pay ``hybrid_switch_s`` per step to hand the GPUs between vLLM and the
    trainer. Calibration (verl's 7B table): on the same 64 GPUs the colocated trainer's update takes
    133.4 s per step and the fully async trainer's 113.2 s, and the colocated 128-GPU step has 10.7 s
    beyond generation, old log-prob and update: ~30 s per step of switching; ``mfu`` 0.6 puts the
    async 64-GPU update near its measured 113 s.
    """
    hbm = hbm_tb_s * 1e12 * 0.8
    flops = peak_tflops * 1e12
    return ClusterCostModel(
        name=name,
        rollout=RolloutCostModel(step_s=15.2e9 / (tp * hbm) + launch_s, per_seq_s=2 * 7.6e9 / (tp * 0.5 * flops),
                                 per_ctx_token_s=57344 / (tp * hbm), prefill_s=0.005,
                                 per_prefill_token_s=2 * 7.6e9 / (tp * 0.6 * flops), weight_load_s=1.0,
                                 max_num_seqs=256, gpus=tp),
        train=TrainCostModel(per_token_s=6 * 7.6e9 / (sp * mfu * flops),
                             per_token_ctx_s=2 * 6 * 28 * 3584 / (sp * mfu * flops),
                             per_update_s=per_update_s, n_ranks=16, gpus_per_rank=sp),
        sync=SyncCostModel(fixed_s=2.0, model_gb=15.2, bandwidth_gb_s=20.0),
        prompt_tokens=200,
        hybrid_switch_s=hybrid_switch_s,
        notes=notes,
    )


def h20_qwen25_7b() -> ClusterCostModel:
    """Qwen2.5-7B on NVIDIA H20 (148 TFLOP/s dense bf16, 4.0 TB/s HBM3), rollout TP 4, trainer
    Ulysses SP 4, trainer MFU 60% (H20 is compute-poor, so training runs near its peak): the setup
    of verl's fully-async experiment (``dapo_7b_math_fsdp2_64_64.sh``: gen_tp=4, sp_size=4)."""
    return _qwen25_7b(148.0, 4.0, "h20-qwen2.5-7b", notes="H20 datasheet + Qwen2.5-7B shapes, TP4/SP4")


def h100_qwen25_7b() -> ClusterCostModel:
    """Qwen2.5-7B on NVIDIA H100 SXM (989 TFLOP/s dense bf16, 3.35 TB/s HBM3), rollout TP 4,
    trainer SP 4, trainer MFU 40%."""
    return _qwen25_7b(989.0, 3.35, "h100-qwen2.5-7b", mfu=0.4, notes="H100 SXM datasheet + Qwen2.5-7B shapes, TP4/SP4")


PRESETS = {"cpu-embedded-vllm": cpu_embedded_vllm, "h20-qwen2.5-7b": h20_qwen25_7b, "h100-qwen2.5-7b": h100_qwen25_7b}


# The measurements behind h200_qwen25_05b_hf (benchmarks/RESULTS.md; section names quoted in its docstring).
_HF_ATTN_S = 0.94e-3 / (256 * 512)
"""Decode attention per row per attended KV position: cuDNN flash attention 0.94 ms of one decode step at
256 rows x kv_len 512 ("GPU: the hf rollout backend on one H200", the ``--profile`` kernel table)."""
_HF_KV_BUCKET_PAD = 1.16
"""Mean ``kv_len / longest context`` over a decode: the hf engine rounds ``kv_len`` up to buckets 1.5x apart
(64, 96, 128, 192, ...; :func:`asyncrl.rollout.hf_batch._buckets`); 1.16-1.17 for any range of contexts
from 34 to 2,081 or 257 to 512 (computed from the bucket list, not measured)."""
_HF_ROW_S = (0.31 + 0.15 + (0.86 - 0.26)) * 1e-3 / 256
"""Decode work per row at 256 rows (same kernel table): the 151,936-entry CDF ``cumsum`` 0.31 ms, softmax
0.15 ms, and the matmuls' 0.86 ms less the weight read they cost at any batch (0.99 GB at 80% of the H200's
4.8 TB/s, 0.26 ms: an assumption, the split is not measured)."""
_HF_STEP_256_S = 4.29e-3
"""Engine wall time per decode step at 256 rows, host work included, over kv_len 384 and 512 (mean 448):
4.29 ms (run 2 of the same section, 50,522 tokens/s)."""
_FSDP_UPDATE_S = 4.826
"""One FSDP2 optimizer update of a 128-row mini-batch padded to 2,081 tokens (266,368 tokens) on one H200:
median ``perf/step_s`` of steps 2-6 of "GPU row, session 5" run 3 (``tests/data/avc_gpu_colocated_h200.json``;
step 1, 6.98 s, compiles)."""
_FSDP_UPDATES_S = {2081: _FSDP_UPDATE_S, 1057: 3.56, 545: 2.336}
"""Padded row width -> seconds of one 128-row FSDP2 update on one H200 (median ``perf/step_s`` of steps 2-6 of
three colocated runs: responses max 2,048 / 1,024 / 512, ``tests/data/avc_gpu_colocated_h200{,_1024,_512}.json``).
Half the tokens take ~0.7 of the time: a fixed cost per row (:attr:`TrainCostModel.per_row_s`)."""
_FSDP_ATTN_S = 56.6e-3 / (8 * 4096) / (4096 / 2)
"""Causal attention per token per context token in training: 56.6 ms of cuDNN flash attention per step of
8 x 4,096 tokens per GPU ("Trainer: FSDP2, Qwen2.5-0.5B shapes, seq 4096, 2 H200", the profile table)."""
SYNC_S = {"cuda_ipc": (0.1185, 0.0), "nccl": (0.0092 + 0.0834, 0.0087)}
"""``(transfer s, load s)`` of one 0.99 GB sync. ``cuda_ipc`` (colocated): median ``sync/total_s`` of "GPU
row, session 5" run 3 (pause 5 ms + pack and load 107 ms + resume 7 ms; the load is in the transfer).
``nccl`` (separate GPUs): the in-pipeline stall of "GPU: the whole pipeline on two H200s" (b), pause 9.2 +
transfer 83.4 ms, then load + resume 8.7 ms."""


def h200_qwen25_05b_hf(sync_backend: str = "nccl") -> ClusterCostModel:
    """The GPU workload of ``benchmarks/async_vs_colocate.py --gpu``: random-init Qwen2.5-0.5B shape (bf16),
    the ``hf`` rollout engine with CUDA-graph decode (one replica per H200, 256 KV slots) and the FSDP2
    trainer (one rank per H200, 8-row micro-batches, rows padded to the batch's longest), ~33-token prompts.

    Measured (``benchmarks/RESULTS.md``; the module constants above quote each source):

    * decode, static slots (:attr:`RolloutCostModel.static_slots`): ``per_ctx_token_s`` = flash attention
      0.94 ms at 256 rows x kv 512, times the kv-bucket padding 1.16 (computed); ``step_s + 256 per_seq_s``
      = the engine's 4.29 ms wall per step at 256 rows less its attention at the run's mean kv 448;
    * prefill: 65,536 prompt tokens in 0.19 s (2.9 us per token);
    * training: 128-row updates on one H200 padded to 2,081 / 1,057 / 545 tokens in 4.826 / 3.56 / 2.336 s
      (three colocated runs' own ``perf/step_s``), of which causal attention takes ``per_token_ctx_s`` (issue
      6's profile); the least-squares line through them gives ``per_token_s`` and a fixed ``per_row_s``
      (~13.5 ms per row; within 8% of each point). The first model, linear in tokens from the 2,081 point
      alone, predicted the 1,057 run's update 31% short; a line through two points then predicted the 545
      run's 28% long: the cost per token falls as micro-batches grow (concave), so the line is a fit over
      this range, not a law; ``per_update_s`` = the rest
      of ``timing/update_s`` (median 9.866 s for two updates: collate, reward, advantages, the batch's trip
      to the rank), 0.107 s per update;
    * sync: ``cuda_ipc`` 0.1185 s per step (colocated), ``nccl`` 0.101 s (separate GPUs), 0.99 GB.

    Assumed (not measured): how the 3.47 ms of non-attention decode time at 256 rows splits into a
    per-iteration floor (2.41 ms: host work 0.65 ms, the weight read, launches) and per-row work (4.1 us,
    from the kernel table); attention linear in kv_len down to short contexts; no fixed cost per prefill
    (the engine's eager prefill forward); FSDP2 over ``n`` ranks divides a padded update by ``n`` with the
    collectives hidden (issue 6: NCCL overlapped on its own stream) and the same ``per_update_s``; no
    warm-up (the measured runs' first step also captures CUDA graphs and compiles: ~10 s more).

    Args:
        sync_backend: ``cuda_ipc`` (colocated: trainer rank and replica on one GPU) or ``nccl``.
    """
    if sync_backend not in SYNC_S:
        raise ValueError(f"sync_backend must be one of {sorted(SYNC_S)}, got {sync_backend!r}")
    attn = _HF_ATTN_S * _HF_KV_BUCKET_PAD
    step_s = _HF_STEP_256_S - 256 * 448 * _HF_ATTN_S - 256 * _HF_ROW_S
    # per-row work w(L) = per_row + per_token L + attn L^2 / 2: least squares through the measured updates
    # (128 rows each), attention taken out first
    widths = list(_FSDP_UPDATES_S)
    rest = [_FSDP_UPDATES_S[w] / 128 - _FSDP_ATTN_S * w * w / 2 for w in widths]
    mw, mr = sum(widths) / len(widths), sum(rest) / len(rest)
    per_token = sum((w - mw) * (r - mr) for w, r in zip(widths, rest)) / sum((w - mw) ** 2 for w in widths)
    per_row = mr - per_token * mw
    transfer, load = SYNC_S[sync_backend]
    return ClusterCostModel(
        name=f"h200-qwen2.5-0.5b-hf-{sync_backend}",
        rollout=RolloutCostModel(step_s=step_s, per_seq_s=_HF_ROW_S, per_ctx_token_s=attn,
                                 per_prefill_token_s=0.19 / 65536, weight_load_s=load, max_num_seqs=256,
                                 static_slots=True),
        train=TrainCostModel(per_token_s=per_token, per_row_s=per_row, per_token_ctx_s=_FSDP_ATTN_S,
                             per_update_s=(9.866 - 2 * _FSDP_UPDATE_S) / 2, padded=True, pad_to_step=True),
        sync=SyncCostModel(fixed_s=transfer),
        prompt_tokens=33,
        notes="H200, hf engine + FSDP2, Qwen2.5-0.5B shape: benchmarks/RESULTS.md (GPU sections)",
    )


PRESETS["h200-qwen2.5-0.5b-hf"] = h200_qwen25_05b_hf
