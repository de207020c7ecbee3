"""Where the CPU goes during a benchmark: every process of this run, its cores, threads and CPU seconds.

::

    CpuCensus(root=os.getpid())   a sampler thread in the driver, every ``interval`` s:
        /proc/<pid>/task/<tid>/stat   of every descendant of ``root`` (Ray's gcs / raylet / workers,
                                      vLLM's EngineCore, ...) -> CPU seconds per thread, last core run on
        /proc/<pid>/status            -> Cpus_allowed_list (the affinity ``taskset -p`` shows)
    census.mark(name) ... census.report(name)   CPU seconds per process (and thread) between two marks

Linux only (reads ``/proc``). The labels are the processes' titles (``ray::FullyAsyncTrainer``,
``VLLM::EngineCore``, ``raylet`` ...), so a table reads as the run's parts. Used by
``async_vs_colocate.py --census`` to check the placement holds (replica + engine on the rollout core,
trainer on its own) and to measure what the run's glue (Ray, queue, rollouter) costs in CPU.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Optional

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def _stat(path: str) -> Optional[tuple[str, int, float, int]]:
    """``(comm, ppid, cpu seconds, last core)`` from a ``stat`` file."""
    s = _read(path)
    if not s:
        return None
    comm = s[s.index("(") + 1:s.rindex(")")]
    rest = s[s.rindex(")") + 2:].split()
    return comm, int(rest[1]), (int(rest[11]) + int(rest[12])) / TICK, int(rest[36])


def label(pid: int) -> str:
    """A process's title: Ray sets ``ray::ClassName`` (+ method), vLLM ``VLLM::EngineCore``; else the
    binary or the Python script it runs."""
    words = (_read(f"/proc/{pid}/cmdline") or "").replace("\0", " ").split()
    if words and words[0].startswith(("ray::", "VLLM::")):
        return words[0].split(".")[0]
    st = _stat(f"/proc/{pid}/stat")
    if st and st[0].startswith(("ray::", "VLLM::")):  # title in the thread name only (truncated to 15)
        return st[0]
    if not words:
        return st[0] if st else str(pid)
    if os.path.basename(words[0]).startswith("python"):
        if "default_worker.py" in " ".join(words[1:3]) or any(w.endswith("default_worker.py") for w in words):
            return "ray::IDLE"  # a Ray worker before it took a title
        script = next((w for w in words[1:] if w.endswith(".py")), None)
        return os.path.basename(script) if script else " ".join(words[:2])
    return os.path.basename(words[0])


def affinity(pid: int, tid: Optional[int] = None) -> str:
    """``Cpus_allowed_list`` of a process (its main thread) or of one of its threads."""
    path = f"/proc/{pid}/status" if tid is None else f"/proc/{pid}/task/{tid}/status"
    for line in (_read(path) or "").splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return "?"


class CpuCensus:
    """Samples the CPU time of ``root`` and all its descendants, per thread."""

    def __init__(self, root: Optional[int] = None, interval: float = 0.5):
        self.root = root or os.getpid()
        self.interval = interval
        self.cpu: dict[tuple[int, int], float] = {}  # (pid, tid) -> cumulative CPU s (last seen)
        self.thread_name: dict[tuple[int, int], str] = {}
        self.thread_affinity: dict[tuple[int, int], str] = {}
        self.cores: dict[tuple[int, int], collections.Counter] = collections.defaultdict(collections.Counter)
        self.labels: dict[int, str] = {}
        self.affinities: dict[int, str] = {}
        self.marks: dict[str, tuple[float, dict]] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def descendants(self) -> list[int]:
        children = collections.defaultdict(list)
        for d in os.listdir("/proc"):
            if d.isdigit():
                st = _stat(f"/proc/{d}/stat")
                if st:
                    children[st[1]].append(int(d))
        out, todo = [], [self.root]
        while todo:
            p = todo.pop()
            out.append(p)
            todo.extend(children.get(p, []))
        return out

    def sample(self) -> None:
        for pid in self.descendants():
            name = label(pid)  # a Ray worker takes its actor's title when the actor starts
            if pid not in self.labels or name != "ray::IDLE":
                self.labels[pid] = name
            self.affinities[pid] = affinity(pid)
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for t in tids:
                st = _stat(f"/proc/{pid}/task/{t}/stat")
                if st is None:
                    continue
                key = (pid, int(t))
                if st[2] > self.cpu.get(key, 0.0):
                    self.cores[key][st[3]] += 1  # ran since the last sample: count its core
                    self.thread_affinity[key] = affinity(pid, int(t))
                self.cpu[key] = st[2]
                self.thread_name[key] = st[0]

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def start(self) -> "CpuCensus":
        self._thread = threading.Thread(target=self._loop, name="cpu-census", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def mark(self, name: str) -> None:
        """Remember the CPU seconds so far under ``name`` (a phase starts)."""
        self.sample()
        self.marks[name] = (time.time(), dict(self.cpu))

    def report(self, since: str) -> dict:
        """CPU seconds per process since the mark ``since``: ``{"wall_s", "processes": [...]}``, each
        process ``{pid, label, affinity, threads, cpu_s, share, cores, top_threads}`` (``share`` = CPU
        seconds / wall seconds; 1.0 = one core busy all the time)."""
        self.sample()
        t0, before = self.marks[since]
        wall = max(1e-9, time.time() - t0)
        per: dict[int, dict] = {}
        for (pid, tid), c in self.cpu.items():
            d = c - before.get((pid, tid), 0.0)
            p = per.setdefault(pid, {"pid": pid, "label": self.labels.get(pid, str(pid)),
                                     "affinity": self.affinities.get(pid, "?"), "threads": 0, "cpu_s": 0.0,
                                     "cores": collections.Counter(), "by_thread": collections.Counter(),
                                     "by_affinity": collections.Counter()})
            p["threads"] += 1
            if d > 0:
                p["cpu_s"] += d
                p["by_thread"][self.thread_name[(pid, tid)]] += d
                p["by_affinity"][self.thread_affinity.get((pid, tid), "?")] += d
                p["cores"].update(self.cores[(pid, tid)])
        rows = []
        for p in sorted(per.values(), key=lambda p: -p["cpu_s"]):
            if p["cpu_s"] < 0.05:
                continue
            n = sum(p["cores"].values()) or 1
            rows.append({"pid": p["pid"], "label": p["label"], "affinity": p["affinity"], "threads": p["threads"],
                         "cpu_s": round(p["cpu_s"], 2), "share": round(p["cpu_s"] / wall, 3),
                         "cores": {str(k): round(v / n, 2) for k, v in sorted(p["cores"].items())},
                         "cpu_s_by_thread_affinity": {k: round(v, 2) for k, v in p["by_affinity"].most_common()},
                         "top_threads": {k: round(v, 2) for k, v in p["by_thread"].most_common(4)}})
        return {"wall_s": round(wall, 2), "total_cpu_s": round(sum(r["cpu_s"] for r in rows), 2), "processes": rows}


def format_report(rep: dict) -> str:
    lines = [f"  wall {rep['wall_s']:.1f} s, CPU {rep['total_cpu_s']:.1f} s "
             f"({rep['total_cpu_s'] / max(1e-9, rep['wall_s']):.2f} cores busy)",
             f"  {'process':28s} {'pid':>7s} {'cores':>6s} {'thr':>4s} {'cpu s':>7s} {'share':>6s}  ran on   top threads"]
    for r in rep["processes"]:
        ran = ",".join(f"{k}:{v:.0%}" for k, v in r["cores"].items())
        top = ", ".join(f"{k} {v:.1f}" for k, v in r["top_threads"].items())
        aff = " ".join(f"[{k}]:{v:.1f}" for k, v in r["cpu_s_by_thread_affinity"].items())
        lines.append(f"  {r['label'][:28]:28s} {r['pid']:7d} {r['affinity']:>6s} {r['threads']:4d} {r['cpu_s']:7.1f}"
                     f" {r['share']:6.2f}  {ran:12s} {aff:24s} {top}")
    return "\n".join(lines)


def cores_of(spec: str) -> set[int]:
    """``"0-1,4"`` -> ``{0, 1, 4}`` (a ``Cpus_allowed_list``); ``"?"`` or ``""`` -> ``set()``."""
    out: set[int] = set()
    for part in (spec or "").split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit():
            out.update(range(int(lo), int(hi if hi.isdigit() else lo) + 1))
    return out


def others_on_cores(rep: dict, cores: set[int], owner: str) -> dict:
    """What the processes other than ``owner`` (a label: ``ray::FullyAsyncTrainer``) spent on ``cores`` in a
    :meth:`CpuCensus.report`: a thread allowed only there counts whole, a thread allowed on more cores by the share
    of its cores that are ``cores`` (it may run anywhere it is allowed). Returns ``{"cpu_s", "share"}`` (``share``: of
    those cores' time over the report's wall time; 0.44 = 44% of one core's time for a one-core ``cores``) and
    ``"by_process"`` (label -> CPU s there), largest first. No ``cores``: zeros."""
    if not cores:
        return {"cpu_s": 0.0, "share": 0.0, "by_process": {}}
    by: collections.Counter = collections.Counter()
    for r in rep["processes"]:
        if r["label"] == owner:
            continue
        for spec, cpu_s in r["cpu_s_by_thread_affinity"].items():
            allowed = cores_of(spec)
            if allowed:
                by[r["label"]] += cpu_s * len(allowed & cores) / len(allowed)
    total = sum(by.values())
    return {"cpu_s": round(total, 2), "share": round(total / (max(1e-9, rep["wall_s"]) * len(cores)), 3),
            "by_process": {k: round(v, 2) for k, v in by.most_common() if v >= 0.05}}
