"""Cost-model presets: :class:`~asyncrl.sim.cost_models.ClusterCostModel` s of machines the project
measured or documented, by name (``PRESETS``: the ``asyncrl sim --preset`` choices).

* :func:`cpu_embedded_vllm`: the embedded 0.56M model on the 2-core CPU box (calibrated there);
* :func:`h20_qwen25_7b`, :func:`h100_qwen25_7b`: Qwen2.5-7B from datasheets and the model's shapes (the
  H20 one checked against verl's published component timings);
* :func:`h200_qwen25_05b_hf`: the GPU rows of ``benchmarks/async_vs_colocate.py`` (hf engine + FSDP2
  trainer on H200s), every constant from a measurement in ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

from asyncrl.config_schema import ConfigError
from asyncrl.sim.cost_models import ClusterCostModel, RolloutCostModel, SyncCostModel, TrainCostModel

def cpu_embedded_vllm(cores: int = 1) -> ClusterCostModel:
    """The embedded 0.56M-parameter model on the 2-core CPU box, one vLLM-CPU replica and the torch
    trainer, each on ``cores`` cores (1: the async split, a core each; 2: colocated, both phases on both).

    Calibrated with :mod:`asyncrl.sim.calibrate` on this machine (command and numbers in
    ``benchmarks/RESULTS.md``): vLLM-CPU decode on this model is overhead-bound (the per-iteration
    floor dominates; the per-sequence term is small), the trainer's cost is linear in tokens (dynamic
    micro-batches), and a second core speeds decode up less than training. Its price is per token through the
    model (measured before the prefix grouper), so the grouper is priced as the simulated config asks for it
    (``shared_prefix=None``).

    Raises:
        asyncrl.config.ConfigError: ``cores`` other than 1 or 2.
    """
    if cores not in (1, 2):
        raise ConfigError(f"cores (--cores) must be 1 (the async split: a core each side) or 2 (colocated: both phases "
                          f"on both cores); got {cores}")
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
                             per_update_s=per_update_s, n_ranks=16, gpus_per_rank=sp,
                             shared_prefix=False),  # FSDP2: no prefix grouper
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
_HF_ATTN_SLOPE_S = 0.765 * _HF_ATTN_S
"""Decode attention per row per attended KV position beyond a fixed part per row: 5.49 ns, 0.765 of
``_HF_ATTN_S`` (session 12). Fitted, one constant, by least squares on the relative error of every steady
step's generation time of the colocated runs of sessions 5-8 (max 512 / 1,024 / 2,048 / 4,096, one and two
H200s), the runs of sessions 10-11 held out; the rest of the kernel's 0.94 ms at kv 512 (``_HF_ATTN_S`` x 448
per row at the anchor, less this slope x 448: 0.76 us per row) is a fixed cost per row (``per_seq_s``), so the
engine's 4.29 ms per step at 256 rows x kv 448 is unchanged. The KV read alone would be 3.2 ns (12,288 B per
position per row: 24 layers x 2 x 2 KV heads x 64 x bf16, at 80% of 4.8 TB/s)."""
_HF_STEP_256_S = 4.29e-3
"""Engine wall time per decode step at 256 rows, host work included, over kv_len 384 and 512 (mean 448):
4.29 ms (run 2 of the same section, 50,522 tokens/s)."""
_FSDP_UPDATES_S = {
    "causal": {2081: 3.897, 1057: 3.076, 545: 2.720},
    "masked": {2081: 4.826, 1057: 3.56, 545: 2.336},
}
"""Trainer layout -> padded row width -> seconds of one 128-row FSDP2 update (8-row micro-batches, 16 calls)
on one H200: median ``perf/step_s`` of steps 2-6 of three colocated runs, responses max 2,048 / 1,024 / 512.
``causal``: the engine since session 10 (right-padded rows run with the causal mask only), one host, one
session (``tests/data/avc_gpu_colocated_h200_s10_{2048,1024,512}.json``, "The pipeline's batch layout cost
the FSDP2 update a fifth"). ``masked``: the engine of sessions 5-9 (an attention mask over the pads and a
per-row logits gather; ``tests/data/avc_gpu_colocated_h200{,_1024,_512}.json``), kept so that the runs
recorded with it stay checkable."""
_FSDP_STEP_UPDATE_S = {"causal": 7.943, "masked": 9.866}
"""Median ``timing/update_s`` (two updates per step: collate, reward, advantages, the batch's trip to the
rank, two optimizer updates) of the max-2,048 run of each layout, steps 2-6."""
_FSDP_CALL_S = 0.147
"""Fixed seconds per forward + backward call of the FSDP2 engine (one micro-batch, any rows up to ~8k
tokens): the least-squares fit ``0.071 + calls x (0.147 + 3.3 us x tokens)`` over 22 train steps of all-real
rows ("The FSDP2 update is host-bound per micro-batch: a grid on one H200"); an input of the ``causal``
layout, measured apart from the pipeline."""
_FSDP_PACKED_CALL_S = 0.183
"""Fixed seconds per packed forward + backward call (``use_dynamic_bsz``, causal layout, cuDNN attention off for
packed calls, as the engine runs them since session 11), after the per-token and attention terms of the padded fit:
least squares on the relative error of the median ``timing/update_s`` of the four one-H200 runs of that engine
(session 31: ``tests/data/avc_gpu_colocated_dyn_h200_s11b_4096.json``, ``..._dyn_h200_s13_m384_3072.json``,
``..._h200_s13_m128_1024.json``, ``..._h200_s19_m192_1536.json``; 10 / 13.5 / 6 / 8 calls per step as the simulator
packs their batches). Each alone would take 0.227 / 0.173 / 0.174 / 0.172 s; the fit leaves them at -13% / +4% / +3% /
+4%. Session 12 had fitted 0.211 on the first run alone, which priced the three later runs' updates 13-15% long."""
_FSDP_ATTN_S = 56.6e-3 / (8 * 4096) / (4096 / 2)
"""Causal attention per token per context token in training: 56.6 ms of cuDNN flash attention per step of
8 x 4,096 tokens per GPU ("Trainer: FSDP2, Qwen2.5-0.5B shapes, seq 4096, 2 H200", the profile table)."""
H200_WARMUP_S = 8.3
"""Seconds the first step of a measured ``--gpu`` run takes beyond what the steady model prices (CUDA-graph
captures and the first compiles of the hf engine, ~2 s; the first FSDP2 calls, ~3 s; the rest before the
first step): the median, over the colocated runs of sessions 5-8 (10 modes), of the measured minus simulated
``time_s`` of step 1 (3.9-23.9 s; the runs of sessions 10-11, held out, have median 8.2 s, 2.8-17.9 s; session
12). Not simulated: :mod:`benchmarks.gpu_sim` adds it to the simulated wall of the whole-run rate only."""
SYNC_S = {"cuda_ipc": (0.1185, 0.0), "nccl": (0.0092 + 0.0834, 0.0087)}
"""``(transfer s, load s)`` of one 0.99 GB sync. ``cuda_ipc`` (colocated): median ``sync/total_s`` of "GPU
row, session 5" run 3 (pause 5 ms + pack and load 107 ms + resume 7 ms; the load is in the transfer).
``nccl`` (separate GPUs): the in-pipeline stall of "GPU: the whole pipeline on two H200s" (b), pause 9.2 +
transfer 83.4 ms, then load + resume 8.7 ms."""
TRAINER_LAYOUTS = tuple(_FSDP_UPDATES_S)
"""The FSDP2 engine's batch layouts the H200 preset can price (``causal``: today's engine)."""
ROLLOUT_SLOTS = ("compact", "highest")
"""The hf engine's slot layouts the H200 preset can price (:attr:`RolloutCostModel.compact_slots`): ``compact``
(today's engine: running requests moved to the lowest slots each step, session 26) or ``highest`` (before: a
step computed every slot up to the highest busy one; the recorded runs of sessions 5-19)."""


def _fsdp_train(layout: str) -> TrainCostModel:
    """The FSDP2 update model of ``layout``, fitted through its three measured updates (attention first)."""
    updates, calls = _FSDP_UPDATES_S[layout], 128 // 8
    call_s = _FSDP_CALL_S if layout == "causal" else 0.0
    widths = list(updates)
    rest = [(updates[w] - calls * call_s) / 128 - _FSDP_ATTN_S * w * w / 2 for w in widths]
    if layout == "causal":  # per call + per token, through the origin (a per-row term fits 0.06 ms: none)
        per_token = sum(w * r for w, r in zip(widths, rest)) / sum(w * w for w in widths)
        per_row = 0.0
    else:  # per row + per token, least squares (the model of sessions 6-9)
        mw, mr = sum(widths) / len(widths), sum(rest) / len(rest)
        per_token = sum((w - mw) * (r - mr) for w, r in zip(widths, rest)) / sum((w - mw) ** 2 for w in widths)
        per_row = mr - per_token * mw
    return TrainCostModel(per_token_s=per_token, per_row_s=per_row, per_token_ctx_s=_FSDP_ATTN_S,
                          per_micro_batch_s=call_s,
                          per_packed_micro_batch_s=_FSDP_PACKED_CALL_S if layout == "causal" else None, per_update_s=(_FSDP_STEP_UPDATE_S[layout] - 2 * updates[2081]) / 2,
                          padded=True, pad_to_step=True, shared_prefix=False)  # FSDP2: no prefix grouper


def h200_qwen25_05b_hf(sync_backend: str = "nccl", trainer_layout: str = "causal",
                       rollout_slots: str = "compact") -> ClusterCostModel:
    """The GPU workload of ``benchmarks/async_vs_colocate.py --gpu``: random-init Qwen2.5-0.5B shape (bf16),
    the ``hf`` rollout engine with CUDA-graph decode (one replica per H200, 256 KV slots) and the FSDP2
    trainer (one rank per H200, micro-batches of ``ppo_micro_batch_size`` rows padded to the step's longest,
    or packed by ``ppo_max_token_len_per_gpu`` with ``use_dynamic_bsz``), ~33-token prompts.

    Measured (``benchmarks/RESULTS.md``; the module constants above quote each source):

    * decode, static slots (:attr:`RolloutCostModel.static_slots`): the engine's 4.29 ms wall per step at 256
      rows x kv 448 (mean); attention there from the kernel table (0.94 ms at kv 512), split into a slope per
      KV position (``per_ctx_token_s``: 0.765 of the kernel's mean cost, times the kv-bucket padding 1.16) and a
      fixed part per row (in ``per_seq_s``); the slope is the one fitted constant of the decode model (session
      12: on the colocated runs of sessions 5-8, held out sessions 10-11; ``_HF_ATTN_SLOPE_S``);
    * prefill: 65,536 prompt tokens in 0.19 s (2.9 us per token);
    * training, ``causal`` (today's engine): 0.147 s per forward + backward call (the session-9 grid, apart
      from the pipeline) plus ``per_token_s`` fitted through the three colocated runs' 128-row updates
      (3.897 / 3.076 / 2.720 s at 2,081 / 1,057 / 545 tokens, within 1% of each), after causal attention
      (``per_token_ctx_s``, issue 6's profile); no per-row term (it fits 0.06 ms). ``masked`` (the engine of
      sessions 5-9, for the runs recorded with it): a per-row term (~13.5 ms) instead of the per-call one,
      fitted through that engine's three updates (4.826 / 3.56 / 2.336 s; within 8% of each);
      ``per_update_s`` = the rest of ``timing/update_s`` (collate, reward, advantages, the batch's trip);
      ``causal`` packed calls (``use_dynamic_bsz``, cuDNN attention off): 0.183 s fixed per call, fitted on
      the four runs of that engine (``_FSDP_PACKED_CALL_S``);
    * sync: ``cuda_ipc`` 0.1185 s per step (colocated), ``nccl`` 0.101 s (separate GPUs), 0.99 GB.

    Assumed (not measured): how the 3.47 ms of non-attention decode time at 256 rows splits into a
    per-iteration floor (2.41 ms: host work 0.65 ms, the weight read, launches) and per-row work (4.1 us,
    from the kernel table); attention linear in kv_len down to short contexts; no fixed cost per prefill
    (the engine's eager prefill forward); FSDP2 over ``n`` ranks divides a padded update by ``n`` with the
    collectives hidden (issue 6: NCCL overlapped on its own stream) and the same ``per_update_s``; no
    warm-up in the simulation (the measured runs' first step also captures CUDA graphs and compiles:
    ``H200_WARMUP_S``, 8.3 s median, which ``benchmarks/gpu_sim.py`` adds to a whole run's wall).

    Args:
        sync_backend: ``cuda_ipc`` (colocated: trainer rank and replica on one GPU) or ``nccl``.
        trainer_layout: ``causal`` (the FSDP2 engine since session 10) or ``masked`` (before it).
        rollout_slots: ``compact`` (the hf engine since session 26: a decode step computes the power-of-two bucket
            above the running requests' count) or ``highest`` (before it: above the highest busy slot; every
            constant above was measured on that engine, whose steps were full batches where they were measured).

    Raises:
        ValueError: an unknown ``sync_backend``, ``trainer_layout`` or ``rollout_slots``.
    """
    if sync_backend not in SYNC_S:
        raise ValueError(f"sync_backend must be one of {sorted(SYNC_S)}, got {sync_backend!r}")
    if trainer_layout not in _FSDP_UPDATES_S:
        raise ValueError(f"trainer_layout must be one of {list(TRAINER_LAYOUTS)}, got {trainer_layout!r}")
    if rollout_slots not in ROLLOUT_SLOTS:
        raise ValueError(f"rollout_slots must be one of {list(ROLLOUT_SLOTS)}, got {rollout_slots!r}")
    attn = _HF_ATTN_SLOPE_S * _HF_KV_BUCKET_PAD
    step_s = _HF_STEP_256_S - 256 * 448 * _HF_ATTN_S - 256 * _HF_ROW_S
    per_row = _HF_ROW_S + 448 * (_HF_ATTN_S - _HF_ATTN_SLOPE_S)  # the attention's fixed part per row
    transfer, load = SYNC_S[sync_backend]
    suffix = "" if trainer_layout == "causal" else f"-{trainer_layout}"
    suffix += "" if rollout_slots == "compact" else "-highest-slot"
    return ClusterCostModel(
        name=f"h200-qwen2.5-0.5b-hf-{sync_backend}{suffix}",
        rollout=RolloutCostModel(step_s=step_s, per_seq_s=per_row, per_ctx_token_s=attn,
                                 per_prefill_token_s=0.19 / 65536, weight_load_s=load, max_num_seqs=256,
                                 static_slots=True, compact_slots=rollout_slots == "compact"),
        train=_fsdp_train(trainer_layout),
        sync=SyncCostModel(fixed_s=transfer),
        prompt_tokens=33,
        notes="H200, hf engine + FSDP2, Qwen2.5-0.5B shape: benchmarks/RESULTS.md (GPU sections)",
    )


PRESETS["h200-qwen2.5-0.5b-hf"] = h200_qwen25_05b_hf
