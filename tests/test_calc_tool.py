"""calc_tool: the safe calculator, the task rows, the warm-start data, and the committed checkpoint."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import pathlib
import sys

import pytest

from asyncrl.agent_loop.proxy.rendering import ChatRenderer
from asyncrl.agent_loop.tool_agent import ToolAgentLoop
from asyncrl.agent_loop.tools import ToolError, get_tool
from asyncrl.agent_loop.tools.calculator import CALCULATOR_SCHEMA, format_number, safe_eval
from asyncrl.data.calc_tool import demonstration, is_test_question, make_calc_tool_rows
from asyncrl.data.dataset import get_task_rows
from asyncrl.models import load_tokenizer
from asyncrl.reward import compute_score
from asyncrl.rollout.base import SamplingParams
from tests.fake_tool_engine import FakeToolEngine

ROOT = pathlib.Path(__file__).resolve().parents[1]
CKPT = ROOT / "asyncrl" / "models" / "tiny_qwen2_calc_tool"
MAX_POSITIONS = 512
RESPONSE_LENGTH = 128  # calc_tool_grpo_cpu


def _builder():
    """``scripts/build_calc_tool_model.py`` as a module (imported once)."""
    name = "build_calc_tool_model"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.mark.parametrize("expr,value", [
    ("123*45", 5535), ("12*34+567", 975), ("2+3*4", 14), ("(2+3)*4", 20), ("-3+5", 2), ("7//2", 3),
    ("7%4", 3), ("2**10", 1024), (" 1 + 1 ", 2), ("1/4", 0.25), ("10/4*2", 5.0),
])
def test_safe_eval_values(expr, value):
    assert safe_eval(expr) == value


def test_format_number():
    assert format_number(5535) == "5535" and format_number(5.0) == "5" and format_number(1 / 3) == "0.333333"


@pytest.mark.parametrize("expr", [
    "__import__('os').system('true')", "abs(-1)", "x+1", "1 if 1 else 2", "[1]", "1/0", "2**1000",
    "9" * 40 + "**9", "1+" * 150 + "1", "", "   ", "1+", "'a'*3", "True+1",
])
def test_safe_eval_rejects(expr):
    with pytest.raises(ToolError):
        safe_eval(expr)


def test_calculator_tool_arguments():
    calc = get_tool("calculator")
    assert calc.schema == CALCULATOR_SCHEMA
    assert asyncio.run(calc.execute({"expression": "123*45"})) == "5535"
    with pytest.raises(ToolError, match="missing"):
        asyncio.run(calc.execute({}))
    with pytest.raises(ToolError, match="unexpected"):
        asyncio.run(calc.execute({"expression": "1", "x": 2}))


def test_rows_schema_and_ground_truth():
    rows = make_calc_tool_rows(200, 0, "train")
    for r in rows:
        assert r["data_source"] == "calc_tool" and r["agent_name"] == "tool_agent"
        assert r["tools"] == [CALCULATOR_SCHEMA]
        assert r["extra_info"]["tool_selection"] == ["calculator"]
        expr = r["extra_info"]["expression"]
        assert r["prompt"] == [{"role": "user", "content": f"What is {expr}?"}]
        assert r["reward_model"]["ground_truth"] == str(safe_eval(expr)) and safe_eval(expr) >= 0
    assert {r["extra_info"]["expression"].count("*") for r in rows} == {0, 1}
    assert rows == make_calc_tool_rows(200, 0, "train")


def test_splits_disjoint_and_registered():
    train = get_task_rows("calc_tool", "train", 2000, seed=1)
    test = get_task_rows("calc_tool", "test", 300, seed=2)
    tr = {r["extra_info"]["expression"] for r in train}
    te = [r["extra_info"]["expression"] for r in test]
    assert len(set(te)) == len(te) and not tr & set(te)
    assert all(is_test_question(e) for e in te) and not any(is_test_question(e) for e in tr)
    with pytest.raises(ValueError, match="shapes"):
        make_calc_tool_rows(1, 0, "train", shapes="a/b")


def test_trajectories_fit_the_context(tok):
    """Longest expressions of every shape: prompt + whole response within 512 positions and the budget."""
    renderer = ChatRenderer(tok)
    build = _builder()
    longest: dict[str, dict] = {}
    for r in make_calc_tool_rows(3000, 0, "train"):
        shape = "".join(c for c in r["extra_info"]["expression"] if not c.isdigit())
        size = len(r["extra_info"]["expression"] + r["reward_model"]["ground_truth"])
        if shape not in longest or size > longest[shape][0]:
            longest[shape] = (size, r)
    assert len(longest) == 4
    longest = {k: v[1] for k, v in longest.items()}
    for r in longest.values():
        ids, _ = build.encode_demo(renderer, r, True)
        prompt = renderer.prompt_ids(r["prompt"], r["tools"])
        assert len(ids) <= MAX_POSITIONS
        assert len(ids) - len(prompt) <= RESPONSE_LENGTH
        assert len(prompt) <= 384  # calc_tool_grpo_cpu's data.max_prompt_length


@pytest.mark.parametrize("call_tool", [True, False])
def test_demonstration_equals_tool_agent_trajectory(tok, call_tool):
    """The warm start trains on exactly the ids the ToolAgentLoop produces for the same conversation."""
    build = _builder()
    row = make_calc_tool_rows(1, 3, "train")[0]
    ids, loss_mask = build.encode_demo(ChatRenderer(tok), row, call_tool)
    msgs = demonstration(row, call_tool)
    turns = []
    for m in msgs[1:]:
        if m["role"] == "assistant" and m.get("tool_calls"):
            args = json.dumps({"name": "calculator", "arguments": m["tool_calls"][0]["function"]["arguments"]})
            turns.append(f"<tool_call>\n{args}\n</tool_call>")
        elif m["role"] == "assistant":
            turns.append(m["content"])
    loop = ToolAgentLoop(FakeToolEngine(tok, turns), tok, None)
    out = asyncio.run(loop.run(SamplingParams(max_tokens=RESPONSE_LENGTH), request_id="r", **row))
    assert out.prompt_ids + out.response_ids == ids
    loop_mask = [0] * len(out.prompt_ids) + out.response_mask
    # equal except the EOS after a call: the loop stopped at </tool_call> (filler), SFT trains on it
    diff = [i for i, (a, b) in enumerate(zip(loss_mask, loop_mask)) if a != b]
    assert all(ids[i] == tok.eos_token_id and ids[i - 1] == tok.convert_tokens_to_ids("</tool_call>") for i in diff)
    assert len(diff) == (1 if call_tool else 0)
    text = tok.decode(out.response_ids, skip_special_tokens=True)
    assert compute_score("calc_tool", text, row["reward_model"]["ground_truth"]) == 1.0


def test_checkpoint_card_and_size(tok):
    card = json.loads((CKPT / "card.json").read_text())
    size = sum(f.stat().st_size for f in CKPT.iterdir())
    assert size <= 20 * 2**20
    cfg = json.loads((CKPT / "config.json").read_text())
    assert cfg["max_position_embeddings"] == MAX_POSITIONS and cfg["model_type"] == "qwen2"
    greedy = card["eval"]["greedy"]
    assert 0.2 <= greedy["accuracy"] <= 0.6  # partial: RL has room
    assert 0.5 <= greedy["tool_call_success_rate"] < 1.0  # skips the tool on some questions
    assert card["eval"]["sampled_t1"]["tool_call_rate"] < 1.0
    assert card["how"]["script"] == "scripts/build_calc_tool_model.py"
    # same tokenizer as the embedded model
    other = load_tokenizer(CKPT)
    text = '<tool_call>\n{"name": "calculator"}\n</tool_call><|im_end|>'
    assert other.encode(text) == tok.encode(text) and other.chat_template == tok.chat_template


def test_checkpoint_calls_the_tool_through_the_loop(tok):
    """Greedy, CPU, real calculator: the warm start emits well-formed calls that the tool answers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(CKPT)).eval()
    rows = make_calc_tool_rows(8, 0, "test")
    result = _builder().evaluate(model, load_tokenizer(CKPT), rows, RESPONSE_LENGTH)
    assert result["tool_call_rate"] >= 0.5  # the warm start skips the tool on a*b questions only
    assert result["tool_call_success_rate"] == result["tool_call_rate"]  # every call it makes is well-formed
    assert result["tool_call_rate_by_shape"]["a*b+c"] == 1.0
    assert result["accuracy"] > 0.0
