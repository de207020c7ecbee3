"""The arith generator and the verl-schema loader."""

import importlib.util
import json
import re

import pandas as pd
import pytest

from asyncrl.data import DatasetError, get_task_rows, load_rows, make_arith_rows, register_task, write_splits
from asyncrl.data.dataset import TASKS
from asyncrl.registry import UnknownNameError
from asyncrl.reward import compute_score


def test_generator_is_deterministic_and_seed_dependent():
    assert make_arith_rows(50, seed=3) == make_arith_rows(50, seed=3)
    assert make_arith_rows(50, seed=3) != make_arith_rows(50, seed=4)


def test_row_schema_and_target():
    row = make_arith_rows(1, seed=0)[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["data_source"] == "arith" and row["ability"] == "math"
    assert row["reward_model"]["style"] == "rule"
    (msg,) = row["prompt"]
    assert msg["role"] == "user" and msg["content"].startswith("What is ")
    a, b = msg["content"][len("What is "):-1].split("+")
    assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99
    gt = row["reward_model"]["ground_truth"]
    assert gt == str(int(a) + int(b))
    assert row["extra_info"]["answer"] == f"{a}+{b}={gt}\n#### {gt}"
    assert row["extra_info"]["index"] == 0 and row["extra_info"]["split"] == "train"
    assert compute_score("arith", row["extra_info"]["answer"], gt) == 1.0


@pytest.mark.parametrize("ops", ["-", "*", "+-*"])
def test_other_operators_are_correct_and_short(ops):
    rows = make_arith_rows(200, seed=1, operators=ops)
    for r in rows:
        expr = r["extra_info"]["answer"].split("=")[0]
        assert any(op in expr for op in ops)
        assert int(r["reward_model"]["ground_truth"]) == eval(expr)  # noqa: S307 - our own digits
        assert len(r["extra_info"]["answer"]) + 1 <= 20  # char-level tokens incl. EOS
    if ops == "+-*":
        used = {op for r in rows for op in "+-*" if op in r["extra_info"]["answer"].split("=")[0]}
        assert used == {"+", "-", "*"}


def test_unknown_operator_and_split_raise():
    with pytest.raises(ValueError, match="operator"):
        make_arith_rows(3, seed=0, operators="/")
    with pytest.raises(ValueError, match="split"):
        make_arith_rows(3, seed=0, split="dev")


def test_test_pool_exhaustion_recycles_with_warning(caplog):
    rows = make_arith_rows(1000, seed=0, operators="*", split="test")  # '*' test pool < 1000
    assert len(rows) == 1000 and "exhausted" in caplog.text


@pytest.mark.parametrize("ops", ["+", "-", "*", "+-*"])
def test_train_and_test_never_overlap(ops):
    train = {r["extra_info"]["question"] for r in make_arith_rows(5000, seed=0, operators=ops)}
    test_rows = make_arith_rows(100, seed=7, operators=ops, split="test")  # "*" has 116 test questions
    test = [r["extra_info"]["question"] for r in test_rows]
    assert len(set(test)) == len(test)  # no repeats within the test split
    assert not train & set(test)


def test_write_splits_round_trip(tmp_path):
    paths = write_splits(tmp_path, train_size=40, test_size=10, seed=2, operators="+-")
    assert set(paths) == {"train.parquet", "train.jsonl", "test.parquet", "test.jsonl"}
    expected = make_arith_rows(40, 2, "+-", "train")
    assert load_rows(paths["train.parquet"]) == expected
    assert load_rows(paths["train.jsonl"]) == expected
    test = load_rows(paths["test.parquet"])
    assert len(test) == 10 and all(r["extra_info"]["split"] == "test" for r in test)
    row = test[0]
    assert type(row["prompt"]) is list and type(row["prompt"][0]) is dict


def test_load_pandas_parquet_with_numpy_prompt_and_json(tmp_path):
    rows = make_arith_rows(5, seed=0)
    df = pd.DataFrame(rows)
    df["prompt"] = df["prompt"].apply(lambda p: __import__("numpy").array(p, dtype=object))
    pq = tmp_path / "d.parquet"
    df.to_parquet(pq)
    assert load_rows(pq) == rows
    js = tmp_path / "d.json"
    js.write_text(json.dumps(rows))
    assert load_rows(js) == rows
    js2 = tmp_path / "cols.json"
    pd.DataFrame(rows).to_json(js2)  # pandas' default orient="columns"
    assert load_rows(js2) == rows


def test_loader_error_names_file_row_and_field(tmp_path):
    rows = make_arith_rows(3, seed=0)
    del rows[2]["reward_model"]
    p = tmp_path / "bad.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DatasetError, match=r"bad\.jsonl: row 2: missing required field 'reward_model'"):
        load_rows(p)
    rows = make_arith_rows(2, seed=0)
    rows[1]["reward_model"] = {"style": "rule"}
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DatasetError, match=r"row 1: missing required field 'reward_model.ground_truth'"):
        load_rows(p)
    (tmp_path / "x.csv").write_text("a")
    with pytest.raises(DatasetError, match="unsupported dataset suffix"):
        load_rows(tmp_path / "x.csv")
    with pytest.raises(FileNotFoundError):
        load_rows(tmp_path / "missing.parquet")


@pytest.mark.parametrize("change, says", [
    (lambda r: r["prompt"][0].update(content=None), r"row 1: field 'prompt\[0\]\.content' must be a string, got null"),
    (lambda r: r["prompt"][0].update(content=12345), r"row 1: field 'prompt\[0\]\.content' must be a string, got int"),
    (lambda r: r["prompt"][0].update(content=[{"type": "text", "text": "hi"}]),
     r"got list \(a list of content parts is not supported: join their text into one string\)"),
    (lambda r: r["prompt"][0].update(role=3), r"row 1: field 'prompt\[0\]\.role' must be a string, got int"),
    (lambda r: r.update(tools="notalist"), r"row 1: field 'tools' must be a list of JSON-schema tool objects, got str"),
    (lambda r: r.update(data_source=5), r"row 1: field 'data_source' must be a non-empty string \(it picks the reward"),
    (lambda r: r["reward_model"].update(ground_truth=""), r"row 1: field 'reward_model.ground_truth' is empty \(''\)"),
    (lambda r: r["reward_model"].update(ground_truth=[]), r"row 1: field 'reward_model.ground_truth' is empty \(\[\]\)"),
    (lambda r: r.update(prompt=""), r"^\S*bad\.jsonl: row 1: field 'prompt' is empty \(''\): give the question's text$"),
    (lambda r: r.update(prompt=" \n\t"), r"^\S*bad\.jsonl: row 1: field 'prompt' is empty \(' \\n\\t'\): give the question's text$"),
    (lambda r: r.update(prompt=[{"role": "system", "content": ""}, {"role": "user", "content": "  "}]),
     r"^\S*bad\.jsonl: row 1: field 'prompt' has no text: the content of every message is empty or whitespace$"),
    (lambda r: r["prompt"][0].update(role="robot"),
     r"^\S*bad\.jsonl: row 1: field 'prompt\[0\]\.role' is 'robot'; allowed roles: system, user, assistant, tool "
     r"\('developer' is read as 'system'\)$"),
    (lambda r: r["prompt"][0].update(role="User"), r"row 1: field 'prompt\[0\]\.role' is 'User'; allowed roles: system, "
                                                   r"user, assistant, tool \('developer' is read as 'system'\); did you "
                                                   r"mean 'user'\?$"),
])
def test_a_message_the_chat_template_cannot_render_is_named_by_its_row(tmp_path, change, says):
    """Session 30's fresh user: a null / int / content-part-list message content and a ``tools`` string reached the
    chat template and failed inside it as a Jinja or transformers traceback naming no file or row."""
    rows = make_arith_rows(2, seed=0)
    change(rows[1])
    p = tmp_path / "bad.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DatasetError, match=says):
        load_rows(p)
    rows = make_arith_rows(1, seed=0)  # an assistant turn of tool calls may have no content (OpenAI's form)
    rows[0]["prompt"].append({"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]})
    p.write_text(json.dumps(rows[0]) + "\n")
    assert load_rows(p)[0]["prompt"][-1]["content"] is None


def test_every_chat_role_loads_and_developer_is_read_as_system(tmp_path):
    """The good side of the role and empty-prompt checks: the four chat roles, an empty system message beside a
    question, and OpenAI's ``developer`` (which the shipped Qwen templates dropped without a word) read as
    ``system``, as the trajectory proxy reads it."""
    row = make_arith_rows(1, seed=0)[0]
    row["prompt"] = [{"role": "developer", "content": "Answer briefly."}, {"role": "system", "content": ""},
                     row["prompt"][0], {"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]},
                     {"role": "tool", "content": "4"}, {"role": "user", "content": "and then?"}]
    p = tmp_path / "roles.jsonl"
    p.write_text(json.dumps(row) + "\n")
    assert [m["role"] for m in load_rows(p)[0]["prompt"]] == ["system", "system", "user", "assistant", "tool", "user"]


def test_a_file_that_is_not_text_or_not_parquet_is_a_dataset_error(tmp_path):
    """A stray 0xff byte raised UnicodeDecodeError, a corrupt parquet pyarrow's ArrowInvalid, as tracebacks."""
    row = json.dumps(make_arith_rows(1, seed=0)[0]).encode()
    (tmp_path / "bad8.jsonl").write_bytes(row + b"\n" + b'{"a": "\xff"}\n')
    with pytest.raises(DatasetError, match=r"bad8\.jsonl: not UTF-8 text \(byte b'\\xff' at offset \d+\); save it"):
        load_rows(tmp_path / "bad8.jsonl")
    (tmp_path / "corrupt.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DatasetError, match=r"corrupt\.parquet: cannot parse as parquet: ArrowInvalid: "):
        load_rows(tmp_path / "corrupt.parquet")


def test_get_task_rows_and_registry():
    rows = get_task_rows("arith", "test", 20, seed=0, operators="+")
    assert rows == make_arith_rows(20, 0, "+", "test")
    if importlib.util.find_spec("asyncrl.data.calc_tool"):  # lazily imported built-in task module
        assert len(get_task_rows("calc_tool", "train", 2, seed=0)) == 2
    with pytest.raises(UnknownNameError, match="unknown task 'nope'; valid names: arith, calc_tool, longtail, swe_examples, word_problems"):
        get_task_rows("nope", "train", 1, 0)
    with pytest.raises(UnknownNameError, match="did you mean 'word_problems'"):  # listed before its first use
        get_task_rows("word_problem", "train", 1, 0)
    try:
        register_task("const", lambda size, seed, split, ops: make_arith_rows(size, seed, ops, split))
        assert len(get_task_rows("const", "train", 4, 0)) == 4
    finally:
        TASKS.pop("const", None)


def test_run_rows_are_the_files_when_set_else_the_tasks(tmp_path):
    """One definition of a run's rows, shared by ``Experiment.start`` and ``asyncrl.sim.simulate`` (which built the
    task's rows whatever ``data.train_files`` said)."""
    from asyncrl.config import DataConfig
    from asyncrl.data.dataset import run_rows

    rows = [{"data_source": "arith", "prompt": f"q{i}", "reward_model": {"ground_truth": str(i)}} for i in range(5)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = DataConfig(train_size=7, val_size=3)
    assert run_rows(d, "train", 0) == get_task_rows("arith", "train", 7, 0)
    assert run_rows(d, "test", 0, limit=2) == get_task_rows("arith", "test", 2, 0)
    d.train_files = str(tmp_path / "train.jsonl")
    assert [r["prompt"][0]["content"] for r in run_rows(d, "train", 0)] == [f"q{i}" for i in range(5)]
    from asyncrl.data.sampler import epoch_order  # a limit: the first epoch's first rows, as a run takes them

    assert [r["prompt"][0]["content"] for r in run_rows(d, "train", 0, limit=2)] == [
        f"q{i}" for i in sorted(epoch_order(5, 0, 0)[:2])]
    d.shuffle = False
    assert [r["prompt"][0]["content"] for r in run_rows(d, "train", 0, limit=2)] == ["q0", "q1"]
    d.shuffle = True
    # no val_files beside train_files: no held-out rows. They were the task's test split (session 31's user: 200
    # generated arith rows evaluated and scored by the user's reward, a data mix-up); verl requires val_files
    from asyncrl.data.dataset import held_out_source, no_held_out

    assert run_rows(d, "test", 0) == [] and no_held_out(d).startswith("data.val_files unset: no held-out evaluation")
    assert held_out_source(d, 0) == ("none: data.val_files unset: no held-out evaluation (set data.val_files=... to "
                                     "evaluate held-out rows)")
    d.val_files = str(tmp_path / "train.jsonl")
    assert len(run_rows(d, "test", 0)) == 5 and not no_held_out(d)
    assert held_out_source(d, 5) == f"5 from data.val_files={d.val_files}"
    d.train_files = None  # the task's rows to train on, the user's to evaluate
    assert len(run_rows(d, "test", 0)) == 5
    d.val_files = None
    assert run_rows(d, "test", 0) == get_task_rows("arith", "test", 3, 0)  # neither: the task's test split
    assert held_out_source(d, 3).startswith("3 generated by data.task=arith (data.val_size")


def test_every_data_source_with_no_reward_is_named_with_its_rows(tmp_path, capsys):
    """Session 31's user: the error named only the first unknown source (row 0); a file mixing several left the others
    to the next try. Each is named with its row count and first row (a close known name suggested per source), and
    ``asyncrl sim`` on the command line is not told to call ``asyncrl.reward.register_reward`` (a Python caller of
    ``asyncrl.sim.simulate`` is)."""
    from asyncrl.cli import main
    from asyncrl.config import DataConfig
    from asyncrl.data.dataset import run_rows

    sources = ["my_sum"] * 5 + ["arith", "other", "my_sum", "gsm8kk", "other"]
    (tmp_path / "mixed.jsonl").write_text("".join(json.dumps(
        {"data_source": s, "prompt": f"q{i}", "reward_model": {"ground_truth": "1"}}) + "\n" for i, s in enumerate(sources)))
    with pytest.raises(DatasetError) as info:
        run_rows(DataConfig(train_files=str(tmp_path / "mixed.jsonl")), "train", 0)
    msg = str(info.value)
    assert msg.startswith(f"{tmp_path / 'mixed.jsonl'}: data_sources 'my_sum' (6 rows, the first row 0), 'other' (2 "
                          "rows, the first row 6) and 'gsm8kk' (row 8; did you mean 'gsm8k'?) have no reward function "
                          "(known: "), msg
    assert "register_reward" in msg and msg.endswith("scores every row (data.train_files)"), msg
    assert main(["sim", f"data.train_files={tmp_path / 'mixed.jsonl'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"dataset error: {msg.replace(' register one with asyncrl.reward.register_reward(name, fn),', '')}", err


def test_a_comma_separated_file_name_that_does_not_exist_hints_at_the_list_form(tmp_path):
    """``data.train_files=a.jsonl,b.json`` is one file name (OmegaConf reads a string): "dataset file not found:
    a.jsonl,b.json" alone left the user guessing (session 30)."""
    from asyncrl.data.dataset import load_files

    with pytest.raises(FileNotFoundError, match=r"dataset file not found: a.jsonl,b.json \(data.train_files\); several "
                                                r"files are a list: data.train_files=\[a.jsonl,b.json\]"):
        load_files("a.jsonl,b.json")


def test_a_row_whose_data_source_has_no_reward_function_is_refused_where_a_run_reads_it(tmp_path):
    """A fresh user's ``data_source: my_task`` trained on the gsm8k scorer's rewards (a WARNING in an actor's log);
    verl raises ``NotImplementedError`` for it. A run's rows (:func:`run_rows`) are checked before anything starts,
    naming file, row and key; a verifier row (its agent loop's verifier scores it) and a run whose
    ``custom_reward_function`` scores every row are not; :func:`load_rows` alone checks only the schema."""
    from asyncrl.config import DataConfig
    import functools

    from asyncrl.data.dataset import check_sources, run_rows
    from asyncrl.reward import reward_problem, sources_problem

    good = [{"data_source": s, "prompt": f"q{i}", "reward_model": {"ground_truth": str(i)}}
            for i, s in enumerate(["arith", "gsm8k", "openai/gsm8k", "calc_tool", "word_problems", "longtail"])]
    verifier = {"data_source": "harbor", "prompt": "fix it", "reward_model": {"style": "verifier", "ground_truth": ""}}
    bad = {"data_source": "my_task", "prompt": "q", "reward_model": {"ground_truth": "1"}}
    (tmp_path / "good.jsonl").write_text("".join(json.dumps(r) + "\n" for r in good + [verifier]))
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in good[:2] + [bad, bad]))
    d = DataConfig(train_files=str(tmp_path / "good.jsonl"), val_files=str(tmp_path / "mine.jsonl"))
    assert [r["data_source"] for r in run_rows(d, "train", 0)] == [r["data_source"] for r in good + [verifier]]
    here = reward_problem("my_task").replace("'my_task'", "'my_task' (2 rows, the first row 2)", 1)
    with pytest.raises(DatasetError, match=rf"^\S*mine\.jsonl: {re.escape(here)} \(data\.val_files\)$"):
        run_rows(d, "test", 0)
    d.train_files = [str(tmp_path / "good.jsonl"), str(tmp_path / "mine.jsonl")]
    with pytest.raises(DatasetError, match=r"^\S*mine\.jsonl: data_source 'my_task' \(2 rows, the first row 2\) has no "
                                           r"reward function \(known: .*\); .* scores every row "
                                           r"\(data\.train_files\[1\], file 2 of 2\)$"):
        run_rows(d, "train", 0, limit=3)  # every file is checked, as every file is read
    assert len(run_rows(d, "train", 0, check_source=None)) == 11  # a custom_reward_function scores every row
    assert len(load_rows(tmp_path / "mine.jsonl")) == 4
    with pytest.raises(DatasetError, match=r"^<task arith/train>: \{'arith': '2 rows, the first row 0'\}$"):
        check_sources(get_task_rows("arith", "train", 2, 0), "<task arith/train>", lambda where: str(where))
    for task in ("arith", "calc_tool", "longtail", "word_problems", "swe_examples"):  # the shipped tasks' rows
        run_rows(DataConfig(task=task, train_size=4, val_size=4), "test", 0,
                 check_source=functools.partial(sources_problem, every_process=True))
