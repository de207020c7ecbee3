"""Resumable data order: the order of epoch ``e`` is a function of ``(seed, e)`` and the row count only.

The rollouter takes prompts one at a time; :class:`DataPosition` says which row comes next and
survives a checkpoint as two integers (``epoch``, ``offset``), so a resumed run continues the
same sequence instead of reshuffling from the start (verl's stateful dataloader, in miniature).
The checkpoint also keeps what the order was of (:meth:`ResumableSampler.state_dict`: the row count, the
data's source, seed and shuffle), so a resume on other data says that its offset no longer means the same rows.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, fields
from typing import Optional

import numpy as np

logger = logging.getLogger(__name__)


def epoch_order(num_rows: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """Row indices of ``epoch``: a permutation seeded by ``(seed, epoch)`` (identity without shuffle)."""
    if not shuffle:
        return list(range(num_rows))
    return np.random.default_rng([seed, epoch]).permutation(num_rows).tolist()


@dataclass
class DataPosition:
    """Where the next prompt comes from.

    Attributes:
        epoch: passes over the dataset started so far, minus one (0 during the first pass).
        offset: rows of this epoch already taken.
    """

    epoch: int = 0
    offset: int = 0

    def state_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, state: Optional[dict]) -> "DataPosition":
        """The position of a :meth:`state_dict` or a :meth:`ResumableSampler.state_dict` (its other keys ignored)."""
        return cls(**{f.name: state[f.name] for f in fields(cls) if f.name in state}) if state else cls()


class ResumableSampler:
    """Yields ``(epoch, row index)`` forever from a :class:`DataPosition`.

    Args:
        num_rows: dataset size (> 0).
        seed: ``trainer.seed``.
        shuffle: ``data.shuffle``.
        position: where to start (a restored checkpoint position, or the beginning).
        source: what the rows are, saved with the position to tell a resume on other data
            (:func:`asyncrl.data.dataset.train_source`: the ``data.train_files`` paths or the task); ``None``: unknown.

    Raises:
        ValueError: an empty dataset.
    """

    def __init__(self, num_rows: int, seed: int, shuffle: bool = True, position: Optional[DataPosition] = None,
                 source: Optional[list[str]] = None):
        if num_rows < 1:
            raise ValueError("the training dataset is empty")
        self.num_rows, self.seed, self.shuffle, self.source = num_rows, seed, shuffle, source
        self.position = position or DataPosition()
        self._order: Optional[list[int]] = None

    def state_dict(self) -> dict:
        """The position (``epoch``, ``offset``) and what it is a position in: ``rows`` (the row count), ``source``,
        ``seed`` and ``shuffle``, which decide the order (JSON-able)."""
        return {**self.position.state_dict(), "rows": self.num_rows, "source": self.source, "seed": self.seed,
                "shuffle": self.shuffle}

    def restore(self, state: Optional[dict], warn: bool = True) -> None:
        """Continue from a checkpoint's :meth:`state_dict` (or a bare :class:`DataPosition` one, from before the row
        count was saved: taken as it is). Users legitimately add data before resuming, so other data is never
        refused, but it is logged as a WARNING: with another row count every epoch's order is another permutation,
        so the offset no longer means the same rows and the checkpoint's epoch restarts from its start (each row
        once more in it); with the same row count but another source, seed or shuffle the position is kept and the
        rows it points at may differ. ``warn=False``: the same position, nothing logged (the driver warned already,
        :func:`asyncrl.checkpoint.trainer_state.resume_data_order`)."""
        position = DataPosition.from_state(state)
        self._order = None
        saved_rows = (state or {}).get("rows")
        log = logger.warning if warn else logger.debug
        if saved_rows is not None and saved_rows != self.num_rows:
            log(
                "resume: the training data has %d rows where the checkpoint's had %d (data.train_files changed?): its "
                "position (epoch %d, offset %d) no longer means the same rows, so the data order restarts from the "
                "start of epoch %d%s", self.num_rows, saved_rows, position.epoch, position.offset, position.epoch,
                self._changes(state))
            self.position = DataPosition(position.epoch, 0)
            return
        changed = self._changes(state or {})
        if changed:
            log("resume: the training data's order is not the checkpoint's%s: its position (epoch %d, "
                           "offset %d) is kept, but the rows it points at may differ", changed, position.epoch,
                           position.offset)
        self.position = position

    def _changes(self, state: dict) -> str:
        """``"; source was ... now ..."`` for each of source, seed, shuffle the checkpoint saved and that differs."""
        now = {"source": self.source, "seed": self.seed, "shuffle": self.shuffle}
        return "".join(f"; {k} was {state[k]!r}, now {v!r}" for k, v in now.items()
                       if state.get(k) is not None and v is not None and state[k] != v)

    def peek(self) -> int:
        """The row index :meth:`advance` will take next."""
        if self.position.offset >= self.num_rows:
            self.position = DataPosition(self.position.epoch + 1, 0)
            self._order = None
        if self._order is None:
            self._order = epoch_order(self.num_rows, self.seed, self.position.epoch, self.shuffle)
        return self._order[self.position.offset]

    def advance(self) -> int:
        """Take the next row: returns its index and moves the position past it."""
        index = self.peek()
        self.position = DataPosition(self.position.epoch, self.position.offset + 1)
        return index
