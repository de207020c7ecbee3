"""DESIGN.md section 4 formulas for several configs, including the seed's worked example."""

import pytest

from asyncrl.config import load_config
from asyncrl.staleness import max_concurrent_samples, max_required_samples, required_samples, sample_budget, staleness_bound


def test_seed_example():
    # mini batch 64, staleness 1.0, trigger 1, 2 replicas x 32 -> max_required 128, max_concurrent 64
    req = required_samples(64, 1)
    assert req == 64
    assert max_required_samples(req, 1.0, 1) == 128
    assert max_concurrent_samples(2, 32, 128) == 64


@pytest.mark.parametrize("mb,rb,s,trig,reps,per,exp_req,exp_max,exp_conc", [
    (16, 2, 0.0, 1, 1, 256, 32, 32, 32),     # mode a
    (16, 2, 0.0, 4, 1, 256, 32, 128, 128),   # mode b
    (16, 2, 0.5, 1, 1, 256, 32, 48, 48),     # modes c/d
    (32, 1, 0.3, 2, 4, 8, 32, 83, 32),       # int() truncation, concurrency-bound
])
def test_formulas(mb, rb, s, trig, reps, per, exp_req, exp_max, exp_conc):
    cfg = load_config(overrides=[
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mb}", f"async_training.require_batches={rb}",
        f"async_training.staleness_threshold={s}", f"async_training.trigger_parameter_sync_step={trig}",
        f"actor_rollout_ref.rollout.num_replicas={reps}", f"actor_rollout_ref.rollout.concurrent_samples_per_replica={per}"])
    b = sample_budget(cfg)
    assert (b.required_samples, b.max_required_samples, b.max_concurrent_samples) == (exp_req, exp_max, exp_conc)


def test_staleness_bound():
    assert staleness_bound(0.0, True) == 0 and staleness_bound(0.0, False) == 0
    assert staleness_bound(0.5, False) == 1 and staleness_bound(0.5, True) == 2
    assert staleness_bound(2.0, False) == 2


def test_the_read_ahead_is_what_can_start_at_once_whatever_the_staleness_budget(capsys):
    """s35 newcomer #1: the rollouter's read-ahead queue was sized by max_required_samples, 32 x (1e9 + 1) rows at
    ``staleness_threshold=1e9``, and its feed loop, cycling epochs to fill it, grew by ~80 MB/s until killed. The
    bound is max_concurrent_samples now; the same simulated run ends, as at a staleness of 100."""
    from asyncrl.cli import main
    from asyncrl.config import ExperimentConfig
    from asyncrl.staleness import sample_budget

    cfg = ExperimentConfig()
    cfg.async_training.staleness_threshold = 1e9
    b = sample_budget(cfg)
    assert b.max_required_samples == 150 * 32 and b.read_ahead == b.max_concurrent_samples == 256  # the run's cap
    cfg.actor_rollout_ref.rollout.concurrent_samples_per_replica = 8
    assert sample_budget(cfg).read_ahead == 8
    rows = []
    for s in ("1e9", "100"):
        assert main(["sim", "task=longtail", "trainer.total_training_steps=2", f"async_training.staleness_threshold={s}"]) == 0
        rows.append(capsys.readouterr().out.split("samples/s")[0].split()[-1])
    assert rows[0] == rows[1]  # the budget binds at neither: the same run


def test_the_run_trains_no_more_than_its_steps_so_no_more_is_outstanding(capsys):
    """s36: ``concurrent_samples_per_replica=1e9`` with ``staleness_threshold=1e9`` left nothing to bound the groups in
    flight: the rollouter admitted every row, epoch after epoch (``asyncrl sim`` of 3 steps: 24 GB in 6 minutes,
    killed by the kernel). ``max_required_samples`` is capped by what the run trains, total_training_steps x
    required_samples (96 here), so the same simulation ends, in seconds, without a warning (768 sequences in flight,
    3x the engine's 256 seats)."""
    from asyncrl.cli import main
    from asyncrl.config import ExperimentConfig
    from asyncrl.staleness import in_flight_warning, sample_budget

    cfg = ExperimentConfig()
    cfg.async_training.staleness_threshold, cfg.actor_rollout_ref.rollout.concurrent_samples_per_replica = 1e9, 10**9
    cfg.trainer.total_training_steps = 3
    b = sample_budget(cfg)
    assert (b.required_samples, b.max_required_samples, b.max_concurrent_samples, b.read_ahead) == (32, 96, 96, 96)
    assert in_flight_warning(cfg) is None
    cfg.trainer.total_training_steps = 4  # a cap below the verl formula's value only: 1 step's own staleness budget
    cfg.async_training.staleness_threshold = 1.0
    assert sample_budget(cfg).max_required_samples == 64
    assert main(["sim", "actor_rollout_ref.rollout.concurrent_samples_per_replica=1000000000",
                 "async_training.staleness_threshold=1e9", "trainer.total_training_steps=3"]) == 0
    out = capsys.readouterr().out
    assert "3 steps in" in out and "in flight" not in out


@pytest.mark.parametrize("trigger, steps", [(4, 2), (2, 1)])
def test_the_cap_holds_whole_sync_windows_so_a_colocated_round_longer_than_the_run_still_fits(trigger, steps, capsys):
    """s36's newcomer: capped at total_training_steps x required_samples, the queue (sized by max_required_samples)
    held 64 groups where a colocated round of trigger_parameter_sync_step=4 generates 128 at once, and the round
    waited for a put the full queue never took: the simulation ran to 16.7 million simulated seconds. The cap counts
    whole sync windows (ceil(steps / trigger) x trigger x required); the run ends."""
    from asyncrl.cli import main
    from asyncrl.recipes import longtail_grpo_cpu
    from asyncrl.staleness import run_samples, sample_budget

    cfg = longtail_grpo_cpu(colocated=True)
    cfg.async_training.trigger_parameter_sync_step, cfg.trainer.total_training_steps = trigger, steps
    req = sample_budget(cfg).required_samples
    assert run_samples(steps, req, trigger) == trigger * req == sample_budget(cfg).max_required_samples
    assert run_samples(5, req, 2) == 6 * req and run_samples(4, req, 2) == 4 * req
    assert main(["sim", "--recipe", "longtail_colocated_cpu", "--cores", "2",
                 f"async_training.trigger_parameter_sync_step={trigger}", f"trainer.total_training_steps={steps}"]) == 0
    assert f"{steps} steps in" in capsys.readouterr().out


def test_groups_far_past_the_engines_seats_are_warned_of_before_a_run_and_in_the_sim(capsys, caplog):
    """The default 150-step run with both limits at 1e9 admits all 4800 groups (38400 sequences, 150x the 256 seats):
    allowed (the extra requests only wait), but said, with the keys that set it, before the run (``Experiment.preflight``,
    which ``asyncrl train --dry-run`` runs) and in ``asyncrl sim``. The defaults (8x) and a small engine at verl's 16
    groups per replica say nothing."""
    import logging

    from asyncrl.cli import main
    from asyncrl.config import ExperimentConfig
    from asyncrl.staleness import IN_FLIGHT_PER_SEAT, in_flight_warning

    cfg = ExperimentConfig()
    assert in_flight_warning(cfg) is None  # 256 groups x 8 = 2048 sequences on 256 seats
    cfg.actor_rollout_ref.rollout.max_num_seqs = 2  # one seat per 4 sequences of a group x 16 groups: 64x, the limit
    cfg.actor_rollout_ref.rollout.concurrent_samples_per_replica = 16
    assert 16 * 8 == IN_FLIGHT_PER_SEAT * 2 and in_flight_warning(cfg) is None
    cfg.actor_rollout_ref.rollout.concurrent_samples_per_replica = 17
    assert "up to 136 sequences may be in flight" in in_flight_warning(cfg)
    both = ["actor_rollout_ref.rollout.concurrent_samples_per_replica=1000000000", "async_training.staleness_threshold=1e9"]
    with caplog.at_level(logging.WARNING, logger="asyncrl.experiment"):
        assert main(["train", "--dry-run", *both, "trainer.total_training_steps=150"]) == 0
    said = " ".join(r.getMessage() for r in caplog.records if r.name == "asyncrl.experiment")
    for part in ("up to 38400 sequences may be in flight (max_concurrent_samples=4800 groups x rollout.n=8), 150x the "
                 "engines' 256 seats", "concurrent_samples_per_replica = 1000000000", "max_required_samples = 4800",
                 "staleness_threshold=1e+09", "the run's 4800 groups in whole sync windows", "verl admits 16 groups per replica"):
        assert part in said, (part, said)
    capsys.readouterr()
    assert main(["sim", "actor_rollout_ref.rollout.max_num_seqs=2", "actor_rollout_ref.rollout.concurrent_samples_per_replica=17",
                 "trainer.total_training_steps=2"]) == 0
    assert "note: up to 136 sequences may be in flight" in capsys.readouterr().out
    # the sim says it of the run it simulated: 4 replicas' 8 seats (--rollout-gpus 4 on the embedded CPU preset)
    assert main(["sim", "actor_rollout_ref.rollout.max_num_seqs=2", "actor_rollout_ref.rollout.concurrent_samples_per_replica=17",
                 "trainer.total_training_steps=2", "--rollout-gpus", "4"]) == 0
    assert "in flight" not in capsys.readouterr().out
    from asyncrl.recipes import longtail_grpo_cpu

    colocated = longtail_grpo_cpu(colocated=True)  # generates a whole window at once by design: the keys above do not apply
    colocated.actor_rollout_ref.rollout.max_num_seqs = colocated.actor_rollout_ref.rollout.concurrent_samples_per_replica = 1
    assert in_flight_warning(colocated) is None
