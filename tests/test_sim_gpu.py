"""The H200 cost model (asyncrl.sim.presets.h200_qwen25_05b_hf) against the GPU runs it was taken from.

The decode constants come from ``benchmarks/hf_rollout_cuda.py`` on one H200, the trainer's update and the
syncs from the GPU sections of ``benchmarks/RESULTS.md``; the claim checked here is that the simulator with
them predicts the measured colocated one-GPU run (``tests/data/avc_gpu_colocated_h200.json``) within 15%.
"""

import asyncio
import importlib.util
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from asyncrl.rollout.base import SamplingParams
from asyncrl.sim import RolloutCostModel, TrainCostModel
from asyncrl.sim.clock import run
from asyncrl.sim.presets import PRESETS, h200_qwen25_05b_hf
from asyncrl.sim.engines import CostModelInferenceEngine
from asyncrl.sim.train_engines import CostModelTrainEngine

REPO = Path(__file__).resolve().parents[1]
MEASURED = json.loads((REPO / "tests" / "data" / "avc_gpu_colocated_h200.json").read_text())["modes"]["colocated"]
RUNS = {(1024, 128): "avc_gpu_colocated_h200_1024.json", (512, 64): "avc_gpu_colocated_h200_512.json"}
"""The shorter H200 runs of session 6: (max, median) response tokens -> recorded benchmark JSON."""


def _colocated(name):
    return json.loads((REPO / "tests" / "data" / name).read_text())["modes"]["colocated"]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("async_vs_colocate", REPO / "benchmarks" / "async_vs_colocate.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["async_vs_colocate"] = mod
    spec.loader.exec_module(mod)
    return mod


def _generate(cost, prompt_tokens, lengths):
    """Start one request per length at once on a replica priced by ``cost``; (virtual seconds, outputs)."""
    async def main():
        eng = CostModelInferenceEngine(cost, prompt_tokens=prompt_tokens)
        loop = asyncio.get_running_loop()
        outs = await asyncio.gather(*[eng.generate(f"r{i}", [1], SamplingParams(max_tokens=n, ignore_eos=True))
                                      for i, n in enumerate(lengths)])
        return loop.time(), outs

    return run(main)


def test_h200_model_reproduces_the_measurements_it_was_taken_from():
    cost = h200_qwen25_05b_hf("cuda_ipc", "masked")  # the engine of these runs (sessions 5-9)
    # hf_rollout_cuda.py run 2: 256 rows, 256-token prompts, 256 new tokens -> 50,522 tokens/s, prefill 0.19 s
    seconds, outs = _generate(cost.rollout, 256, [256] * 256)
    assert sum(len(o.token_ids) for o in outs) == 65536
    assert 65536 / seconds == pytest.approx(50522, rel=0.03)
    assert cost.rollout.prefill_time(65536) == pytest.approx(0.19)
    # one FSDP2 update of the colocated run: 128 rows padded to 2,081 tokens, 4.826 s (perf/step_s) + host work;
    # two per step = the measured timing/update_s median
    update = cost.train.update_time([2081] * 128)
    assert 2 * update == pytest.approx(statistics.median(r["timing/update_s"] for r in MEASURED["history"][1:]), rel=0.03)
    assert cost.sync.transfer_time() == pytest.approx(MEASURED["step_split"]["sync"], rel=0.01)
    # the shorter runs: rows padded to 1,057 and 545 tokens; the least-squares line through all three updates
    for (max_tokens, _), name in RUNS.items():
        update = cost.train.update_time([33 + max_tokens] * 128) - cost.train.per_update_s  # the fitted part
        measured = statistics.median(r["perf/step_s"] for r in _colocated(name)["history"][1:])
        assert update == pytest.approx(measured, rel=0.10), (max_tokens, update, measured)  # -8%, +8%
    assert cost.train.per_row_s > 0.005  # the fixed part per row that a tokens-only line misses
    nccl = h200_qwen25_05b_hf("nccl")
    assert nccl.sync.transfer_time() + nccl.rollout.weight_load_s == pytest.approx(0.101, abs=1e-3)  # issue 9 (b)
    assert PRESETS["h200-qwen2.5-0.5b-hf"]().name == "h200-qwen2.5-0.5b-hf-nccl"
    with pytest.raises(ValueError, match="sync_backend"):
        h200_qwen25_05b_hf("gloo")
    with pytest.raises(ValueError, match="trainer_layout must be one of"):
        h200_qwen25_05b_hf("nccl", "packed")


S10_RUNS = {"avc_gpu_colocated_h200_s10_2048.json": (2048, 256), "avc_gpu_colocated_h200_s10_1024.json": (1024, 128),
            "avc_gpu_colocated_h200_s10_512.json": (512, 64)}
"""Session 10, one H200, one host within 8 minutes, the FSDP2 engine with the causal-only layout (3c2dad8):
file -> (max, median) response tokens. The 2,048 run also has colocated_dyn (use_dynamic_bsz)."""


def test_causal_layout_update_is_the_grids_per_call_cost_plus_a_per_token_line():
    """Today's engine: 16 calls of 8 rows per 128-row update at 0.147 s each (the session-9 grid, measured
    apart from the pipeline) plus one per-token cost fitted through the three runs; no per-row term."""
    cost = h200_qwen25_05b_hf("cuda_ipc")
    assert cost.name == "h200-qwen2.5-0.5b-hf-cuda_ipc" and cost.train.per_row_s == 0.0
    assert cost.train.per_micro_batch_s == pytest.approx(0.147)
    train = replace(cost.train, micro_batch_rows=8)
    for name, (max_tokens, _) in S10_RUNS.items():
        history = _colocated(name)["history"]
        measured = statistics.median(r["perf/step_s"] for r in history[1:])  # 3.897, 3.076, 2.720
        assert train.update_time([33 + max_tokens] * 128) - train.per_update_s == pytest.approx(measured, rel=0.01)
    two = statistics.median(r["timing/update_s"] for r in _colocated("avc_gpu_colocated_h200_s10_2048.json")["history"][1:])
    assert 2 * train.update_time([2081] * 128) == pytest.approx(two, rel=0.01)
    # without the micro-batch rows it would be one call: 15 calls' fixed cost fewer
    assert train.update_time([2081] * 128) - cost.train.update_time([2081] * 128) == pytest.approx(15 * 0.147)
    # the old engine paid per row instead, and more at 2,081 tokens
    masked = replace(h200_qwen25_05b_hf("cuda_ipc", "masked").train, micro_batch_rows=8)
    assert masked.update_time([2081] * 128) > 1.2 * train.update_time([2081] * 128)


@pytest.mark.parametrize("name", list(S10_RUNS))
def test_colocated_predictions_hold_for_the_causal_layout_runs(bench, tmp_path, name):
    """The three session-10 runs through the benchmark's own path: the result's ``trainer_layout`` picks the
    engine's model. Measured vs simulated samples/s, whole / steady (session 12: the whole rate with the
    first-step warm-up, the steady one over the benchmark's window): 2,048: 1.589 / 1.717 vs 1.563 / 1.674;
    colocated_dyn 2.107 / 2.263 vs 2.043 / 2.238; 1,024: 2.744 / 2.930 vs 2.564 / 2.881; 512: 3.768 / 4.167
    vs 3.474 / 4.086."""
    result = json.loads((REPO / "tests" / "data" / name).read_text())
    assert result["trainer_layout"] == "causal"
    max_tokens, median_tokens = S10_RUNS[name]
    args = _gpu_args(bench, tmp_path, gpus=1, simulate_only=False, gpu_max_tokens=max_tokens,
                     gpu_median_tokens=median_tokens, steps=6)
    sim = bench.simulate_modes(result, args)
    for m, measured in result["modes"].items():
        assert sim[m]["samples_per_s"] == pytest.approx(measured["samples_per_s"], rel=0.15), (m, sim[m])
        assert sim[m]["steady_samples_per_s"] == pytest.approx(measured["steady_samples_per_s"], rel=0.15), (m, sim[m])
        assert sim[m]["gen_s"] == pytest.approx(measured["step_split"]["gen"], rel=0.15)
    assert sim["colocated"]["update_s"] == pytest.approx(result["modes"]["colocated"]["step_split"]["update"], rel=0.05)
    if "colocated_dyn" in sim:  # the packed update is priced short (3.03 vs 3.80 s per step): this engine still
        # planned cuDNN attention for every packed shape (session 11), which the packed per-call cost does not hold
        assert sim["colocated_dyn"]["update_s"] < 0.85 * result["modes"]["colocated_dyn"]["step_split"]["update"]


def test_micro_batch_calls_are_priced_per_rank():
    cost = TrainCostModel(per_token_s=0.0, per_micro_batch_s=1.0, padded=True, micro_batch_rows=8)
    assert cost.pass_time([10] * 16) == pytest.approx(2.0) and cost.pass_time([10] * 17) == pytest.approx(3.0)
    assert replace(cost, n_ranks=2).pass_time([10] * 16) == pytest.approx(1.0)  # 8 rows per rank: one call each
    packed = replace(cost, max_token_len=30)
    assert packed.pass_time([10, 10, 10, 20]) == pytest.approx(2.0)  # [10, 10, 10] [20]: two calls


def test_static_slots_price_the_rows_up_to_the_highest_occupied_slot():
    """The hf engine computes rows [0, R), R the power-of-two bucket above the highest active slot: a long
    request in a high slot keeps every row busy, one in slot 0 runs alone."""
    cost = RolloutCostModel(step_s=0.0, per_seq_s=1e-3, per_ctx_token_s=0.0, max_num_seqs=8, static_slots=True)
    tail_high, _ = _generate(cost, 1, [10, 10, 20])  # slots 0, 1, 2: R = 4 for all 20 iterations
    tail_low, _ = _generate(cost, 1, [20, 10, 10])  # the long one in slot 0: R = 4, then R = 1
    paged, _ = _generate(RolloutCostModel(step_s=0.0, per_seq_s=1e-3, per_ctx_token_s=0.0), 1, [10, 10, 20])
    assert tail_high == pytest.approx(0.080) and tail_low == pytest.approx(0.050) and paged == pytest.approx(0.040)
    # attention: both rows over the longest context (1 + g at iteration g, integrated in closed form), also
    # after the short request ended; the paged form prices the summed context instead
    attn = RolloutCostModel(step_s=0.0, per_seq_s=0.0, per_ctx_token_s=1e-3, max_num_seqs=8, static_slots=True)
    t, _ = _generate(attn, 1, [10, 20])
    assert t == pytest.approx(2 * 1e-3 * (20 + 20 ** 2 / 2))
    paged_attn, _ = _generate(RolloutCostModel(step_s=0.0, per_seq_s=0.0, per_ctx_token_s=1e-3), 1, [10, 20])
    assert paged_attn == pytest.approx(1e-3 * (10 + 10 ** 2 / 2) + 1e-3 * (20 + 20 ** 2 / 2))


def test_compact_slots_price_the_bucket_above_the_running_count():
    """Since session 26 the hf engine moves running requests to the lowest slots before each step
    (``ContinuousBatcher.compact``): a long request left in slot 2 after two short ones finished runs alone."""
    cost = RolloutCostModel(step_s=0.0, per_seq_s=1e-3, per_ctx_token_s=0.0, max_num_seqs=8, static_slots=True,
                            compact_slots=True)
    tail_high, _ = _generate(cost, 1, [10, 10, 20])  # 3 running: R = 4 for 10 iterations, then R = 1 for 10
    five, _ = _generate(cost, 1, [10] * 4 + [20])  # 5 running: R = 8, then 1
    assert tail_high == pytest.approx(0.050) and five == pytest.approx(0.090)
    attn = replace(cost, per_seq_s=0.0, per_ctx_token_s=1e-3)  # every row still attends the longest context
    t, _ = _generate(attn, 1, [10, 20, 20])  # R = 4 for 10 iterations, then R = 2 for 10
    assert t == pytest.approx(1e-3 * (4 * (10 + 10 ** 2 / 2) + 2 * (10 + (20 ** 2 - 10 ** 2) / 2)))


def test_rollout_slots_pick_the_engine_a_recorded_run_was_measured_on(bench, tmp_path):
    """A ``--gpu`` result records ``rollout_slots`` since session 26; one without it ran the engine that
    computed every slot up to the highest busy one, and is simulated so; today's is predicted faster on a long tail."""
    import gpu_sim  # benchmarks/ is on the path (the bench fixture)

    assert gpu_sim.ROLLOUT_SLOTS == "compact"
    assert h200_qwen25_05b_hf("cuda_ipc").rollout.compact_slots
    old = h200_qwen25_05b_hf("cuda_ipc", rollout_slots="highest")
    assert not old.rollout.compact_slots and old.name == "h200-qwen2.5-0.5b-hf-cuda_ipc-highest-slot"
    with pytest.raises(ValueError, match="rollout_slots must be one of"):
        h200_qwen25_05b_hf("cuda_ipc", rollout_slots="lowest")
    result = json.loads((REPO / "tests" / "data" / "avc_gpu_colocated_h200_s19_m192_1536.json").read_text())
    assert "rollout_slots" not in result
    argv = result["argv"]
    args = _gpu_args(bench, tmp_path, gpus=1, simulate_only=False, gpu_max_tokens=1536, gpu_median_tokens=192, steps=8)
    before = gpu_sim.simulate_measured({**result, "modes": {"colocated": result["modes"]["colocated"]}}, args,
                                       bench.mode_config)["colocated"]
    now = gpu_sim.simulate_measured({**result, "rollout_slots": "compact",
                                     "modes": {"colocated": result["modes"]["colocated"]}}, args,
                                    bench.mode_config)["colocated"]
    assert "--gpu-max-tokens" in argv and before["gen_s"] == pytest.approx(7.65, rel=0.02)  # session 19's prediction
    assert now["gen_s"] < 0.95 * before["gen_s"]


def test_fsdp_updates_pad_every_row_to_the_steps_longest():
    from asyncrl.trainer.engine import Batch

    def batch(lengths, width):
        mask = torch.zeros(len(lengths), width)
        for i, n in enumerate(lengths):
            mask[i, :n] = 1
        ids = torch.zeros(len(lengths), width, dtype=torch.long)
        return Batch(ids, mask.long(), mask.long(), mask, mask, torch.zeros(len(lengths)), list(range(len(lengths))),
                     mask.long())

    step = TrainCostModel(per_token_s=1.0, padded=True, pad_to_step=True)
    mini = TrainCostModel(per_token_s=1.0, padded=True)
    b = batch([10, 20], width=100)  # a mini-batch selected from a step whose longest response is 100
    for cost, seconds in ((step, 200), (mini, 40)):
        eng = CostModelTrainEngine(cost, prompt_tokens=0)
        eng.update(b, None)
        assert eng.busy_s == seconds


def test_colocated_one_gpu_prediction_is_within_15_percent_of_the_h200_run(bench, tmp_path, capsys):
    """The measured run's JSON through the benchmark's own --gpu path: simulate_modes, then report()."""
    result = json.loads((REPO / "tests" / "data" / "avc_gpu_colocated_h200.json").read_text())
    args = _gpu_args(bench, tmp_path, gpus=1, simulate_only=False)
    result["simulated"] = bench.simulate_modes(result, args)
    row = result["simulated"]["colocated"]
    assert row["samples_per_s"] == pytest.approx(MEASURED["samples_per_s"], rel=0.15)  # 1.410 whole run
    assert row["steady_samples_per_s"] == pytest.approx(MEASURED["steady_samples_per_s"], rel=0.15)  # 1.550 steady
    assert abs(row["error"]) <= 0.15 and abs(row["steady_error"]) <= 0.15
    split = MEASURED["step_split"]  # the parts: generation is the independent check (update and sync are inputs)
    assert row["gen_s"] == pytest.approx(split["gen"], rel=0.15)
    assert row["update_s"] == pytest.approx(split["update"], rel=0.05)
    assert row["trainer_idle_ratio"] == pytest.approx(MEASURED["trainer_idle_ratio"], abs=0.1)
    bench.report(result)  # the simulated row printed under the measured one, as on the CPU path
    out = capsys.readouterr().out
    sim_line = next(line for line in out.splitlines()[out.splitlines().index(next(
        line for line in out.splitlines() if line.startswith("simulated (asyncrl.sim with the documented H200"))):]
        if line.startswith("colocated"))
    assert f"{row['samples_per_s']:.3f} samples/s ({100 * row['error']:+.0f}% vs measured; " in sim_line, sim_line
    assert f"steady {row['steady_samples_per_s']:.3f}, {100 * row['steady_error']:+.0f}% vs steady" in sim_line, sim_line


@pytest.mark.parametrize("max_tokens,median_tokens", list(RUNS))
def test_colocated_prediction_holds_for_the_shorter_h200_runs(bench, tmp_path, max_tokens, median_tokens):
    """Session 6, one H200, each predicted before it ran: max 1,024 (the tokens-only update model said +38%
    samples/s) and max 512 (the two-point line said -5% / -17% steady, update +28%). The update is fitted
    through all three runs now, so generation (the decode model, untouched) is what each run checks on its
    own. The sim has no warm-up (the first step compiles and captures CUDA graphs), so the claim is on the
    steady rate; the whole-run rate is looser."""
    measured = _colocated(RUNS[(max_tokens, median_tokens)])
    result = {"modes": {"colocated": measured}}
    args = _gpu_args(bench, tmp_path, gpus=1, simulate_only=False, gpu_median_tokens=median_tokens,
                     gpu_max_tokens=max_tokens, steps=6)
    row = bench.simulate_modes(result, args)["colocated"]
    assert row["steady_samples_per_s"] == pytest.approx(measured["steady_samples_per_s"], rel=0.15)  # 2.576, 4.606
    assert row["samples_per_s"] == pytest.approx(measured["samples_per_s"], rel=0.15)  # 2.350, 4.007
    assert row["gen_s"] == pytest.approx(measured["step_split"]["gen"], rel=0.10)
    assert row["update_s"] == pytest.approx(measured["step_split"]["update"], rel=0.10)


def _gpu_args(bench, tmp_path, **kw):
    import argparse

    ns = argparse.Namespace(task="longtail", steps=3, time=0.0, backend="hf", set=None, out=str(tmp_path), gpu=True,
                            gpu_median_tokens=256, gpu_max_tokens=2048, gpus=2, simulate_only=True, json=None)
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


def test_simulate_only_prints_colocated_and_async_rows_and_their_ratio(bench, tmp_path, monkeypatch, capsys):
    out = tmp_path / "pred.json"
    monkeypatch.setattr(sys, "argv", ["async_vs_colocate.py", "--gpu", "--simulate-only", "--modes", "colocated,d",
                                      "--steps", "3", "--gpu-max-tokens", "2048", "--out", str(tmp_path),
                                      "--json", str(out)])
    bench.main()  # no Ray, no GPU, no weights built
    text = capsys.readouterr().out
    rows = {tuple(line.split()[:2]) for line in text.splitlines() if line.split()[:1] in (["colocated"], ["d"])}
    assert rows == {("colocated", "1"), ("colocated", "2"), ("d", "2")}, text
    assert "predicted d / colocated@2:" in text and "predicted d / colocated@1:" in text
    saved = json.loads(out.read_text())["predicted"]
    assert saved["ratios"]["d / colocated@2"] == pytest.approx(
        saved["rows"][2]["samples_per_s"] / saved["rows"][1]["samples_per_s"])
    assert not (tmp_path / "random_qwen2.5-0.5b").exists()
    monkeypatch.setattr(sys, "argv", ["async_vs_colocate.py", "--gpu", "--simulate-only", "--gpus", "1", "--modes", "d"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        bench.main()
    assert exit_.value.code == 2 and "need --gpus 2" in capsys.readouterr().err


def test_simulate_only_predicts_every_colocated_mode_asked_for(bench, tmp_path, monkeypatch, capsys):
    """colocated_dyn was left out of the prediction without a word (only 'colocated' and the async modes were
    set up); each colocated mode asked for now gets its rows, on 1 and --gpus GPUs."""
    monkeypatch.setattr(sys, "argv", ["async_vs_colocate.py", "--gpu", "--simulate-only", "--gpus", "1", "--modes",
                                      "colocated,colocated_dyn", "--steps", "3", "--gpu-max-tokens", "1024",
                                      "--out", str(tmp_path)])
    bench.main()
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    modes = {tuple(r[:2]) for r in rows if r[:1] in (["colocated"], ["colocated_dyn"])}
    assert modes == {("colocated", "1"), ("colocated_dyn", "1")}, rows
    assert all(len(r) == 11 for r in rows if r[:1] == ["colocated_dyn"])  # mode, GPUs and the nine predicted values
    assert ["predicted", "colocated_dyn@1", "/", "colocated@1:"] == next(r for r in rows if "colocated_dyn@1" in r)[:4]


TWO_GPU_RUNS = {"avc_gpu_x2_h200_2048.json": ("d", 2048, 8), "avc_gpu_x2_h200_2048_s1.json": ("d_s1", 2048, 7),
                "avc_gpu_x2_h200_4096.json": ("d_s1", 4096, 5)}
"""Session 7, two H200s, each predicted before it ran (``--simulate-only``): file -> (async mode, max response
tokens, steps). Each ran its async mode and colocated side by side in one benchmark call (median 256)."""


@pytest.mark.parametrize("name", list(TWO_GPU_RUNS))
def test_two_gpu_predictions_hold_for_async_and_colocated(bench, tmp_path, name):
    """Mode d and d_s1 train on GPU 1 while GPU 0 generates (NCCL sync); colocated generates on both and
    trains FSDP2 over both (cuda_ipc sync). Nothing of these runs is an input of the cost model: the steady
    rates and the async / colocated ratio are the out-of-sample check (the whole-run rate of the 5-step 4,096
    run is 18-19% under the sim's, median warm-up included: its first step took 17 s more than the model)."""
    mode, max_tokens, steps = TWO_GPU_RUNS[name]
    result = json.loads((REPO / "tests" / "data" / name).read_text())
    assert set(result["modes"]) == {mode, "colocated"} and result["argv"][result["argv"].index("--gpus") + 1] == "2"
    args = _gpu_args(bench, tmp_path, gpus=2, simulate_only=False, gpu_max_tokens=max_tokens, steps=steps)
    sim = bench.simulate_modes(result, args)
    for m, measured in result["modes"].items():
        assert measured["steps"] == steps and measured["accounting_balanced"]
        assert sim[m]["steady_samples_per_s"] == pytest.approx(measured["steady_samples_per_s"], rel=0.15), (m, sim[m])
        assert sim[m]["samples_per_s"] == pytest.approx(measured["samples_per_s"], rel=0.25), (m, sim[m])
    ratio = result["modes"][mode]["samples_per_s"] / result["modes"]["colocated"]["samples_per_s"]
    predicted = sim[mode]["samples_per_s"] / sim["colocated"]["samples_per_s"]
    assert predicted == pytest.approx(ratio, rel=0.15), (ratio, predicted)  # 0.96 / 0.89, 1.27 / 1.16, 1.29 / 1.28
    # what each run shows: mode d below colocated (trainer-bound on one GPU, waiting on each wave's tail),
    # staleness 1 above it, at both lengths
    assert (ratio < 1) == (mode == "d")


def test_dynamic_bsz_prices_each_packed_micro_batch_at_its_longest_row():
    """use_dynamic_bsz: rows sorted and packed by rows x longest <= the budget (the trainer engine's own
    ``pack_by_token_budget``), each chunk priced at its longest; without it every row costs the step's width."""
    cost = TrainCostModel(per_token_s=1.0, per_row_s=0.5, padded=True, pad_to_step=True, max_token_len=30)
    assert cost.pass_time([100, 10, 10]) == pytest.approx(2 * (0.5 + 10) + (0.5 + 100))  # [10, 10] [100]
    assert TrainCostModel(per_token_s=1.0, per_row_s=0.5, padded=True).pass_time([100, 10, 10]) == pytest.approx(3 * 100.5)


def test_dynamic_bsz_run_on_one_h200_is_predicted(bench, tmp_path):
    """Session 8, one H200, max 2,048 / median 256: colocated with fixed 8-row micro-batches (every row padded
    to the step's longest, 266,368 tokens per update) vs use_dynamic_bsz at the same token budget (66-86k);
    the FSDP2 update fell from 10.0 to 4.1 s per step, samples/s 1.423 -> 1.848 (1.30x, steady 1.38x). The
    cost model was not refitted: only the packing rule was added (whole run +0.3%, steady -12%, the update
    priced 30% long: per_row_s is charged per row, fitted on 8-row micro-batches)."""
    result = json.loads((REPO / "tests" / "data" / "avc_gpu_colocated_dyn_h200_2048.json").read_text())
    args = _gpu_args(bench, tmp_path, gpus=1, simulate_only=False, steps=6)
    sim = bench.simulate_modes(result, args)
    measured = result["modes"]
    for m in ("colocated", "colocated_dyn"):
        assert sim[m]["steady_samples_per_s"] == pytest.approx(measured[m]["steady_samples_per_s"], rel=0.15), (m, sim[m])
        assert sim[m]["samples_per_s"] == pytest.approx(measured[m]["samples_per_s"], rel=0.15), (m, sim[m])
    ratio = measured["colocated_dyn"]["samples_per_s"] / measured["colocated"]["samples_per_s"]
    predicted = sim["colocated_dyn"]["samples_per_s"] / sim["colocated"]["samples_per_s"]
    assert ratio > 1.25 and predicted == pytest.approx(ratio, rel=0.15), (ratio, predicted)  # 1.30 / 1.27
    assert measured["colocated_dyn"]["step_split"]["update"] < 0.5 * measured["colocated"]["step_split"]["update"]


def test_dynamic_bsz_at_4096_tokens_was_predicted_before_it_ran(bench, tmp_path):
    """Session 8, one H200, max 4,096 (4-row micro-batches when padded), 4 steps, predicted first with the
    packing rule above: colocated 0.765 (measured 0.661 whole, 0.734 steady: +16% / +4%), colocated_dyn 1.004
    (measured 1.087 / 1.221: -8% / -18%). The token budget paid more at 4,096 (update 20.7 -> 4.7 s per step,
    1.64x) than the simulator said (1.31x): its padded update at 4,129 tokens is priced 26% short, its packed one
    17% long. Recorded as a miss, not fitted (the per-micro-batch overhead hypothesis in RESULTS.md).

    Session 12: with generation priced right (21.0 vs 21.2 s; it was 19% long) the padded row's steady rate is
    +16% (0.852 vs 0.734): the old engine's update model, fitted on 8-row micro-batches, prices its 4-row ones
    29% short (14.8 vs 20.7 s), which the long generation hid. The one recorded rate past 15%; the old engine
    is retired, so its model is not refitted. The packed row: -0% whole / -3% steady."""
    result = json.loads((REPO / "tests" / "data" / "avc_gpu_colocated_dyn_h200_4096.json").read_text())
    measured = result["modes"]
    assert all(m["steps"] == 4 and m["accounting_balanced"] for m in measured.values())
    sim = bench.simulate_modes(result, _gpu_args(bench, tmp_path, gpus=1, simulate_only=False, gpu_max_tokens=4096,
                                                 steps=4))
    pad, dyn = sim["colocated"], sim["colocated_dyn"]
    for m in ("colocated", "colocated_dyn"):
        assert sim[m]["gen_s"] == pytest.approx(measured[m]["step_split"]["gen"], rel=0.05), (m, sim[m])
    assert dyn["samples_per_s"] == pytest.approx(measured["colocated_dyn"]["samples_per_s"], rel=0.15)
    assert dyn["steady_samples_per_s"] == pytest.approx(measured["colocated_dyn"]["steady_samples_per_s"], rel=0.15)
    assert pad["steady_samples_per_s"] == pytest.approx(measured["colocated"]["steady_samples_per_s"], rel=0.20)
    assert pad["update_s"] < 0.75 * measured["colocated"]["step_split"]["update"]  # the old model's 4-row miss
    ratio = measured["colocated_dyn"]["samples_per_s"] / measured["colocated"]["samples_per_s"]
    predicted = dyn["samples_per_s"] / pad["samples_per_s"]
    assert ratio > 1.5 and 1.2 < predicted < ratio, (ratio, predicted)  # 1.64 measured, 1.35 predicted: the miss
    assert measured["colocated_dyn"]["step_split"]["update"] < 0.25 * measured["colocated"]["step_split"]["update"]


S11_PREDICTED = {"colocated": 0.763, "colocated_dyn": 1.102}
"""Session 11's predictions of its two 4,096 runs, printed before they ran and stored in the results."""


def test_the_4096_runs_were_predicted_before_they_ran_with_the_causal_layout_model(bench, tmp_path):
    """Session 11, one H200, max 4,096 / median 256, 4 steps each, two consecutive calls on one host; the
    prediction was printed before the runs. Colocated with 4-row micro-batches (32 calls per update): predicted
    0.763, measured 0.771 whole / 0.830 steady (-1% / -8%), update 15.47 vs 15.93 s per step; the old engine
    ran 0.661 with a 20.7 s update. colocated_dyn: predicted 1.102, measured 1.061 / 1.273 (+4% / -13%), by two
    errors that cancelled: generation priced 18% long (25.2 vs 21.3 s) and the packed update 38% short.

    Session 12's model (the runs' own batches, the decode slope refitted, 8.3 s of first-step warm-up): colocated
    0.804 / 0.855 steady (+4% / +3%), generation 21.0 vs 21.2 s; colocated_dyn 1.177 / 1.302 (+11% / +2%),
    generation 21.0 vs 21.3 s, its update still 23% short: this run planned cuDNN attention for every packed
    shape (the next test's run is the same batches without)."""
    measured = {}
    for name in ("avc_gpu_colocated_h200_s11_4096.json", "avc_gpu_colocated_dyn_h200_s11_4096.json"):
        result = json.loads((REPO / "tests" / "data" / name).read_text())
        assert result["trainer_layout"] == "causal" and len(result["modes"]) == 1
        args = _gpu_args(bench, tmp_path, gpus=1, simulate_only=False, gpu_max_tokens=4096, steps=4)
        (m, run), = result["modes"].items()
        assert result["simulated"][m]["samples_per_s"] == pytest.approx(S11_PREDICTED[m], abs=5e-4)  # as printed then
        row = bench.simulate_modes(result, args)[m]
        assert row["samples_per_s"] == pytest.approx(run["samples_per_s"], rel=0.15), (m, row)
        assert row["steady_samples_per_s"] == pytest.approx(run["steady_samples_per_s"], rel=0.15), (m, row)
        assert row["gen_s"] == pytest.approx(run["step_split"]["gen"], rel=0.05), (m, row)
        measured[m] = (run, row)
    (pad, pad_sim), (dyn, dyn_sim) = measured["colocated"], measured["colocated_dyn"]
    assert pad_sim["update_s"] == pytest.approx(pad["step_split"]["update"], rel=0.05)
    assert dyn_sim["update_s"] < 0.85 * dyn["step_split"]["update"]  # cuDNN's plans, not in the model
    ratio, predicted = dyn["samples_per_s"] / pad["samples_per_s"], dyn_sim["samples_per_s"] / pad_sim["samples_per_s"]
    assert predicted == pytest.approx(ratio, rel=0.10), (ratio, predicted)  # 1.38 measured, 1.46 predicted


def test_the_packed_update_without_cudnn_attention_is_its_fitted_price(bench, tmp_path):
    """Session 11, after the FSDP2 engine left cuDNN's attention out of packed forwards (a plan per new shape):
    the same 4,096 workload (same seeds, so the same batches), one host: the update 4.09 -> 3.30 s per step
    (optimizer steps 2.00 / 1.90 / 1.77 -> 1.51 / 1.56 / 1.28 s), the simulator's 2.52 24% short then.
    Session 12 fitted the packed call's fixed cost on this run alone (0.211 s), which priced the three packed runs
    after it (sessions 13 and 19) 13-15% long; session 31 fitted it on all four (0.183 s,
    ``_FSDP_PACKED_CALL_S``): this run's update 2.85 vs 3.30 s (-13%), the others' +3% / +4% / +4%
    (``test_the_packed_call_is_fitted_on_every_packed_h200_run``); samples/s here +12% / +5% steady."""
    from asyncrl.sim.presets import _FSDP_PACKED_CALL_S

    before = json.loads((REPO / "tests" / "data" / "avc_gpu_colocated_dyn_h200_s11_4096.json").read_text())["modes"]["colocated_dyn"]
    result = json.loads((REPO / "tests" / "data" / "avc_gpu_colocated_dyn_h200_s11b_4096.json").read_text())
    after = result["modes"]["colocated_dyn"]
    steps = lambda run: [r["perf/step_s"] for r in run["history"][1:]]  # noqa: E731
    assert all(a < 0.9 * b for a, b in zip(steps(after), steps(before)))  # the same batches, each faster
    row = bench.simulate_modes(result, _gpu_args(bench, tmp_path, gpus=1, simulate_only=False, gpu_max_tokens=4096,
                                                 steps=4))["colocated_dyn"]
    assert row["samples_per_s"] == pytest.approx(after["samples_per_s"], rel=0.15)
    assert row["steady_samples_per_s"] == pytest.approx(after["steady_samples_per_s"], rel=0.15)
    assert row["update_s"] == pytest.approx(after["step_split"]["update"], rel=0.15)
    assert h200_qwen25_05b_hf("cuda_ipc").train.per_packed_micro_batch_s == _FSDP_PACKED_CALL_S > 0.147
    assert h200_qwen25_05b_hf("cuda_ipc", "masked").train.per_packed_micro_batch_s is None  # the old engine: as fitted


PACKED_H200_RUNS = ("avc_gpu_colocated_dyn_h200_s11b_4096.json", "avc_gpu_colocated_dyn_h200_s13_m384_3072.json",
                    "avc_gpu_colocated_h200_s13_m128_1024.json", "avc_gpu_colocated_h200_s19_m192_1536.json")
"""The one-H200 runs of the packed engine without cuDNN attention (sessions 11-19): the packed call's fit."""


def _run_args(bench, tmp_path, result):
    """The namespace a recorded ``--gpu`` run's own arguments make (``--set`` overrides included)."""
    argv = result["argv"]
    arg = lambda k: int(argv[argv.index(k) + 1])  # noqa: E731
    steps = {m["steps"] for m in result["modes"].values()}
    assert len(steps) == 1
    sets = [v for i, v in enumerate(argv) if i and argv[i - 1] == "--set"]
    return _gpu_args(bench, tmp_path, gpus=arg("--gpus"), simulate_only=False, gpu_max_tokens=arg("--gpu-max-tokens"),
                     gpu_median_tokens=arg("--gpu-median-tokens"), steps=steps.pop(), set=sets or None)


def test_the_packed_call_is_fitted_on_every_packed_h200_run(bench, tmp_path):
    """Session 31: ``_FSDP_PACKED_CALL_S`` is the least-squares fit (relative error of the median update) over the
    four packed one-H200 runs, and it prices each update within 15% (-13% / +4% / +3% / +4%). The session-31 H100
    run at half the token budget (26 calls per step) is priced 57% long (3.63 s measured: that host's calls cost
    ~0.10 s): not an H200, not in the fit, its samples/s still within 15% (``test_every_recorded_run_...``)."""
    from asyncrl.sim import presets

    rows = []
    for name in PACKED_H200_RUNS:
        result = json.loads((REPO / "tests" / "data" / name).read_text())
        result["modes"] = {"colocated_dyn": result["modes"]["colocated_dyn"]}
        args = _run_args(bench, tmp_path, result)
        at = {}
        for call in (presets._FSDP_PACKED_CALL_S, 0.0):
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(presets, "_FSDP_PACKED_CALL_S", call)
                at[call] = bench.simulate_modes(result, args)["colocated_dyn"]["update_s"]
        measured = result["modes"]["colocated_dyn"]["step_split"]["update"]
        assert at[presets._FSDP_PACKED_CALL_S] == pytest.approx(measured, rel=0.15), name
        rows.append((at[0.0], (at[presets._FSDP_PACKED_CALL_S] - at[0.0]) / presets._FSDP_PACKED_CALL_S, measured))
    best = sum(k / m * (1 - b / m) for b, k, m in rows) / sum((k / m) ** 2 for b, k, m in rows)
    assert presets._FSDP_PACKED_CALL_S == pytest.approx(best, abs=0.001)


ALL_RUNS = sorted(p.name for p in (REPO / "tests" / "data").glob("avc_gpu_*.json"))
"""Every recorded ``--gpu`` run (sessions 5-19, one and two H200s, max 512 to 4,096 tokens; session 31: one H100,
median 320 / max 2,560, ``ppo_max_token_len_per_gpu=6336``, predicted before it ran by the H200 preset)."""
LOOSER = {("avc_gpu_colocated_dyn_h200_4096.json", "colocated"): (0.25, 0.20),
          ("avc_gpu_x2_h200_4096.json", "colocated"): (0.25, 0.15), ("avc_gpu_x2_h200_4096.json", "d_s1"): (0.25, 0.15)}
"""(whole, steady) bounds where 15% does not hold, session 12: the old engine's 4-row padded update priced 29%
short (steady +16%, whole +21%); the 5-step two-GPU 4,096 run's whole rate (+18% / +19%: its first step took
17 s more than the model, twice the median warm-up). Every other rate and every generation time: 15%."""


@pytest.mark.parametrize("name", ALL_RUNS)
def test_every_recorded_run_is_predicted_on_its_own_batches(bench, tmp_path, name):
    """Session 12: each recorded run through the benchmark's path with the run's own arguments. The simulated
    colocated steps carry the measured steps' response lengths (the run's data order: all ``train_size`` rows
    built; with the simulator's default 4,096 rows they were other prompts), the
    generation time of every colocated mode is within 15% (10% for sessions 10-11, held out of the decode fit:
    -8% to +5% now; the slope before session 12 put their 2,048 pair at +11% / +12%), and samples/s within 15% whole (the simulated wall
    plus ``H200_WARMUP_S``) and steady (the benchmark's own steady window), except ``LOOSER``."""
    from asyncrl.sim.presets import H200_WARMUP_S

    result = json.loads((REPO / "tests" / "data" / name).read_text())
    sim = bench.simulate_modes(result, _run_args(bench, tmp_path, result))
    for m, run in result["modes"].items():
        row = sim[m]
        if m.startswith("colocated"):  # a step trains the next 32 prompts; async steps take what finished first
            assert row["response_length_per_step"] == pytest.approx([h["response_length/mean"] for h in run["history"]])
        trained = run["steps"] * 32
        assert trained / row["samples_per_s"] - trained / row["no_warmup_samples_per_s"] == pytest.approx(H200_WARMUP_S)
        whole, steady = LOOSER.get((name, m), (0.15, 0.15))
        assert row["samples_per_s"] == pytest.approx(run["samples_per_s"], rel=whole), (m, row)
        assert row["steady_samples_per_s"] == pytest.approx(run["steady_samples_per_s"], rel=steady), (m, row)
        if "gen" in run["step_split"]:  # sessions 10-11 (trainer_layout recorded) were held out of the decode fit
            held_out = "trainer_layout" in result
            assert row["gen_s"] == pytest.approx(run["step_split"]["gen"], rel=0.10 if held_out else 0.15), (m, row)


def test_decode_attention_is_a_fitted_slope_plus_a_fixed_part_per_row():
    """Session 12: the decode attention's slope per KV position is 0.765 of the kernel's mean cost at kv 512
    (fitted on the colocated runs of sessions 5-8; held out, sessions 10-11's generation times are within 8%),
    the rest a fixed cost per row, so the hf bench's 4.29 ms per step at 256 rows x kv 448 (padded) is kept;
    the slope stays above the KV cache's read time (12,288 B per row per position at 80% of 4.8 TB/s)."""
    from asyncrl.sim import presets

    r = h200_qwen25_05b_hf("cuda_ipc").rollout
    pad = presets._HF_KV_BUCKET_PAD
    assert r.per_ctx_token_s == pytest.approx(0.765 * presets._HF_ATTN_S * pad)
    assert r.step_s + 256 * r.per_seq_s + 256 * 448 / pad * r.per_ctx_token_s == pytest.approx(4.29e-3)
    assert r.per_ctx_token_s / pad > 24 * 2 * 2 * 64 * 2 / (0.8 * 4.8e12)
    assert r.per_seq_s > presets._HF_ROW_S  # the attention's fixed part moved here
    assert r.step_s == pytest.approx(2.41e-3, abs=0.01e-3)  # the floor is unchanged
