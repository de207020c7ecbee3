"""Datasets in the verl schema and built-in synthetic tasks (``arith``)."""

from asyncrl.data.arith import make_arith_rows, write_splits
from asyncrl.data.dataset import TASKS, DatasetError, get_task_rows, load_rows, register_task, validate_row

__all__ = [
    "TASKS",
    "DatasetError",
    "get_task_rows",
    "load_rows",
    "make_arith_rows",
    "register_task",
    "validate_row",
    "write_splits",
]
