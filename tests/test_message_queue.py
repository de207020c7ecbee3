"""MessageQueue actor: bounds, FIFO order, refs not copies, shutdown waking a blocked getter."""

import asyncio
import time

import pytest
import ray

from asyncrl.message_queue import MessageQueue, QueueShutdown


@pytest.fixture(scope="module")
def ray_up(ray_session):
    yield


def test_fifo_and_stats(ray_up):
    q = MessageQueue(maxsize=4)
    for i in range(3):
        assert q.put_sample(ray.put({"i": i}))
    assert q.stats().size == 3
    got = q.get_samples(2)
    assert [g["i"] for g in got] == [0, 1]
    s = q.stats()
    assert (s.size, s.puts, s.gets, s.drops) == (1, 3, 2, 0)
    q.shutdown()


def test_bound_blocks_producer(ray_up):
    q = MessageQueue(maxsize=2)
    q.put_sample(ray.put(1))
    q.put_sample(ray.put(2))
    assert q.put_sample(ray.put(3), timeout=0.3) is False  # full: the put waited and gave up
    assert q.stats().size == 2
    q.get_samples(1)
    assert q.put_sample(ray.put(3), timeout=2.0) is True
    assert q.get_samples(2) == [2, 3]
    q.shutdown()


def test_get_waits_for_full_batch(ray_up):
    q = MessageQueue(maxsize=8)
    q.put_sample(ray.put("a"))
    assert q.get_samples(2, timeout=0.3) is None  # never a partial batch
    q.put_sample(ray.put("b"))
    assert q.get_samples(2, timeout=2.0) == ["a", "b"]
    q.shutdown()


def test_shutdown_wakes_blocked_getter_and_counts_drops(ray_up):
    q = MessageQueue(maxsize=8)
    waiter = q.actor.get_samples.remote(5)  # blocks: only 1 item will come
    q.put_sample(ray.put("x"))
    time.sleep(0.3)
    t0 = time.time()
    left = q.shutdown()
    assert ray.get(waiter, timeout=10) is None
    assert time.time() - t0 < 5
    assert left == 1
    st = q.stats()
    assert st.shutdown and st.drops == 1 and st.drop_reasons == {"unconsumed_at_shutdown": 1}
    with pytest.raises(ray.exceptions.RayTaskError) as err:
        q.put_sample(ray.put("late"))
    assert isinstance(err.value.as_instanceof_cause(), QueueShutdown)


def test_payload_travels_as_ref(ray_up):
    import numpy as np
    q = MessageQueue(maxsize=2)
    big = np.arange(2_000_000, dtype=np.int64)  # 16 MB: stored once in the object store
    ref = ray.put(big)
    q.put_sample(ref)
    # the actor holds the ref itself, not a copy of the payload
    inner = ray.get(q.actor.get_samples.remote(1))[0][0]
    assert isinstance(inner, ray.ObjectRef) and inner == ref
    assert (ray.get(inner) == big).all()
    q.shutdown()


def test_async_api(ray_up):
    q = MessageQueue(maxsize=3)

    async def main():
        await q.put_sample_async(ray.put(7))
        return await q.get_samples_async(1)

    assert asyncio.run(main()) == [7]
    q.shutdown()


def test_put_payload_sends_a_small_sample_inline_and_a_large_one_through_the_object_store(ray_up):
    """A group of short responses is pickled into the put call (the actor holds the bytes: no ray.put per group);
    one over INLINE_MAX_BYTES is put once and the actor holds its ref. Either way the consumer gets the sample."""
    import numpy as np

    from asyncrl.message_queue import INLINE_MAX_BYTES, PickledSample

    q = MessageQueue(maxsize=4)
    small = {"group": [1, 2, 3]}
    large = {"ids": np.arange(INLINE_MAX_BYTES // 8 + 1000, dtype=np.int64)}  # just over the limit, pickled

    async def main():
        await q.put_payload_async(small)
        await q.put_payload_async(large)
        held = [w[0] for w in await q.actor.get_samples.remote(2)]
        await q.put_payload_async(small)
        await q.put_payload_async(large)
        return held, await q.get_samples_async(2)

    held, got = asyncio.run(main())
    assert isinstance(held[0], PickledSample) and held[0].load() == small
    assert isinstance(held[1], ray.ObjectRef) and (ray.get(held[1]).load()["ids"] == large["ids"]).all()
    assert got[0] == small and (got[1]["ids"] == large["ids"]).all()
    assert q.get_samples(1, timeout=0.2) is None  # both consumed
    q.shutdown()


def test_sync_get_samples_unpickles_inline_samples_and_fetches_refs(ray_up):
    q = MessageQueue(maxsize=3)
    asyncio.run(q.put_payload_async({"uid": "a"}))
    q.put_sample(ray.put({"uid": "b"}))
    assert q.get_samples(2) == [{"uid": "a"}, {"uid": "b"}]
    q.shutdown()


def test_an_unpicklable_sample_raises_at_the_producer_and_enqueues_nothing(ray_up):
    import threading

    q = MessageQueue(maxsize=2)
    with pytest.raises(TypeError):
        asyncio.run(q.put_payload_async({"lock": threading.Lock()}))
    assert q.stats().puts == 0
    q.shutdown()


def test_an_in_process_queue_hands_over_the_object_itself(monkeypatch):
    """trainer/hybrid_rollout.in_process_queue: producer and consumer in the queue's process; the consumer gets
    the producer's object (no ray.put, no copy), with the actor body's bound, FIFO, counters and shutdown."""
    import asyncrl.message_queue as mq_mod
    from asyncrl.trainer.hybrid_rollout import in_process_queue

    def no_put(*_, **__):
        raise AssertionError("an in-process queue must not ray.put")

    monkeypatch.setattr(mq_mod.ray, "put", no_put)
    q = in_process_queue(2)
    a, b, c = {"uid": "a"}, {"uid": "b"}, {"uid": "c"}

    async def main():
        await q.put_payload_async(a)
        await q.put_payload_async(b)
        assert await q.put_payload_async(c, timeout=0.05) is False  # full
        got = await q.get_samples_async(2)
        await q.put_payload_async(c)
        assert await q.shutdown_async() == 1  # c: unconsumed
        with pytest.raises(QueueShutdown):
            await q.put_payload_async(c)
        return got, await q.stats_async()

    got, st = asyncio.run(main())
    assert got[0] is a and got[1] is b
    assert (st.puts, st.gets, st.shutdown) == (3, 2, True) and st.drop_reasons == {"unconsumed_at_shutdown": 1, "queue_shutdown": 1}


class _LoadsBadly:
    """Pickles fine, raises when unpickled (a class the consumer cannot rebuild)."""

    seq = 7

    def __reduce__(self):
        return (_refuse, ())


def _refuse():
    raise RuntimeError("cannot load")


def test_a_sample_that_cannot_be_unpickled_comes_back_as_unreadable_and_the_rest_of_the_get_as_usual(ray_up):
    from asyncrl.message_queue import UnreadableSample

    q = MessageQueue(maxsize=3)

    async def main():
        await q.put_payload_async({"uid": "a"})
        await q.put_payload_async(_LoadsBadly())
        await q.put_payload_async({"uid": "c"})
        return await q.get_samples_async(3)

    got = asyncio.run(main())
    assert got[0] == {"uid": "a"} and got[2] == {"uid": "c"}
    assert isinstance(got[1], UnreadableSample) and got[1].seq == 7 and "cannot load" in got[1].error
    q.shutdown()


def test_a_sample_holding_a_ray_ref_goes_through_rays_serializer_so_its_object_is_freed(ray_up):
    """Pickled outside Ray's serializer a ref would pin its object forever; such a sample takes ray.put's path."""
    import gc

    import numpy as np
    from ray._private.internal_api import memory_summary

    q = MessageQueue(maxsize=2)
    inner = ray.put(np.ones(1_000_000))
    inner_hex = inner.hex()

    async def main():
        await q.put_payload_async({"ref": inner})
        return [w[0] for w in await q.actor.get_samples.remote(1)]

    held = asyncio.run(main())
    assert isinstance(held[0], ray.ObjectRef)  # ray.put of the sample, not the inline bytes
    assert (ray.get(ray.get(held[0])["ref"]) == 1).all()
    del held, inner
    gc.collect()
    gcs = ray.get_runtime_context().gcs_address  # this test's cluster: another on the machine (a second pytest
    for _ in range(100):  # worker's) made the default lookup refuse; the owner frees it once no reference is left
        if inner_hex not in memory_summary(address=gcs, stats_only=False):
            break
        time.sleep(0.1)
    assert inner_hex not in memory_summary(address=gcs, stats_only=False)
    q.shutdown()
