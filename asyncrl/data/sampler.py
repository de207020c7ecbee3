"""Resumable data order: the order of epoch ``e`` is a function of ``(seed, e)`` only.

The rollouter takes prompts one at a time; :class:`DataPosition` says which row comes next and
survives a checkpoint as two integers (``epoch``, ``offset``), so a resumed run continues the
same sequence instead of reshuffling from the start (verl's stateful dataloader, in miniature).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np


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
        return cls(**state) if state else cls()


class ResumableSampler:
    """Yields ``(epoch, row index)`` forever from a :class:`DataPosition`.

    Args:
        num_rows: dataset size (> 0).
        seed: ``trainer.seed``.
        shuffle: ``data.shuffle``.
        position: where to start (a restored checkpoint position, or the beginning).

    Raises:
        ValueError: an empty dataset.
    """

    def __init__(self, num_rows: int, seed: int, shuffle: bool = True, position: Optional[DataPosition] = None):
        if num_rows < 1:
            raise ValueError("the training dataset is empty")
        self.num_rows, self.seed, self.shuffle = num_rows, seed, shuffle
        self.position = position or DataPosition()
        self._order: Optional[list[int]] = None

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
