"""GlobalRequestLoadBalancer: stickiness, least in-flight, invalidation, empty pool, counts back to 0."""

import asyncio

import pytest

from asyncrl.rollout.load_balancer import (
    GlobalRequestLoadBalancer,
    NoServerAvailableError,
    RequestLoadBalancer,
    stable_hash,
)


def lb3(**kw):
    return RequestLoadBalancer({"r0": "h0", "r1": "h1", "r2": "h2"}, **kw)


def test_sticky_hit_returns_same_server_and_counts():
    lb = lb3()
    sid, h = lb.acquire_server("a")
    lb.acquire_server("b")  # a different session goes elsewhere (least loaded)
    assert lb.acquire_server("a") == (sid, h)
    assert lb.snapshot()["in_flight"][sid] == 2 and lb.snapshot()["sticky_hits"] == 1


def test_least_loaded_choice_for_new_sessions():
    lb = lb3()
    got = [lb.acquire_server(f"s{i}")[0] for i in range(3)]
    assert sorted(got) == ["r0", "r1", "r2"]
    lb.release_server("r1", "s1")
    assert lb.acquire_server("new")[0] == "r1"


def test_removal_invalidates_stickiness_lazily_and_batch_add():
    lb = lb3()
    sid, _ = lb.acquire_server("a")
    lb.release_server(sid, "a")
    lb.remove_servers([sid])
    sid2, _ = lb.acquire_server("a")
    assert sid2 != sid and lb.snapshot()["invalidations"] == 1
    assert lb.acquire_server("a")[0] == sid2  # sticky to the new server from now on
    lb.add_servers({"r9": "h9", "r8": "h8"})
    assert set(lb.snapshot()["in_flight"]) == {"r0", "r1", "r2", "r8", "r9"} - {sid}


def test_empty_pool_errors_clearly():
    lb = RequestLoadBalancer()
    with pytest.raises(NoServerAvailableError, match="no rollout server"):
        lb.acquire_server("x")
    lb.add_servers({"r0": 0})
    lb.remove_servers(["r0"])
    with pytest.raises(NoServerAvailableError):
        lb.acquire_server("x")


def test_lru_is_bounded():
    lb = lb3(max_cache_size=2)
    for r in ("a", "b", "c"):
        lb.acquire_server(r)
    assert lb.snapshot()["sticky_entries"] == 2


def test_determinism_tie_break_is_stable_hash():
    ids = [f"req-{i}" for i in range(20)]
    plain = [lb3().acquire_server(r)[0] for r in ids]
    assert set(plain) == {"r0"}  # ties go to the first server
    det = [lb3(full_determinism=True).acquire_server(r)[0] for r in ids]
    assert det == [["r0", "r1", "r2"][stable_hash(r) % 3] for r in ids]
    assert len(set(det)) > 1
    assert stable_hash("abc") == 0xBA7816BF8F01CFEA  # sha256 prefix: same in every process


def test_in_flight_returns_to_zero_after_requests_that_raise():
    lb = lb3()

    async def request(i):
        sid, _ = lb.acquire_server(f"s{i % 5}")
        try:
            await asyncio.sleep(0.001 * (i % 3))
            if i % 2:
                raise RuntimeError("engine died")
        finally:
            lb.release_server(sid, f"s{i % 5}")

    async def main():
        return await asyncio.gather(*(request(i) for i in range(40)), return_exceptions=True)

    results = asyncio.run(main())
    assert sum(isinstance(r, RuntimeError) for r in results) == 20
    assert lb.snapshot()["total_in_flight"] == 0
    lb.release_server("r0", "s0")  # an extra release never goes negative
    lb.release_server("gone", "s1")  # releasing a removed server is ignored
    assert min(lb.snapshot()["in_flight"].values()) == 0


def test_bookkeeping_is_keyed_by_request_across_remove_and_re_add(caplog):
    """Issue 12 item 4: A starts on r0; r0 is removed and re-added under the same id; B and C start,
    one per replica; A finishes. A's lease belonged to r0's old incarnation, so it must not take
    a count from B: expected {r0: 1, r1: 1}, and B's later release matches its acquire."""
    lb = RequestLoadBalancer({"r0": "h0", "r1": "h1"})
    assert lb.acquire_server("A")[0] == "r0"
    lb.remove_servers(["r0"])
    lb.add_servers({"r0": "h0-restarted"})
    placed = {rid: lb.acquire_server(rid)[0] for rid in ("B", "C")}
    assert sorted(placed.values()) == ["r0", "r1"]
    with caplog.at_level("WARNING", logger="asyncrl.rollout.load_balancer"):
        lb.release_server("r0", "A")
        assert lb.snapshot()["in_flight"] == {"r0": 1, "r1": 1}
        for rid, sid in placed.items():
            lb.release_server(sid, rid)
    assert "without a matching acquire" not in caplog.text
    snap = lb.snapshot()
    assert snap["in_flight"] == {"r0": 0, "r1": 0} and snap["open_leases"] == 0 and snap["stale_releases"] == 1
    # A is no longer sticky to the restarted r0 (its KV cache is gone): it is routed afresh
    assert lb.acquire_server("A") and lb.snapshot()["invalidations"] == 1


def test_release_without_acquire_is_reported_and_harmless(caplog):
    lb = lb3()
    sid, _ = lb.acquire_server("a")
    with caplog.at_level("WARNING", logger="asyncrl.rollout.load_balancer"):
        lb.release_server(sid, "never-acquired")
        lb.release_server("r2", "a")  # right request, wrong server
    assert caplog.text.count("without a matching acquire") == 2
    assert lb.snapshot()["in_flight"][sid] == 1
    lb.release_server(sid, "a")
    assert lb.snapshot()["total_in_flight"] == 0


def test_concurrent_leases_of_one_request_id_are_counted_separately():
    lb = lb3()
    s1, _ = lb.acquire_server("x")
    s2, _ = lb.acquire_server("x")  # sticky: the same server twice
    assert s1 == s2 and lb.snapshot()["in_flight"][s1] == 2
    lb.release_server(s1, "x")
    lb.release_server(s1, "x")
    assert lb.snapshot()["total_in_flight"] == 0 and lb.snapshot()["open_leases"] == 0


def test_ray_actor_wrapper():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()  # reuse a session another test module started
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        lb = GlobalRequestLoadBalancer({"r0": "h0", "r1": "h1"}, full_determinism=True)
        sid, h = lb.acquire_server("a")
        assert h == {"r0": "h0", "r1": "h1"}[sid]

        async def flow():
            assert await lb.acquire_server_async("a") == (sid, h)
            with pytest.raises(ValueError):
                async with lb.server("b"):
                    raise ValueError("boom")
            await lb.release_server_async(sid, "a")
            return await lb.snapshot_async()

        snap = asyncio.run(flow())
        assert snap["in_flight"][sid] == 1
        lb.release_server(sid, "a")
        assert lb.snapshot()["total_in_flight"] == 0
        lb.remove_servers(["r0", "r1"])
        with pytest.raises(NoServerAvailableError):
            lb.acquire_server("c")
        lb.shutdown()
    finally:
        if started:
            ray.shutdown()
