"""asyncrl.trainer.fsdp_dist's single-process defaults: torchrun's variables unset or empty are filled in."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from asyncrl.trainer import fsdp_dist

_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.parametrize("blank", [None, "", "  "])
def test_unset_or_empty_variables_get_the_single_process_defaults(monkeypatch, blank):
    for key in _KEYS:
        monkeypatch.delenv(key, raising=False) if blank is None else monkeypatch.setenv(key, blank)
    fsdp_dist._default_env()
    assert {k: os.environ[k] for k in _KEYS} == dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                                                      MASTER_ADDR="127.0.0.1", MASTER_PORT="0")


def test_set_variables_are_kept_and_more_ranks_get_a_fixed_port(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.7")
    monkeypatch.setenv("MASTER_PORT", "")
    fsdp_dist._default_env()
    got = tuple(os.environ[k] for k in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
    assert got == ("2", "10.0.0.7", "29511")
    monkeypatch.setenv("MASTER_PORT", "23456")
    fsdp_dist._default_env()
    assert os.environ["MASTER_PORT"] == "23456"


def test_an_empty_master_port_initialises_one_gloo_rank():
    """End to end, in a fresh process: ``MASTER_PORT=`` and ``MASTER_ADDR=`` exported empty, as a shell does."""
    env = {k: v for k, v in os.environ.items() if k not in _KEYS}
    env.update(MASTER_PORT="", MASTER_ADDR="", WORLD_SIZE="1")
    code = ("from asyncrl.trainer.fsdp_dist import init_distributed; import torch.distributed as dist; "
            "print(init_distributed('gloo')[:2]); dist.destroy_process_group()")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("(0, 1)")
