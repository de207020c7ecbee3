"""Checkpoint pieces without Ray: atomic directories and last-K retention, resume lookup, the train
engine's state round trip (weights, optimizer, LR schedule, RNG), the resumable data order, the
per-sample ledger. The live resume runs are in tests/test_resume.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from asyncrl.accounting import audit, checkpoint_ledger, final_accounting
from asyncrl.checkpoint import CheckpointError, CheckpointManager, find_resume_checkpoint
from asyncrl.data.sampler import DataPosition, ResumableSampler, epoch_order


def _write(text):
    def write(tmp):
        (tmp / "payload.txt").write_text(text)
        return {"note": text}
    return write


def test_saves_are_atomic_and_only_the_last_k_are_kept(tmp_path):
    mgr = CheckpointManager(tmp_path / "checkpoints", max_to_keep=2)
    for step in (2, 4, 6):
        mgr.save(step, _write(f"s{step}"))
    assert mgr.steps() == [4, 6] and (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "6"
    assert (mgr.latest() / "payload.txt").read_text() == "s6"

    def crash(tmp):
        (tmp / "payload.txt").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        mgr.save(8, crash)
    assert mgr.steps() == [4, 6] and not list((tmp_path / "checkpoints").glob(".tmp*"))
    os.makedirs(tmp_path / "checkpoints" / "global_step_10")  # a dir without meta.json is not a checkpoint
    assert mgr.latest().name == "global_step_6"
    mgr.save(6, _write("again"))  # re-saving a step replaces it
    assert (mgr.latest() / "payload.txt").read_text() == "again"


def test_find_resume_checkpoint_modes(tmp_path):
    assert find_resume_checkpoint(tmp_path, "exp", 0, "auto") is None
    old = CheckpointManager(tmp_path / "exp__0__20260101-000000" / "checkpoints").save(3, _write("old"))
    new = CheckpointManager(tmp_path / "exp__0__20260102-000000" / "checkpoints").save(5, _write("new"))
    CheckpointManager(tmp_path / "exp__1__20260103-000000" / "checkpoints").save(9, _write("other seed"))
    os.utime(old / "meta.json", (1, 1))
    assert find_resume_checkpoint(tmp_path, "exp", 0, "auto") == new
    assert find_resume_checkpoint(tmp_path, "exp", 0, "disable") is None
    assert find_resume_checkpoint(tmp_path, "exp", 0, "resume_path", str(old)) == old
    with pytest.raises(CheckpointError, match="does not exist"):
        find_resume_checkpoint(tmp_path, "exp", 0, "resume_path", str(tmp_path / "nope"))


def test_auto_resume_takes_only_the_run_directories_of_exactly_this_name_and_seed(tmp_path):
    """``auto`` globbed ``{experiment_name}__{seed}__*``: experiment ``x`` seed 1 resumed the newer run of experiment
    ``x__1__y`` (its directory ``x__1__y__1__<time>`` matched). It now matches the form :func:`run_name` writes."""
    from asyncrl.run_names import run_name, run_name_pattern

    mine = CheckpointManager(tmp_path / run_name("x", 1, 1e9) / "checkpoints").save(3, _write("x"))
    for other in ("x__1__y__1__20300101-000000", "x__1__20300101-000000__1__20300101-000000",  # other experiments
                  "x__1__20300101-000000.bak", "x__1__latest", "x__10__20300101-000000"):  # not a run of x, seed 1
        CheckpointManager(tmp_path / other / "checkpoints").save(9, _write(other))
    (tmp_path / "x__1__20300101-000001").write_text("a file, not a run directory")
    assert find_resume_checkpoint(tmp_path, "x", 1, "auto") == mine
    assert find_resume_checkpoint(tmp_path, "x__1__y", 1, "auto").parent.parent.name == "x__1__y__1__20300101-000000"
    assert run_name_pattern("a.b+", 0).fullmatch(run_name("a.b+", 0)) and not run_name_pattern("a.b+", 0).fullmatch(
        run_name("aXbb", 0))  # the name is taken literally, not as a regex


def _claim(args):
    from asyncrl.run_names import claim_run_dir

    return str(claim_run_dir(*args))


def test_runs_of_one_name_and_seed_started_in_one_second_get_their_own_directories(tmp_path):
    """Two runs of ``smoke_mode_d`` seed 0 started in the same second (two pytest workers, two notebooks) were given
    one directory (``mkdir(exist_ok=True)``) and wrote their metrics, config and checkpoints into each other's. Each
    claim now creates its own: the next second's name when one is taken, atomically across processes, and the names
    keep the form ``trainer.resume_mode=auto`` looks for."""
    import multiprocessing

    from asyncrl.run_names import claim_run_dir, run_name, run_name_pattern

    when = 1.7e9
    first = claim_run_dir(tmp_path, "smoke_mode_d", 0, when)
    assert first.name == run_name("smoke_mode_d", 0, when) and first.is_dir()
    with multiprocessing.get_context("fork").Pool(4) as pool:  # four processes claim the same second at once
        claimed = pool.map(_claim, [(tmp_path, "smoke_mode_d", 0, when)] * 8)
    names = sorted(Path(p).name for p in claimed)
    assert len(set(names)) == 8 and first.name not in names
    assert names == [run_name("smoke_mode_d", 0, when + k) for k in range(1, 9)]  # the next free seconds, in order
    assert all(run_name_pattern("smoke_mode_d", 0).fullmatch(n) for n in names)
    assert claim_run_dir(tmp_path, "other", 0, when).name == run_name("other", 0, when)  # another name is not pushed
    with pytest.raises(FileExistsError, match="no free run directory"):
        claim_run_dir(tmp_path, "smoke_mode_d", 0, when, tries=9)


def test_auto_resume_passes_over_a_checkpoint_trained_on_other_data(tmp_path, caplog):
    """Runs are named after the recipe (``arith_grpo_cpu__0__...``), not the data: with ``trainer.resume_mode=auto``
    (the default) a run on ``b.jsonl`` resumed the weights a run on ``a.jsonl`` under the same recipe had saved (session
    31's review). ``auto`` now takes only a checkpoint whose data position names this run's data; one that saved none
    (older checkpoints) is still taken; ``resume_path`` is never checked."""
    import json

    def save(run, source, when):
        def write(d):
            (d / "rollouter_state.json").write_text(json.dumps({"position": {"epoch": 0, "offset": 3, "source": source}}))
        ckpt = CheckpointManager(tmp_path / run / "checkpoints").save(3, write)
        os.utime(ckpt / "meta.json", (when, when))
        return ckpt

    a = save("exp__0__20260101-000000", ["a.jsonl"], 1)
    b = save("exp__0__20260102-000000", ["b.jsonl"], 2)
    with caplog.at_level("WARNING", logger="asyncrl.checkpoint.manager"):
        assert find_resume_checkpoint(tmp_path, "exp", 0, "auto", source=["a.jsonl"]) == a
    assert f"not resuming {b}: it trained on ['b.jsonl'], this run on ['a.jsonl']" in caplog.text
    assert "trainer.resume_mode=resume_path" in caplog.text
    assert find_resume_checkpoint(tmp_path, "exp", 0, "auto", source=["b.jsonl"]) == b
    assert find_resume_checkpoint(tmp_path, "exp", 0, "auto", source=["c.jsonl"]) is None
    assert find_resume_checkpoint(tmp_path, "exp", 0, "resume_path", str(b), source=["c.jsonl"]) == b
    old = CheckpointManager(tmp_path / "exp__0__20260103-000000" / "checkpoints").save(1, _write("no source saved"))
    assert find_resume_checkpoint(tmp_path, "exp", 0, "auto", source=["c.jsonl"]) == old


def test_auto_resume_passes_over_a_checkpoint_of_another_model_or_task(tmp_path, caplog):
    """A fresh user's pass (session 33): ``--recipe longtail_grpo_cpu`` on the data an ``arith_grpo_cpu`` run had used
    got its run name and resumed its checkpoint (another model), appended to its metrics.csv, overwrote its config.yaml.
    ``auto`` now reads the model and task the checkpoint's run used (its ``config.yaml``, else the run directory's)
    and passes over one that differs, with a WARNING; what was not recorded is not checked."""
    from asyncrl.checkpoint.fingerprint import model_fingerprint
    from asyncrl.config import to_yaml
    from asyncrl.recipes import arith_grpo_cpu, longtail_grpo_cpu

    arith, longtail = arith_grpo_cpu(), longtail_grpo_cpu()
    assert arith.actor_rollout_ref.model.path != longtail.actor_rollout_ref.model.path

    def save(run, cfg, when, where="checkpoint"):
        def write(d):
            if where == "checkpoint":  # as write_checkpoint does
                (d / "config.yaml").write_text(to_yaml(cfg))
                return {"model_fingerprint": model_fingerprint(cfg.actor_rollout_ref.model.path)}
        ckpt = CheckpointManager(tmp_path / run / "checkpoints").save(3, write)
        if where == "run":  # a checkpoint without its own: the run directory's
            (tmp_path / run / "config.yaml").write_text(to_yaml(cfg))
        os.utime(ckpt / "meta.json", (when, when))
        return ckpt

    def find(cfg):
        return find_resume_checkpoint(tmp_path, "exp", 0, "auto", model=cfg.actor_rollout_ref.model.path,
                                      task=cfg.data.task)

    a = save("exp__0__20260101-000000", arith, 1)
    assert find(arith) == a
    with caplog.at_level("WARNING", logger="asyncrl.checkpoint.manager"):
        assert find(longtail) is None
    assert (f"not resuming {a}: its run trained another model (actor_rollout_ref.model.path="
            f"{arith.actor_rollout_ref.model.path}; this run's {longtail.actor_rollout_ref.model.path} has another "
            f"config.json or weights); its run used data.task=arith, this run longtail (to continue it anyway: "
            f"trainer.resume_mode=resume_path trainer.resume_from_path={a})") in caplog.text
    other_task = arith_grpo_cpu()
    other_task.data.task = "calc_tool"  # the same model, another task
    assert find(other_task) is None
    assert find_resume_checkpoint(tmp_path, "exp", 0, "auto") == a  # nothing to compare: not checked
    b = save("exp__0__20260102-000000", longtail, 2, where="run")
    assert (find(longtail), find(arith)) == (b, a)
    c = save("exp__0__20260103-000000", None, 3, where="nowhere")  # an older checkpoint, nothing recorded: taken
    assert (find(longtail), find(arith)) == (c, c)
    assert find_resume_checkpoint(tmp_path, "exp", 0, "resume_path", str(a), model="elsewhere", task="x") == a


def test_auto_resume_knows_a_moved_model_folder_by_its_fingerprint(tmp_path, caplog):
    """A model folder moved or renamed counted as another model (the recorded ``model.path`` differed), so ``auto``
    passed over the checkpoint and the run started from scratch. A checkpoint records the model's fingerprint
    (config.json, weight file names, sizes and sampled bytes): a moved folder is the same model, with a WARNING saying
    so; another model is passed over, also at the same path or with the same config.json and sizes; a checkpoint
    from before fingerprints falls back to the path, and its WARNING says why."""
    import shutil

    from asyncrl.checkpoint.fingerprint import model_fingerprint
    from asyncrl.config import MODEL_DIR, to_yaml
    from asyncrl.recipes import arith_grpo_cpu

    first = tmp_path / "models" / "mine"
    shutil.copytree(MODEL_DIR, first)
    twin = tmp_path / "models" / "twin"  # the same config.json and file sizes, other weights (another fine-tune)
    shutil.copytree(MODEL_DIR, twin)
    weights = bytearray((twin / "model.safetensors").read_bytes())
    weights[-10:] = bytes(10)
    (twin / "model.safetensors").write_bytes(bytes(weights))
    assert model_fingerprint(twin) != model_fingerprint(first) and model_fingerprint(tmp_path / "nowhere") is None

    def save(run, path, when, recorded=True):
        cfg = arith_grpo_cpu()
        cfg.actor_rollout_ref.model.path = str(path)

        def write(d):  # as write_checkpoint does
            (d / "config.yaml").write_text(to_yaml(cfg))
            return {"model_fingerprint": model_fingerprint(path)} if recorded else {}
        ckpt = CheckpointManager(tmp_path / "runs" / run / "checkpoints").save(3, write)
        os.utime(ckpt / "meta.json", (when, when))
        return ckpt

    def find(path):
        return find_resume_checkpoint(tmp_path / "runs", "exp", 0, "auto", model=str(path), task="arith")

    a = save("exp__0__20260101-000000", first, 1)
    assert find(first) == a
    moved = tmp_path / "elsewhere" / "renamed"
    moved.parent.mkdir()
    first.rename(moved)
    with caplog.at_level("WARNING", logger="asyncrl.checkpoint.manager"):
        assert find(moved) == a  # was None: a fresh run
    assert f"{a}: its model folder {first} is now {moved} (the same config.json and weights): the same model" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="asyncrl.checkpoint.manager"):
        assert find(twin) is None
        shutil.copytree(twin, first)  # another model where the first one was
        assert find(first) is None
    assert caplog.text.count(f"not resuming {a}: its run trained another model (actor_rollout_ref.model.path={first}; "
                             "this run's ") == 2
    assert f"this run's {twin} has another config.json or weights) (to continue it anyway: " in caplog.text
    assert find("Org/hub-name") is None  # no folder to fingerprint: the path decides
    shutil.rmtree(first)
    shutil.rmtree(a.parent.parent)  # (its fingerprint would find the folder moved back)
    b = save("exp__0__20260102-000000", moved, 2, recorded=False)  # written before fingerprints
    caplog.clear()
    with caplog.at_level("WARNING", logger="asyncrl.checkpoint.manager"):
        assert find(moved) == b
        moved.rename(first)
        assert find(first) is None
    assert (f"not resuming {b}: its run used actor_rollout_ref.model.path={moved}, this run {first} (the checkpoint "
            "records no fingerprint of its model, written before they were: a moved model folder looks like another "
            "model) (to continue it anyway: ") in caplog.text


def test_a_fingerprint_hashes_every_byte_of_a_model_under_the_limit_and_samples_above(tmp_path, monkeypatch, caplog):
    """A session-34 tester's finding: the fingerprint read 8 x 64 KiB of each weight file, so a change elsewhere (a
    partial fine-tune) was the same model, and ``auto`` could take another run's checkpoint. Weight files totalling
    at most FULL_HASH_LIMIT (1 GiB) are hashed whole now (``v2``); above it the sampling stays (documented). A
    checkpoint that recorded a ``v1`` fingerprint is compared by ``v1``, so it still resumes in a moved folder."""
    import shutil

    from asyncrl.checkpoint import fingerprint
    from asyncrl.checkpoint.fingerprint import CHUNK, SAMPLES, model_fingerprint
    from asyncrl.config import MODEL_DIR, to_yaml
    from asyncrl.recipes import arith_grpo_cpu

    first, twin = tmp_path / "m1", tmp_path / "twin"
    shutil.copytree(MODEL_DIR, first)
    shutil.copytree(MODEL_DIR, twin)
    size = (twin / "model.safetensors").stat().st_size
    starts = [max(0, size - CHUNK) * i // (SAMPLES - 1) for i in range(SAMPLES)]
    offset = (CHUNK + starts[1]) // 2  # between the first two sampled windows
    assert not any(a <= offset < a + CHUNK for a in starts)
    with open(twin / "model.safetensors", "r+b") as f:  # one byte changed in place (its ctime changes)
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 1]))
    assert model_fingerprint(twin).startswith("v2:") and model_fingerprint(twin) != model_fingerprint(first)
    assert model_fingerprint(twin, "v1") == model_fingerprint(first, "v1")  # what v1 missed
    assert model_fingerprint(first, "v9") is None
    monkeypatch.setattr(fingerprint, "FULL_HASH_LIMIT", size - 1)  # above the limit: sampled, the change unseen
    assert model_fingerprint(twin) == model_fingerprint(first)
    monkeypatch.undo()

    cfg = arith_grpo_cpu()
    cfg.actor_rollout_ref.model.path = str(first)

    def write(d):  # a checkpoint of the first fingerprints: a v1 one
        (d / "config.yaml").write_text(to_yaml(cfg))
        return {"model_fingerprint": model_fingerprint(first, "v1")}
    ckpt = CheckpointManager(tmp_path / "runs" / "exp__0__20260101-000000" / "checkpoints").save(3, write)
    moved = tmp_path / "moved"
    first.rename(moved)
    with caplog.at_level("WARNING", logger="asyncrl.checkpoint.manager"):
        assert find_resume_checkpoint(tmp_path / "runs", "exp", 0, "auto", model=str(moved), task="arith") == ckpt
    assert f"its model folder {first} is now {moved} (the same config.json and weights)" in caplog.text


def _engine(path, **kw):
    from asyncrl.trainer.engine import TrainEngine

    return TrainEngine(str(path), lr=1e-3, warmup=2, total_updates=10, **kw)


def _step(engine, seed):
    from asyncrl.trainer.engine import Batch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 40, (2, 12), generator=g)
    ri = torch.arange(6, 12).expand(2, 6)
    b = Batch(ids, torch.ones_like(ids), ri, torch.ones(2, 6), torch.zeros(2, 6), torch.zeros(2), [0, 1],
              torch.zeros(2, 6, dtype=torch.long))
    return engine.update(b, lambda lp, mb, scale, entropy: (-(lp * mb.response_mask).sum() / mb.response_mask.sum(), {}))


def test_engine_state_round_trip_continues_exactly(tmp_path, model_dir):
    """Saved after 3 updates and reloaded, the engine's 4th and 5th updates equal the original's:
    weights, Adam moments, the LR schedule and the RNG all continue."""
    from transformers import AutoModelForCausalLM

    a = _engine(model_dir)
    for s in range(3):
        _step(a, s)
    a.save_checkpoint(str(tmp_path / "actor"), source_model_dir=str(model_dir))
    hf = tmp_path / "actor" / "huggingface"
    assert (hf / "model.safetensors").exists() and (hf / "config.json").exists()
    AutoModelForCausalLM.from_pretrained(hf)  # transformers loads it (vLLM reads the same files)
    if (model_dir / "tokenizer.json").exists():
        assert (hf / "tokenizer.json").exists()
    want = [_step(a, s) for s in (3, 4)]
    rng_after = torch.rand(3)

    b = _engine(model_dir)  # built from the base model (as a resumed trainer is: it stays the KL reference)
    b.load_checkpoint(str(tmp_path / "actor"), load_weights=True)
    got = [_step(b, s) for s in (3, 4)]
    assert [g["actor/lr"] for g in got] == [w["actor/lr"] for w in want]
    assert [g["actor/grad_norm"] for g in got] == [w["actor/grad_norm"] for w in want]
    for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(p, q), n
    assert b.updates == a.updates == 5
    assert torch.equal(torch.rand(3), rng_after)


def test_data_order_is_a_function_of_seed_and_epoch_and_resumes():
    assert epoch_order(10, 0, 1) == epoch_order(10, 0, 1) != epoch_order(10, 0, 2)
    assert epoch_order(5, 0, 0, shuffle=False) == [0, 1, 2, 3, 4]
    full = ResumableSampler(7, seed=3)
    stream = [full.advance() for _ in range(20)]  # crosses two epoch boundaries
    assert sorted(stream[:7]) == list(range(7)) and stream[7:14] == epoch_order(7, 3, 1)
    part = ResumableSampler(7, seed=3)
    for _ in range(9):
        part.advance()
    resumed = ResumableSampler(7, seed=3, position=DataPosition.from_state(part.position.state_dict()))
    assert part.position == DataPosition(1, 2)
    assert [resumed.advance() for _ in range(11)] == stream[9:]
    with pytest.raises(ValueError, match="empty"):
        ResumableSampler(0, seed=0)


def test_ledger_audit_finds_lost_and_twice_trained():
    ok = audit(4, [{"trained": [0, 2], "enqueued": [0, 2]}, {"dropped/prompt_too_long": [1], "failed/x": [3]}])
    assert ok.ok and ok.totals() == {"trained": 2, "dropped": 1, "failed": 1}
    bad = audit(4, [{"trained": [0, 2, 2]}, {"dropped/x": [1], "failed/y": [7]}])
    assert bad.lost == [3] and bad.duplicated == {2: ["trained", "trained"]} and bad.unknown == [7]
    ck = checkpoint_ledger(5, [{"enqueued": [0, 1, 2], "dropped/x": [4]}, {"fetched": [0, 1], "trained": [0, 1]}])
    assert ck["in_flight"] == [2, 3] and ck["outcomes"] == {"dropped/x": [4], "trained": [0, 1]}
    fin = checkpoint_ledger(5, [{"enqueued": [0, 1, 2], "dropped/x": [4]}, {"fetched": [0, 1], "trained": [0, 1]}],
                            final=True)  # at stop, what the queue held is dropped, not in flight
    assert fin["in_flight"] == [3] and fin["outcomes"]["dropped/unconsumed_at_shutdown"] == [2]
    acc = final_accounting(3, [{"enqueued": [0, 1, 2]}, {"fetched": [0], "trained": [0]}])
    assert acc["dropped"] == {"unconsumed_at_shutdown": 2} and acc["balanced"] and acc["lost"] == 0


def test_a_checkpoint_written_before_a_metric_rename_reads_under_the_new_name():
    """``eval/tool_call_success`` (a per-sample share, session 10) is ``eval/tool_call_success_rate`` now:
    a resumed run's evaluation history, restored from the checkpoint, carries the new name."""
    from types import SimpleNamespace

    from asyncrl.checkpoint.trainer_state import restore_rollouter

    old_row = {"version": 0, "accuracy": 0.5, "eval/tool_call_success": 0.75, "eval/tool_calls": 1.0}
    ro = SimpleNamespace(counts={}, sampler=ResumableSampler(8, seed=0), dropped={}, failed={})
    state = {"taken": 4, "enqueued": 4, "position": DataPosition().state_dict(), "dropped": {}, "failed": {},
             "eval_history": [old_row], "param_version": 1, "ledger": {"outcomes": {}, "in_flight": []}}
    restore_rollouter(ro, state)
    assert ro.eval_history == [{"version": 0, "accuracy": 0.5, "eval/tool_call_success_rate": 0.75,
                                "eval/tool_calls": 1.0}]
