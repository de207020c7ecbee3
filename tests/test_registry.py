"""One registry helper for the seven registries: same registration, same error for an unknown name."""

from __future__ import annotations

import subprocess
import sys

import pytest

from asyncrl.registry import Lazy, Registry, UnknownNameError


def test_register_direct_decorator_and_lazy():
    reg: Registry = Registry("widget")
    reg.register("a", 1)

    @reg.register("b")
    class B:
        pass

    reg.register_lazy("c", "json:dumps")
    reg.register_lazy("d", lambda: "loaded")
    assert reg["a"] == 1 and reg["b"] is B and reg["d"] == "loaded"
    import json
    assert reg["c"] is json.dumps
    assert reg.names() == ["a", "b", "c", "d"] == list(reg)
    assert "c" in reg and "z" not in reg and len(reg) == 4
    assert reg.get("z", 7) == 7  # Mapping.get: the error is a KeyError
    del reg["a"]
    assert reg.names() == ["b", "c", "d"]


def test_unknown_name_lists_valid_names_and_closest():
    reg: Registry = Registry("tool parser")
    reg.register("hermes", object)
    reg.register("qwen3_coder", object)
    with pytest.raises(UnknownNameError) as info:
        reg["hermez"]
    err = info.value
    assert str(err) == "unknown tool parser 'hermez'; valid names: hermes, qwen3_coder; did you mean 'hermes'?"
    assert isinstance(err, KeyError) and isinstance(err, ValueError)
    assert (err.kind, err.name, err.valid) == ("tool parser", "hermez", ["hermes", "qwen3_coder"])
    with pytest.raises(UnknownNameError, match=r"^unknown tool parser 'zzz'; valid names: hermes, qwen3_coder$"):
        reg.check("zzz")


def test_lazy_missing_package_names_install():
    reg: Registry = Registry("rollout backend")
    reg.register_lazy("ghost", "ghost_mod:Engine", requires="ghost_pkg_xyz", install="ghost-pkg[cpu]")
    with pytest.raises(ImportError, match=r"rollout backend 'ghost' needs the package 'ghost_pkg_xyz': pip install ghost-pkg\[cpu\]"):
        reg["ghost"]
    assert isinstance(reg._entries["ghost"], Lazy)  # still lazy: a later install makes it resolvable


def test_discover_imports_self_registering_module(tmp_path, monkeypatch):
    pkg = tmp_path / "regdisc_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "extra.py").write_text("from tests_registry_shared import REG\nREG.register('extra', 42)\n")
    shared = tmp_path / "tests_registry_shared.py"
    shared.write_text("from asyncrl.registry import Registry\nREG = Registry('task', discover='regdisc_pkg.{name}')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import tests_registry_shared

    assert tests_registry_shared.REG["extra"] == 42
    with pytest.raises(UnknownNameError, match="unknown task 'absent'; valid names: extra"):
        tests_registry_shared.REG["absent"]


@pytest.mark.parametrize("lookup, kind, a_valid_name", [
    ("asyncrl.rollout.replica:get_backend_cls", "rollout backend", "vllm"),
    ("asyncrl.sync:get_engine_cls", "checkpoint engine", "nccl"),
    ("asyncrl.agent_loop.base:get_agent_loop_cls", "agent loop", "tool_agent"),
    ("asyncrl.agent_loop.tools:get_tool", "tool", "calculator"),
    ("asyncrl.agent_loop.tool_parser:get_tool_parser", "tool parser", "qwen3_coder"),
    ("asyncrl.data.dataset:TASKS.__getitem__", "task", "calc_tool"),
    ("asyncrl.reward:REWARD_FNS.__getitem__", "reward (data_source)", "openai/gsm8k"),
])
def test_all_seven_registries_fail_the_same_way(lookup, kind, a_valid_name):
    import importlib

    module, _, path = lookup.partition(":")
    fn = importlib.import_module(module)
    for part in path.split("."):
        fn = getattr(fn, part)
    with pytest.raises(UnknownNameError) as info:
        fn("no_such_thing")
    assert info.value.kind == kind
    assert a_valid_name in info.value.valid
    assert str(info.value).startswith(f"unknown {kind} 'no_such_thing'; valid names: ")


def test_lazy_entries_import_nothing_heavy():
    code = ("import sys, asyncrl, asyncrl.rollout.replica, asyncrl.sync, asyncrl.agent_loop.base, "
            "asyncrl.agent_loop.tools, asyncrl.data.dataset, asyncrl.reward\n"
            "print([m for m in ('vllm', 'asyncrl.agent_loop.sandbox.loop', 'asyncrl.sync.nccl_engine') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_registry_suggests_a_name_whatever_its_case_or_a_unique_prefix():
    """Session 23: the simulator's presets (`--preset H20`) and the recipes (`longtail_colocated`) got no suggestion; the
    registries' own lookups used a case-sensitive close match, so the same slip passed there. One function now serves
    both (:func:`asyncrl.registry.closest_name`)."""
    from asyncrl.registry import UnknownNameError, closest_name

    names = ["h20-qwen2.5-7b", "h100-qwen2.5-7b", "longtail_colocated_cpu", "longtail_grpo_cpu"]
    assert closest_name("H20", names) == "h20-qwen2.5-7b"  # a unique prefix at a word boundary
    assert closest_name("longtail_colocated", names) == "longtail_colocated_cpu"
    assert closest_name("zzz", names) is None
    assert "did you mean 'h20-qwen2.5-7b'?" in str(UnknownNameError("sim preset", "H20-QWEN2.5-7B", sorted(names)))
