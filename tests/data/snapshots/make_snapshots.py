"""Regenerate the synthetic status snapshots used by tests/test_widgets.py.

Shapes follow ``Experiment.status_async()`` (rollouter.snapshot, trainer.status, QueueStats,
RequestLoadBalancer.snapshot, SampleBudget) as JSON would carry them (int dict keys become str,
tuples become lists). Run: ``python tests/data/snapshots/make_snapshots.py``.
"""

import json
import math
import re
from pathlib import Path

HERE = Path(__file__).parent
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def tokenize(text: str) -> list[str]:
    """Character-level like the embedded tokenizer, special markers as single tokens."""
    pat = "(" + "|".join(re.escape(s) for s in SPECIAL) + ")"
    out = []
    for part in re.split(pat, text):
        out.extend([part] if part in SPECIAL else list(part))
    return out


def ids(tokens: list[str]) -> list[int]:
    return [1000 + SPECIAL.index(t) if t in SPECIAL else ord(t) for t in tokens]


def trajectory(uid, segments, prompt, reward, versions_by_segment, min_v, max_v):
    """segments: [(text, mask)]; versions_by_segment: version per model segment (mask 1)."""
    r_tok, mask, lps, vers = [], [], [], []
    k = 0
    for text, m in segments:
        toks = tokenize(text)
        v = versions_by_segment[k] if m else None
        for j, _ in enumerate(toks):
            r_tok.append(toks[j])
            mask.append(m)
            lps.append(round(-0.05 - 0.9 * ((j * 7) % 5) / 4, 3) if m else 0.0)
            vers.append(v if m else None)
        k += m
    vers = [v if v is not None else (min_v) for v in vers]
    p_tok = tokenize(prompt)
    return {"uid": uid, "index": 3, "reward": reward, "num_turns": 1 + sum(1 for _, m in segments if m),
            "prompt_ids": ids(p_tok), "response_ids": ids(r_tok), "response_mask": mask,
            "response_logprobs": lps, "response_versions": vers,
            "prompt_tokens": p_tok, "response_tokens": r_tok, "min_global_steps": min_v, "max_global_steps": max_v}


def history(steps):
    rows = []
    for s in range(1, steps + 1):
        rows.append({"step": s, "param_version": s, "time_s": 4.0 * s, "reward/mean": round(0.2 + 0.6 * (1 - math.exp(-s / 4)), 4),
                     "actor/pg_loss": round(0.1 * math.exp(-s / 3) - 0.01, 4), "trainer/idle_ratio": round(0.6 - 0.03 * s, 3),
                     "staleness/lag_mean": 0.4, "staleness/lag_max": 1.0, "rollouter/partial_count": 1})
    return rows


def base(state="running", steps=6):
    return {
        "state": state, "name": "arith_grpo_cpu__0__20261130-052000", "elapsed_s": 4.0 * steps + 1.5,
        "rollouter": {"param_version": steps, "staleness_samples": 9, "paused": False, "pending_queue": 12,
                      "pending_queue_max": 12, "active_tasks": 5, "max_concurrent_samples": 8,
                      "max_required_samples": 12, "required_samples": 4, "idle_ratio": 0.21,
                      "accounting": {"taken": 60, "enqueued": 36, "pending": 12, "active": 5, "dropped": {}, "failed": {}},
                      "eval_history": [{"version": 0, "accuracy": 0.1, "n": 32, "time": 1.0, "eval_s": 0.5},
                                       {"version": 3, "accuracy": 0.35, "n": 32, "time": 13.0, "eval_s": 0.5},
                                       {"version": 6, "accuracy": 0.5, "n": 32, "time": 25.0, "eval_s": 0.5}],
                      "partial_spans": [[1, 2], [2, 3], [3, 3], [4, 6], [5, 6]], "recent": []},
        "trainer": {"global_steps": steps, "param_version": steps, "trained": 24, "dropped": {}, "idle_ratio": 0.42,
                    "done": state == "done", "error": None, "lag_counts": {"0": 700, "1": 250, "2": 50},
                    "staleness_bound": 2, "history": history(steps)},
        "message_queue": {"size": 4, "maxsize": 12, "puts": 36, "gets": 32, "drops": 0, "drop_reasons": {},
                          "waiting_getters": 0, "waiting_putters": 0, "shutdown": False},
        "load_balancer": {"in_flight": {"replica_0": 10, "replica_1": 6}, "total_in_flight": 16,
                          "sticky_entries": 40, "sticky_hits": 3, "invalidations": 0},
        "budget": {"required_samples": 4, "max_required_samples": 12, "max_concurrent_samples": 8, "staleness_bound": 2},
    }


def main():
    multi = trajectory(
        "a1b2c3d4e5f6",
        [("<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": \"17*3\"}}\n</tool_call><|im_end|>", 1),
         ("\n<|im_start|>user\n<tool_response>\n51\n</tool_response><|im_end|>\n<|im_start|>assistant\n", 0),
         ("The answer is 51.<|im_end|>", 1)],
        "<|im_start|>user\nWhat is 17*3?<|im_end|>\n<|im_start|>assistant\n", 1.0, [4, 5], 4, 5)
    single = trajectory("0f0f0f0f0f0f", [("#### 42<|im_end|>", 1)],
                        "<|im_start|>user\n40+2=?<|im_end|>\n<|im_start|>assistant\n", 0.0, [6], 6, 6)

    mq_bound = base()
    mq_bound["rollouter"].update(staleness_samples=12, active_tasks=3)
    mq_bound["message_queue"]["size"] = 12
    mq_bound["trajectories"] = [single, multi]

    active_bound = base()
    active_bound["rollouter"].update(active_tasks=8, staleness_samples=10)

    early = base(steps=0)
    early["rollouter"].update(staleness_samples=0, active_tasks=0, pending_queue=0, idle_ratio=0.0,
                              partial_spans=[], eval_history=[])
    early["trainer"].update(lag_counts={}, history=[], trained=0)
    early["message_queue"]["size"] = 0
    early["load_balancer"]["in_flight"] = {"replica_0": 0, "replica_1": 0}

    pools = base()
    pools["rollouter"]["agent_loop_workers"] = {"busy": 4, "total": 4}
    pools["rollouter"]["sandboxes"] = {"active": 2, "limit": 6}
    pools["load_balancer"]["max_in_flight_per_server"] = 16

    done = base(state="done", steps=8)
    done["trajectories"] = [multi]

    for name, snap in {"mq_bound": mq_bound, "active_bound": active_bound, "early": early,
                       "pools": pools, "done": done}.items():
        (HERE / f"{name}.json").write_text(json.dumps(snap, indent=1))


if __name__ == "__main__":
    main()
