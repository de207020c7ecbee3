"""Widget models from synthetic status snapshots (no Ray, no vLLM, no browser).

Snapshots live in ``tests/data/snapshots`` (regenerate with ``make_snapshots.py`` there); they have
the shape of ``Experiment.status_async()`` after a JSON round trip (int keys as str, tuples as lists).
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
from pathlib import Path

import pytest

from widgets import (
    ConcurrencyFunnel,
    Dashboard,
    Poller,
    StalenessView,
    TrajectoryInspector,
    binding_layer,
    check_lengths,
    curves_model,
    funnel_model,
    lag_histogram,
    span_counts,
    staleness_model,
    trajectory_model,
)

SNAPSHOTS = Path(__file__).parent / "data" / "snapshots"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load(name: str) -> dict:
    return json.loads((SNAPSHOTS / f"{name}.json").read_text())


def counts(model) -> dict:
    return {layer.key: (layer.count, layer.limit) for layer in model.layers}


# ---------------------------------------------------------------------- funnel
def test_funnel_counts_limits_and_binding_when_queue_full():
    m = funnel_model(load("mq_bound"))
    assert counts(m) == {"pending_queue": (12, 12), "staleness_samples": (12, 12), "active_tasks": (3, 8),
                         "replica:replica_0": (10, None), "replica:replica_1": (6, None), "message_queue": (12, 12)}
    # staleness and queue are both full: the most downstream full layer (the queue) binds
    assert m.binding == "message_queue"
    assert [layer.key for layer in m.layers][0] == "pending_queue" and not m.layer("pending_queue").bindable


def test_funnel_binding_moves_to_active_tasks():
    assert funnel_model(load("active_bound")).binding == "active_tasks"


def test_funnel_highest_utilisation_when_none_full():
    snap = load("mq_bound")
    snap["rollouter"].update(staleness_samples=9, active_tasks=5)
    snap["message_queue"]["size"] = 4
    m = funnel_model(snap)
    assert not any(layer.full for layer in m.layers if layer.bindable)
    assert m.binding == "staleness_samples"  # 9/12 > 5/8 > 4/12; the full pending queue never binds


def test_funnel_nothing_binds_when_idle_and_optional_pools_absent():
    m = funnel_model(load("early"))
    assert m.binding is None
    assert not any(k in counts(m) for k in ("agent_loop_workers", "sandboxes"))


def test_funnel_shows_the_trainers_drops_by_reason():
    snap = copy.deepcopy(load("mq_bound"))
    snap.setdefault("trainer", {})["dropped"] = {"stale": 2, "dapo_no_signal": 5, "other": 0}
    m = funnel_model(snap)
    assert m.drops == {"stale": 2, "dapo_no_signal": 5}
    f = ConcurrencyFunnel()
    f.update(snap)
    assert "trainer dropped (after the queue): dapo_no_signal 5, stale 2" in f.to_html()


def test_funnel_optional_pools_and_replica_limits():
    m = funnel_model(load("pools"))
    c = counts(m)
    assert c["agent_loop_workers"] == (4, 4) and c["sandboxes"] == (2, 6)
    assert c["replica:replica_0"] == (10, 16)  # load balancer's own limit wins over the argument
    assert m.binding == "agent_loop_workers"


def test_funnel_replica_limit_argument_makes_replica_bind():
    m = funnel_model(load("active_bound"), replica_limit=8)
    assert counts(m)["replica:replica_0"] == (10, 8)
    assert m.binding == "replica:replica_0"  # downstream of active_tasks, also full


def test_binding_layer_of_empty_list_is_none():
    assert binding_layer([]) is None


def test_funnel_history_is_a_short_deque():
    f = ConcurrencyFunnel(history=3)
    snap = load("mq_bound")
    for n in range(5):
        snap["rollouter"]["active_tasks"] = n
        f.update(snap)
    assert f.model.history["active_tasks"] == [2, 3, 4]
    assert f.model.layer("active_tasks").count == 4


def test_funnel_live_widget_tracks_the_model():
    f = ConcurrencyFunnel()
    f.update(load("mq_bound"))
    f.widget  # build
    _, label, bar, num, _ = f._rows["message_queue"]
    assert (bar.value, bar.max, bar.bar_style) == (12, 12, "danger") and "<b>" in label.value
    snap = load("active_bound")
    f.update(snap)
    assert f._rows["active_tasks"][2].bar_style == "danger"
    assert f._rows["message_queue"][2].value == 4 and f._rows["message_queue"][2].bar_style == "info"
    html = f.to_html()
    assert 'class="binding" data-layer="active_tasks"' in html
    # what "binding layer" means is said in the widget itself, live and in the static snapshot
    from widgets.funnel import BINDING_NOTE

    assert "or the fullest when none is" in BINDING_NOTE  # a reader saw a half-full layer red under "at its limit"
    assert BINDING_NOTE in f._head.value and BINDING_NOTE in html


def test_funnel_bars_have_the_same_colour_live_in_html_and_in_the_png():
    """A reader saw the pending queue blue live and grey in the PNG: one colour per layer state everywhere."""
    import re

    from widgets._common import FUNNEL_COLORS, funnel_bar_color

    seen = set()
    for name in ("mq_bound", "active_bound", "pools", "early", "done"):
        f = ConcurrencyFunnel()
        f.update(load(name))
        f.widget  # build
        html = f.to_html()
        for layer in f.model.layers:
            live = f._rows[layer.key][2].style.bar_color
            row = re.search(rf'data-layer="{layer.key}">(.*?)</tr>', html).group(1)
            assert live == funnel_bar_color(layer, f.model.binding) and live in row, (name, layer.key, live)
            seen.add(live)
    assert {FUNNEL_COLORS["binding"], FUNNEL_COLORS["not bindable"], FUNNEL_COLORS["open"]} <= seen, seen


# ---------------------------------------------------------------------- staleness
def test_lag_histogram_bins_from_json_keys():
    assert lag_histogram({"0": 700, "1": 250, "2": 50}, bound=2) == ([0, 1, 2], [700, 250, 50])
    assert lag_histogram({"1": 5}, bound=3) == ([0, 1, 2, 3], [0, 5, 0, 0])
    assert lag_histogram({0: 1, 4: 2}, bound=1) == ([0, 1, 2, 3, 4], [1, 0, 0, 0, 2])  # beyond the bound: shown
    assert lag_histogram({}, bound=0) == ([0], [0])


def test_staleness_model_values():
    m = staleness_model(load("mq_bound"))
    assert m.lag_bins == [0, 1, 2] and m.total_tokens == 1000
    assert m.lag_fraction == pytest.approx([0.7, 0.25, 0.05])
    assert m.mean_lag == pytest.approx(0.35)
    assert (m.param_version, m.rollout_version, m.bound) == (6, 6, 2)
    assert (m.staleness_samples, m.max_required_samples) == (12, 12)
    assert [r for _, r in m.trainer_idle] == pytest.approx([0.57, 0.54, 0.51, 0.48, 0.45, 0.42])
    assert m.span_counts == {0: 1, 1: 3, 2: 1}
    assert span_counts([[1, 2], (3, 3), [None, None]]) == {0: 1, 1: 1}


def test_staleness_view_records_rollouter_idle_per_poll():
    v = StalenessView()
    snap = load("mq_bound")
    v.update(snap)
    assert len(v.model.trainer_idle) == 6  # one snapshot: the trainer's series comes from its history rows
    for t, r in ((1.0, 0.5), (1.0, 0.5), (2.0, 0.25)):  # a repeated poll of the same instant is kept once
        snap["elapsed_s"], snap["rollouter"]["idle_ratio"], snap["trainer"]["idle_ratio"] = t, r, r / 2
        v.update(snap)
    assert v.model.rollouter_idle == [(25.5, 0.21), (1.0, 0.5), (2.0, 0.25)]
    # polled: both series on the experiment's elapsed_s time base
    assert v.model.trainer_idle == [(25.5, 0.42), (1.0, 0.25), (2.0, 0.125)]
    assert 'data-lag="2"' in v.to_html() and "<svg" in v.idle_svg()


# ---------------------------------------------------------------------- trajectory inspector
SPAN = re.compile(r'<span class="tok ([^"]*)" data-i="(\d+)"')


def spans(html: str) -> list[tuple[str, int]]:
    return [(cls, int(i)) for cls, i in SPAN.findall(html)]


def test_inspector_mask_colouring_turns_and_versions():
    traj = load("mq_bound")["trajectories"][1]
    insp = TrajectoryInspector([traj], show_prompt=True)
    html = insp.to_html()
    all_spans = spans(html)
    n_prompt = len(traj["prompt_ids"])
    prompt_spans, resp_spans = all_spans[:n_prompt], all_spans[n_prompt:]
    assert all(cls.split()[0] == "prompt" for cls, _ in prompt_spans)
    assert len(resp_spans) == len(traj["response_ids"])
    assert [i for _, i in resp_spans] == list(range(len(traj["response_ids"])))
    for (cls, i), mask in zip(resp_spans, traj["response_mask"]):
        assert cls.split()[0] == ("m1" if mask else "m0"), (i, cls)
    m = insp.model
    assert m.turn_starts == [i for i, t in enumerate(traj["response_tokens"]) if t == "<|im_start|>"]
    assert m.versions == [4, 5] and (m.min_version, m.max_version) == (4, 5)
    mask = traj["response_mask"]
    assert [t.index for t in m.response if t.version_change] == [mask.index(1, mask.index(0))]
    assert "partial rollout v4 &rarr; v5" in html and "lengths agree" in html
    # logprob as hover title and as shade: a likelier token is darker
    first = next(t for t in m.response if t.mask)
    assert f"logprob={first.logprob:.3f}" in html
    assert m.model_tokens == sum(traj["response_mask"])


def test_logprob_shade_increases_with_probability():
    from widgets.inspector import Token, token_style

    alpha = lambda lp: float(re.search(r"rgba\([^)]*,([\d.]+)\)", token_style(Token(0, "a", 1, 1, lp))).group(1))  # noqa: E731
    assert alpha(-0.01) > alpha(-1.0) > alpha(-5.0)
    assert token_style(Token(0, "a", 1, 0, 0.0)) == ""


def test_inspector_length_mismatch_warning():
    traj = copy.deepcopy(load("mq_bound")["trajectories"][0])
    traj["response_logprobs"] = traj["response_logprobs"][:-1]
    lengths, warnings = check_lengths(traj)
    assert lengths["response_logprobs"] == lengths["response_ids"] - 1 and len(warnings) == 1
    insp = TrajectoryInspector([traj])
    assert not insp.model.lengths_ok
    html = insp.to_html()
    assert 'class="warn"' in html and "length mismatch" in html and "response_logprobs has" in html
    assert "lengths_ok=False" in repr(insp)


def test_inspector_flags_logprob_under_mask_zero():
    traj = copy.deepcopy(load("mq_bound")["trajectories"][1])
    i = traj["response_mask"].index(0)
    traj["response_logprobs"][i] = -0.5
    assert any("mask-0" in w for w in check_lengths(traj)[1])


def test_turns_fall_back_to_mask_transitions_without_markers():
    traj = {"uid": "x", "prompt_ids": [1], "response_ids": [5, 6, 7, 8, 9], "response_mask": [1, 1, 0, 1, 1],
            "response_logprobs": [-0.1, -0.2, 0.0, -0.3, -0.4], "response_tokens": list("abcde")}
    m = trajectory_model(traj)
    assert m.turn_starts == [3] and m.lengths_ok and m.versions == []


def test_inspector_says_not_scored_for_a_trajectory_without_reward():
    """A proxy session (notebook 03) has no reward: no stray 'None' in the header or the dropdown."""
    traj = {"uid": "proxy-session", "prompt_ids": [1], "response_ids": [5, 6], "response_mask": [1, 0],
            "response_logprobs": [-0.1, 0.0], "response_tokens": list("ab"), "reward": None, "num_turns": 2}
    insp = TrajectoryInspector([traj])
    insp.widget
    assert "not scored" in insp.to_html() and "None" not in insp.to_html()
    assert [label for label, _ in insp._pick.options] == ["proxy-session  turns=2"]
    insp.update({"trajectories": [{**traj, "reward": 0.0}]})
    assert "reward <b>0.0</b>" in insp.to_html() and insp._pick.options[0][0] == "proxy-session  reward=0.0  turns=2"


def test_control_characters_in_a_sampled_token_are_shown_escaped(tmp_path):
    """A garbled sample at temperature 1 (04's RL run) held "\x03": a box in the page, a glyph warning in red."""
    import warnings

    traj = {"uid": "g", "prompt_ids": [1], "response_ids": [5, 6], "response_mask": [1, 1],
            "response_logprobs": [-0.1, -0.2], "response_tokens": ["a\x03", "b\n"], "reward": 0.0, "num_turns": 2}
    insp = TrajectoryInspector([traj])
    assert "a\\x03" in insp.to_html() and "\x03" not in insp.to_html()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "Glyph 3 missing from font(s)" fails the test
        insp.to_png(tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 0


def test_inspector_selection_sticks_to_uid():
    trajs = load("mq_bound")["trajectories"]
    insp = TrajectoryInspector(trajs)
    assert insp.model.uid == trajs[-1]["uid"]  # newest by default
    insp.select(0)
    assert insp.model.uid == trajs[0]["uid"]
    insp.update({"trajectories": list(reversed(trajs))})
    assert insp.model.uid == trajs[0]["uid"]
    insp.widget
    insp._pick.value = trajs[1]["uid"]  # picking in the dropdown re-renders
    assert insp.model.uid == trajs[1]["uid"] and trajs[1]["uid"] in insp._view.value


# ---------------------------------------------------------------------- curves
def test_curves_model_series():
    m = curves_model(load("mq_bound"))
    assert m.steps == [1, 2, 3, 4, 5, 6] and len(m.reward) == 6 and m.pg_loss[0] == pytest.approx(0.0617, abs=1e-3)
    assert m.eval_steps == [0, 3, 6] and m.eval_accuracy == [0.1, 0.35, 0.5]


def test_live_charts_name_their_x_axis():
    """The dashboard's inline charts (a fresh reader: titles but no axis names) say what x counts."""
    from widgets import TrainingCurves

    curves, stale = TrainingCurves(), StalenessView()
    curves.update(load("mq_bound"))
    stale.update(load("mq_bound"))
    for svg in (curves.reward_svg(), curves.loss_svg()):
        assert re.search(r'text-anchor="middle">trainer step</text>', svg), svg
    assert 'text-anchor="middle">time (s)</text>' in stale.idle_svg()


def test_step_and_poll_axes_tick_at_whole_numbers_only():
    """A 2-step run's pg_loss chart once ticked at 1.0, 1.25, 1.5, ...: steps and polls are integers."""
    from widgets import static
    from widgets._common import _plt

    m = curves_model(load("mq_bound"))
    m.steps, m.reward, m.pg_loss, m.eval_steps, m.eval_accuracy = [1, 2], [0.2, 0.4], [0.05, -0.01], [0], [0.1]
    fig, axes = _plt().subplots(1, 3)
    static.draw_reward(axes[0], m)
    static.draw_loss(axes[1], m)
    funnel = ConcurrencyFunnel()
    for _ in range(3):  # three polls
        funnel.update(load("mq_bound"))
    static.draw_funnel_history(axes[2], funnel.model)
    fig.canvas.draw()
    for ax in axes:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), (ax.get_title(), ticks)
        assert ax.get_xlabel() and ax.get_ylabel(), ax.get_title()
    _plt().close(fig)


# ---------------------------------------------------------------------- poller / live dashboard
class FakeExperiment:
    """Experiment stand-in: ``status_async`` from a list of snapshots, ``rollouter.trajectories.remote``."""

    class _Rollouter:
        class _Traj:
            def __init__(self, trajs):
                self.trajs, self.calls = trajs, 0

            def remote(self, n):
                self.calls += 1
                fut = asyncio.get_running_loop().create_future()
                fut.set_result(self.trajs[-n:])
                return fut

        def __init__(self, trajs):
            self.trajectories = self._Traj(trajs)

    def __init__(self, snaps, name="fake-run"):
        self.snaps, self.name, self.calls = snaps, name, 0
        self.rollouter = self._Rollouter(load("mq_bound")["trajectories"])

    async def status_async(self):
        snap = self.snaps[min(self.calls, len(self.snaps) - 1)]
        self.calls += 1
        return copy.deepcopy(snap)


def test_dashboard_polls_experiment_and_fetches_trajectories():
    async def main():
        exp = FakeExperiment([load("early"), load("active_bound"), load("done")])
        dash = Dashboard(exp, interval=0.01)
        await asyncio.wait_for(dash.poller.task, 5)
        return exp, dash

    exp, dash = asyncio.run(main())
    assert dash.snapshot["state"] == "done" and dash.poller.reason.startswith("finished")
    assert dash.funnel.model.history["active_tasks"][:2] == [0, 8]
    assert dash.inspector.model is not None and exp.rollouter.trajectories.calls >= 1
    assert dash.model["global_steps"] == 8


def test_dashboard_waits_for_an_experiment_that_has_not_started():
    async def main():
        exp = FakeExperiment([{"state": "not started"}] * 3 + [load("mq_bound")] * 2 + [{"state": "not started"}])
        dash = Dashboard(exp, interval=0.01)
        await asyncio.wait_for(dash.poller.task, 5)
        return dash

    dash = asyncio.run(main())
    assert dash.poller.polls == 6 and dash.poller.reason == "finished (not started)"
    assert dash.model["state"] == "running" and dash.funnel.model.binding == "message_queue"


def test_new_dashboard_for_same_experiment_cancels_old_poller():
    async def main():
        exp = FakeExperiment([load("active_bound")])  # never "done": polls until cancelled
        first = Dashboard(exp, interval=0.01)
        await asyncio.sleep(0.05)
        second = Dashboard(exp, interval=0.01)
        await asyncio.sleep(0.05)
        states = (first.poller.task.cancelled(), first.poller.reason, second.poller.running)
        second.stop()
        await asyncio.sleep(0.01)
        return first, second, states

    first, second, (cancelled, reason, running) = asyncio.run(main())
    assert cancelled and reason == "replaced" and running
    assert second.poller.task.cancelled() and first.poller.polls >= 1


def test_poller_gives_up_after_failed_fetches_and_keeps_state():
    async def failing():
        raise ConnectionError("actor died")

    seen = []

    async def main():
        p = Poller(failing, seen.append, interval=0.01, key="failing", max_errors=3).start()
        await asyncio.wait_for(p.task, 5)
        return p

    p = asyncio.run(main())
    assert seen == [] and p.errors == 3 and "gave up" in p.reason and "actor died" in p.reason


def test_poller_without_running_loop_raises_and_dashboard_tolerates_it():
    with pytest.raises(RuntimeError):
        Poller(FakeExperiment([{}]).status_async, print).start()
    dash = Dashboard(FakeExperiment([load("mq_bound")]), key="no-loop")
    assert not dash.poller.running
    snap = asyncio.run(dash.refresh())
    assert snap["state"] == "running" and dash.funnel.model.binding == "message_queue"


def test_stopped_experiment_keeps_final_state_on_screen():
    dash = Dashboard(load("done"))
    dash.update({"state": "not started"})
    assert dash.model["state"] == "done" and dash.snapshot["state"] == "done"


# ---------------------------------------------------------------------- static snapshots and reprs
@pytest.mark.parametrize("name", ["mq_bound", "early", "pools"])
def test_static_snapshots_written(tmp_path, name):
    dash = Dashboard(load(name))
    paths = dash.save(tmp_path / name, dpi=40)
    assert set(paths) == {f"{v}.{ext}" for v in ("dashboard", "funnel", "staleness", "curves", "inspector")
                          for ext in ("png", "html")}
    for key, path in paths.items():
        data = path.read_bytes()
        assert len(data) > 300, key
        if key.endswith(".png"):
            assert data.startswith(PNG_MAGIC)
        else:
            assert b"asyncrl-w" in data


def test_each_view_renders_png_alone(tmp_path):
    snap = load("mq_bound")
    views = [ConcurrencyFunnel(), StalenessView(), TrajectoryInspector()]
    for i, v in enumerate(views):
        v.update(snap)
        assert v.to_png(tmp_path / f"{i}.png", dpi=40).read_bytes().startswith(PNG_MAGIC)
    assert TrajectoryInspector().to_png(tmp_path / "empty.png").stat().st_size > 0


def test_rich_reprs_with_text_fallback():
    dash = Dashboard(load("mq_bound"))
    bundle = dash._repr_mimebundle_()
    assert bundle["text/plain"].startswith("Dashboard('arith_grpo_cpu__0__")
    assert "Concurrency funnel" in bundle["text/html"]
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert repr(ConcurrencyFunnel()) == "ConcurrencyFunnel(no snapshot yet)"
    assert "binding='message_queue'" in repr(dash.funnel)
    assert "<svg" in dash.to_html() and dash._repr_html_() == dash.to_html()


def test_snapshot_shapes_match_the_real_components():
    """Guard against key drift: the load balancer and budget the widgets read, built by asyncrl itself."""
    import dataclasses

    from asyncrl.config import ExperimentConfig
    from asyncrl.rollout.load_balancer import RequestLoadBalancer
    from asyncrl.staleness import sample_budget

    lb = RequestLoadBalancer({"replica_0": object(), "replica_1": object()})
    for rid in ("a", "b", "c"):
        lb.acquire_server(rid)
    snap = load("mq_bound")
    snap["load_balancer"] = lb.snapshot()
    snap["budget"] = dataclasses.asdict(sample_budget(ExperimentConfig()))
    c = counts(funnel_model(snap, replica_limit=4))
    assert c["replica:replica_0"] == (2, 4) and c["replica:replica_1"] == (1, 4)
    assert staleness_model(snap).bound == snap["trainer"]["staleness_bound"]


def test_show_static_displays_html_and_png(tmp_path, monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(type(obj).__name__))
    Dashboard(load("done")).show_static(png=tmp_path / "d.png")
    assert shown == ["HTML", "Image"] and (tmp_path / "d.png").stat().st_size > 0


def test_final_state_reaches_the_displayed_output(monkeypatch):
    """papermill / exported notebooks show the output's HTML fallback: it must be the final state."""
    shown, updates = [], []
    monkeypatch.setattr("IPython.display.display", lambda obj, display_id=None: shown.append(display_id))
    monkeypatch.setattr("IPython.display.update_display",
                        lambda obj, display_id=None, raw=False: updates.append((obj, display_id, raw)))

    async def main():
        exp = FakeExperiment([load("early"), load("done")])
        dash = Dashboard(exp, interval=0.01, done_polls=2)
        assert dash.show() is None
        await dash.run(static_at_end=True)
        return dash

    dash = asyncio.run(main())
    assert shown and shown[0] is not None
    final = updates[-1]
    assert final[1] == shown[0] and final[2] is True
    assert set(final[0]) == {"text/plain", "text/html"} and "step <b>8</b>" in final[0]["text/html"]
    assert any(u[0] is dash for u in updates)  # the poller's exit hook refreshed the live output too


def test_close_after_the_run_shows_done_without_live_controls():
    """What a reader sees after a run: the run's end state, the inspector filled, no live button."""
    pytest.importorskip("ipywidgets")

    async def main():
        exp = FakeExperiment([load("early"), load("done")])
        dash = Dashboard(exp, interval=5.0)  # the poller has taken one snapshot when close() runs
        _ = dash.widget
        await asyncio.sleep(0.05)
        snap = await dash.close()
        return dash, snap

    dash, snap = asyncio.run(main())
    assert snap["state"] == "done" and dash.final and not dash.poller.running
    assert dash._stop_button.layout.display == "none"
    head = dash._head.value
    assert "done" in head and "[" not in re.sub(r"<[^>]+>", "", head), head
    assert dash.inspector.model is not None and dash.inspector._pick.options
    assert dash.inspector._view.value.count("Trajectory inspector") == 0  # the heading is the widget's own, once


def test_inspector_without_trajectories_has_one_heading_and_no_empty_dropdown():
    pytest.importorskip("ipywidgets")
    insp = TrajectoryInspector()
    box = insp.widget
    texts = [c.value for c in box.children if hasattr(c, "value") and isinstance(c.value, str)]
    assert sum(t.count("Trajectory inspector") for t in texts) == 1
    assert insp._pick.layout.display == "none"


def test_inspector_dropdown_labels_without_versions_say_nothing_about_versions():
    pytest.importorskip("ipywidgets")
    traj = dict(load("mq_bound")["trajectories"][0], min_global_steps=None, max_global_steps=None, uid="u1")
    insp = TrajectoryInspector([traj])
    _ = insp.widget
    assert "None" not in insp._pick.options[0][0]
    insp.update([dict(traj, min_global_steps=2, max_global_steps=3)])
    assert insp._pick.options[0][0].endswith("v2-v3")


def test_dashboard_header_shows_failures_by_type_with_the_latest_message():
    """Issue 13.10: the rollouter keys failures by exception type and keeps the recent messages with the
    sample uid; the dashboard shows both (and nothing when no sample failed)."""
    from widgets.dashboard import header_model

    snap = copy.deepcopy(load("done"))
    assert "failed samples" not in Dashboard(snap, autostart=False)._header_html()
    snap["rollouter"]["accounting"]["failed"] = {"TrajectoryCancelled": 1, "ValueError": 2}
    snap["rollouter"]["recent_failures"] = [
        {"uid": "u1", "type": "ValueError", "message": "bad row", "time": 1.0},
        {"uid": "9f3a", "type": "TrajectoryCancelled", "message": "trajectory 9f3a-0: a callee raised <x>", "time": 2.0}]
    assert header_model(snap)["last_failure"]["uid"] == "9f3a"
    head = Dashboard(snap, autostart=False)._header_html()
    assert "failed samples: TrajectoryCancelled 1, ValueError 2" in head
    assert "latest: sample 9f3a: TrajectoryCancelled: trajectory 9f3a-0: a callee raised &lt;x&gt;" in head


def test_dashboard_header_shows_the_summarys_held_out_accuracy_once_done():
    """The run summary's "after" is the mean of the last evaluations; a finished run's header shows that
    figure and says it is a mean (00 showed the last evaluation, 40.6%, beside a summary's 43.8%)."""
    from widgets.dashboard import header_model

    snap = copy.deepcopy(load("done"))
    snap["rollouter"]["eval_history"] = [{"version": 0, "accuracy": 0.438}, {"version": 3, "accuracy": 0.469},
                                         {"version": 6, "accuracy": 0.406}]
    assert header_model(snap)["accuracy"] == 0.406  # live: the latest evaluation
    head = Dashboard(snap, autostart=False)._header_html()
    assert "<b>40.6%</b>" in head and "mean of" not in head
    snap.update(accuracy_after=0.4375, accuracy_after_evals=3)  # what Experiment adds once summarised
    head = Dashboard(snap, autostart=False)._header_html()
    assert "held-out acc <b>43.8%</b> (mean of the last 3 evaluations)" in head
    snap.update(accuracy_after=0.406, accuracy_after_evals=1)
    assert "<b>40.6%</b>" in Dashboard(snap, autostart=False)._header_html().split("held-out acc")[1][:20]


def test_funnel_pin_shows_the_chosen_moment_under_its_title(tmp_path):
    funnel = ConcurrencyFunnel()
    for name in ("early", "active_bound", "done"):
        funnel.update(load(name))
    model = funnel.pin(load("active_bound"), title="narrow: binding active_tasks (peak load)")
    assert model.binding == "active_tasks" and funnel.model is model
    assert len(model.history["active_tasks"]) == 3  # the polls so far, nothing appended
    html = funnel.to_html()
    assert "narrow: binding active_tasks (peak load)" in html
    assert funnel.to_png(tmp_path / "f.png").read_bytes().startswith(PNG_MAGIC)


def test_tool_turns_are_observations_the_model_answered_not_a_trailing_newline():
    def traj(mask):
        return {"response_ids": list(range(len(mask))), "response_mask": mask,
                "response_logprobs": [-0.1 if m else 0.0 for m in mask],
                "response_tokens": [f"t{i}" for i in range(len(mask))]}

    single = trajectory_model(traj([1, 1, 1, 0]))  # answer, then the template's trailing newline
    assert single.tool_turns == 0 and single.observations == []
    tool = trajectory_model(traj([1, 1, 0, 0, 0, 1, 1, 0]))  # call, tool output, answer, newline
    assert tool.tool_turns == 1 and tool.observations == [(2, 5)] and tool.observation_text() == "t2t3t4"
    assert trajectory_model(traj([0, 0, 1, 1])).tool_turns == 0  # filler before the first model token


def test_legend_colours_are_the_ones_rendered():
    from widgets._common import CSS
    from widgets.inspector import LEGEND, header_html
    from widgets.static import MASK0_BG, MASK1_RGB, PROMPT_BG

    assert {k: v[0] for k, v in LEGEND.items()} == {"prompt": "grey", "mask 1": "blue", "mask 0": "orange"}
    assert f".tok.m0 {{background: {LEGEND['mask 0'][1]}" in CSS and f".tok.prompt {{background: {LEGEND['prompt'][1]}" in CSS
    assert (MASK0_BG, PROMPT_BG) == (LEGEND["mask 0"][1], LEGEND["prompt"][1])
    assert "#%02x%02x%02x" % tuple(round(c * 255) for c in MASK1_RGB) == LEGEND["mask 1"][1]
    legend = header_html(trajectory_model({"response_ids": [1], "response_mask": [1], "response_logprobs": [0.0]}))
    assert "mask 1 (blue" in legend and "mask 0 (orange" in legend and "rgba(24,144,255," in legend


def test_header_names_tool_turns_only_where_the_trajectory_has_them():
    from widgets.inspector import header_html

    def head(mask, turns):
        return header_html(trajectory_model({"response_ids": list(range(len(mask))), "response_mask": mask,
                                             "response_logprobs": [0.0] * len(mask), "num_turns": turns}))

    assert "turns 2 <span class='muted'>(user + assistant: no tool turn)</span>" in head([1, 1, 1], 2)
    assert "tool messages" not in head([1, 1, 0], 2)  # a trailing template newline is not a tool turn
    assert "(user, assistant and tool messages: 1 tool turn)" in head([1, 0, 0, 1], 4)
    assert "2 tool turns" in head([1, 0, 1, 0, 1], 6)


def test_staleness_panel_labels_partial_rollouts_trained_and_produced():
    """The panel's trained count is the run table's (rollouter/partial_count over the steps); the rollouter
    produces more when some are still queued or dropped at shutdown (01's mode d: 4 produced, 3 trained)."""
    snap = copy.deepcopy(load("mq_bound"))
    snap["rollouter"]["partial_spans"] = [[1, 2], [1, 2], [2, 3], [3, 4], [4, 4]]
    snap["trainer"]["history"] = [{**r, "rollouter/partial_count": n} for r, n in zip(snap["trainer"]["history"], [0, 2, 1, 0, 0, 0])]
    v = StalenessView()
    v.update(snap)
    assert (v.model.partial_produced, v.model.partial_trained) == (4, 3)
    assert "partial rollouts: trained <code>3</code> &middot; produced <code>4</code>" in v.to_html()


def test_a_full_pending_queue_is_drawn_full_not_grey():
    """06: the full pending queue was drawn grey at 100% on a grey track and read as empty/inactive."""
    from widgets._common import FUNNEL_COLORS, funnel_bar_color
    from widgets.funnel import Layer

    assert funnel_bar_color(Layer("pending_queue", "pending", 8, 8, bindable=False), None) == FUNNEL_COLORS["full"]
    assert funnel_bar_color(Layer("pending_queue", "pending", 3, 8, bindable=False), None) == FUNNEL_COLORS["not bindable"]
    assert funnel_bar_color(Layer("message_queue", "mq", 8, 8), "message_queue") == FUNNEL_COLORS["binding"]
