"""CPU placement of the glue actors (``async_training.rollouter_cpu_affinity``, session 32)."""

import os
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
    assert load_config().async_training.rollouter_cpu_affinity == ""  # the default pins nothing


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
