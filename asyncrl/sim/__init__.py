"""asyncrl.sim: the real fully-async control logic in virtual time against engine cost models.

>>> from asyncrl.sim import simulate, h20_qwen25_7b
>>> result = simulate(cfg, h20_qwen25_7b(), rollout_gpus=64, train_gpus=64, token_scale=64)
>>> result.samples_per_s, result.trainer_idle_ratio

See :mod:`asyncrl.sim.runner` (what runs), :mod:`asyncrl.sim.clock` (virtual time),
:mod:`asyncrl.sim.cost_models` (the cost models; the trainer's prefix grouper priced by
:mod:`asyncrl.sim.prefix_pricing`), :mod:`asyncrl.sim.workload` (response lengths: measured, a run's
own, or the task's), :mod:`asyncrl.sim.presets` (measured machines by name) and :mod:`asyncrl.sim.sweep`.
"""

from asyncrl.sim.clock import SimulationStalled, VirtualTimeLoop, charge
from asyncrl.sim.cost_models import ClusterCostModel, RolloutCostModel, SyncCostModel, TrainCostModel
from asyncrl.sim.presets import PRESETS, cpu_embedded_vllm, h20_qwen25_7b, h100_qwen25_7b, h200_qwen25_05b_hf
from asyncrl.sim.runner import SimResult, simulate

__all__ = ["PRESETS", "ClusterCostModel", "RolloutCostModel", "SimResult", "SimulationStalled", "SyncCostModel",
           "TrainCostModel", "VirtualTimeLoop", "charge", "cpu_embedded_vllm", "h100_qwen25_7b", "h200_qwen25_05b_hf",
           "h20_qwen25_7b", "simulate"]
