"""Per-sample ledger: every prompt taken from the dataloader ends exactly once (DESIGN.md invariant 1).

Each prompt taken gets a sequence number ``seq`` (0, 1, 2, ... in the order the rollouter takes
them; it continues across a resume). Components record terminal outcomes by ``seq``::

    rollouter   dropped/<reason>  failed/<reason>        (+ "enqueued": handed to the MessageQueue)
    trainer     trained  dropped/stale_at_trainer  failed/<trainer error>   (+ "fetched")
    derived     dropped/unconsumed_at_shutdown = enqueued - fetched   (still in the queue at the end)

:func:`audit` merges the parts: ``taken == len(set(every seq))`` and no seq twice means nothing was
lost and nothing trained (or dropped) twice. Seqs are stored as ``array('q')`` (8 bytes each), so a
million samples cost 8 MB.
"""

from __future__ import annotations

import collections
from array import array
from dataclasses import dataclass, field
from typing import Iterable, Mapping

TERMINAL = ("trained", "dropped", "failed")
"""Outcome kinds; an outcome name is ``kind`` or ``kind/reason``."""


class Ledger:
    """Sequence numbers by outcome name (``"trained"``, ``"dropped/prompt_too_long"``, ...)."""

    def __init__(self, data: Mapping[str, Iterable[int]] | None = None):
        self.outcomes: dict[str, array] = {}
        for name, seqs in (data or {}).items():
            self.outcomes[name] = array("q", seqs)

    def record(self, outcome: str, seq: int) -> None:
        """Add one sample's outcome (``seq`` is its dataloader sequence number)."""
        self.outcomes.setdefault(outcome, array("q")).append(int(seq))

    def extend(self, outcome: str, seqs: Iterable[int]) -> None:
        self.outcomes.setdefault(outcome, array("q")).extend(int(s) for s in seqs)

    def seqs(self, outcome: str) -> array:
        return self.outcomes.get(outcome, array("q"))

    def counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.outcomes.items()}

    def to_dict(self) -> dict[str, list[int]]:
        """Plain lists (picklable, JSON-able; what crosses Ray and goes into a checkpoint)."""
        return {k: v.tolist() for k, v in self.outcomes.items()}


@dataclass
class Audit:
    """Result of :func:`audit`.

    Attributes:
        taken: prompts taken from the dataloader (seqs ``0 .. taken-1``).
        counts: samples per terminal outcome name.
        lost: seqs taken that have no terminal outcome.
        duplicated: seqs with more than one terminal outcome (e.g. trained twice), with their outcomes.
        unknown: outcomes for seqs never taken (a bookkeeping bug).
    """

    taken: int
    counts: dict[str, int]
    lost: list[int] = field(default_factory=list)
    duplicated: dict[int, list[str]] = field(default_factory=dict)
    unknown: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.unknown)

    def totals(self) -> dict[str, int]:
        """Samples per outcome kind (``trained`` / ``dropped`` / ``failed``)."""
        out = collections.Counter({k: 0 for k in TERMINAL})
        for name, n in self.counts.items():
            out[name.split("/", 1)[0]] += n
        return dict(out)

    def __str__(self) -> str:
        t = self.totals()
        return (f"{self.taken} taken = {t['trained']} trained + {t['dropped']} dropped + {t['failed']} failed; "
                f"lost {len(self.lost)}, accounted twice {len(self.duplicated)}, unknown {len(self.unknown)}")


def audit(taken: int, parts: Iterable[Mapping[str, Iterable[int]]]) -> Audit:
    """Merge ledger parts (``{outcome: seqs}``) and check that each of ``0 .. taken-1`` ends exactly once.

    Non-terminal entries (names not starting with a :data:`TERMINAL` kind) are ignored.
    """
    where: dict[int, list[str]] = collections.defaultdict(list)
    counts: collections.Counter = collections.Counter()
    for part in parts:
        for name, seqs in part.items():
            if name.split("/", 1)[0] not in TERMINAL:
                continue
            for s in seqs:
                where[int(s)].append(name)
                counts[name] += 1
    result = Audit(taken=taken, counts=dict(counts))
    result.lost = [s for s in range(taken) if s not in where]
    result.duplicated = {s: names for s, names in where.items() if len(names) > 1}
    result.unknown = sorted(s for s in where if not 0 <= s < taken)
    return result


def queue_residual(enqueued: Iterable[int], fetched: Iterable[int]) -> list[int]:
    """Seqs handed to the MessageQueue that the trainer never fetched (still queued, or dropped there)."""
    got = set(fetched)
    return [s for s in enqueued if s not in got]


def _merge(parts: Iterable[Mapping[str, Iterable[int]]]) -> tuple[dict[str, list[int]], list[int], set[int]]:
    """``(terminal outcomes, enqueued seqs, fetched seqs)`` of several ledger parts."""
    terminal: dict[str, list[int]] = collections.defaultdict(list)
    enqueued: list[int] = []
    fetched: set[int] = set()
    for part in parts:
        for name, seqs in part.items():
            if name == "enqueued":
                enqueued.extend(seqs)
            elif name == "fetched":
                fetched.update(seqs)
            elif name.split("/", 1)[0] in TERMINAL:
                terminal[name].extend(seqs)
    return dict(terminal), enqueued, fetched


def checkpoint_ledger(taken: int, parts: Iterable[Mapping[str, Iterable[int]]], final: bool = False) -> dict:
    """What ``ledger.json`` holds: terminal outcomes so far and the seqs still in flight (pending,
    generating, or in the MessageQueue), which a resumed run counts as dropped. ``final``: the run
    has stopped, so what is left in the (shut down) queue is ``dropped/unconsumed_at_shutdown``."""
    terminal, enqueued, fetched = _merge(parts)
    if final:
        left = queue_residual(enqueued, fetched)
        if left:
            terminal.setdefault("dropped/unconsumed_at_shutdown", []).extend(left)
    done = {s for seqs in terminal.values() for s in seqs}
    return {"taken": taken, "outcomes": terminal, "in_flight": [s for s in range(taken) if s not in done]}


def final_accounting(taken: int, parts: Iterable[Mapping[str, Iterable[int]]]) -> dict:
    """Invariant 1 at the end of a run, from the ledger: ``taken == trained + dropped + failed``.

    Samples handed to the MessageQueue that the trainer never fetched are ``dropped`` with
    ``unconsumed_at_shutdown``. Returns the Summary's ``accounting`` dict: ``taken``, ``trained``,
    ``dropped`` / ``failed`` by reason, their totals, ``balanced`` and ``audit`` (lost / duplicated).
    """
    terminal, enqueued, fetched = _merge(parts)
    left = queue_residual(enqueued, fetched)
    if left:
        terminal.setdefault("dropped/unconsumed_at_shutdown", []).extend(left)
    a = audit(taken, [terminal])
    dropped = {k.split("/", 1)[1]: n for k, n in a.counts.items() if k.startswith("dropped/")}
    failed = {k.split("/", 1)[1]: n for k, n in a.counts.items() if k.startswith("failed/")}
    out = {"taken": taken, "trained": a.counts.get("trained", 0), "dropped": dropped, "failed": failed,
           "dropped_total": sum(dropped.values()), "failed_total": sum(failed.values()),
           "lost": len(a.lost), "accounted_twice": len(a.duplicated)}
    out["balanced"] = a.ok and out["taken"] == out["trained"] + out["dropped_total"] + out["failed_total"]
    out["audit"] = str(a)
    return out
