"""asyncrl.compute_thread: a process's torch maths on one thread (one OpenMP team), engine and trainer alike."""

import asyncio
import contextvars
import threading
import time

import pytest

from asyncrl.compute_thread import run_compute
from asyncrl.rollout.base import SamplingParams

TAG = contextvars.ContextVar("TAG", default="unset")


def test_calls_run_one_at_a_time_on_one_named_thread():
    seen, running, peak = [], [0], [0]

    def work(i):
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        time.sleep(0.01)
        seen.append((threading.current_thread().name, TAG.get()))
        running[0] -= 1
        return i * i

    def boom():
        raise ValueError("inside the compute thread")

    async def main():
        TAG.set("caller's")  # to_thread's contract: the caller's context variables go with the call
        out = await asyncio.gather(*(run_compute(work, i) for i in range(6)))
        with pytest.raises(ValueError, match="inside the compute thread"):
            await run_compute(boom)
        return out, await run_compute(work, 7)  # the thread survives a failed call

    out, last = asyncio.run(main())
    assert out == [i * i for i in range(6)] and last == 49
    assert peak[0] == 1  # queued behind each other, never two at once
    names = {n for n, _ in seen}
    assert len(names) == 1 and names.pop().startswith("asyncrl-compute") and {t for _, t in seen} == {"caller's"}
    # a second event loop (a script's next asyncio.run) reuses the same thread
    assert asyncio.run(run_compute(lambda: threading.current_thread().name)).startswith("asyncrl-compute")
    assert sum(t.name.startswith("asyncrl-compute") for t in threading.enumerate()) == 1


def test_hf_engine_steps_and_trainer_updates_share_the_compute_thread(random_model_dir):
    """The two torch users of a colocated CPU trainer process: the hf engine's decode steps and the
    trainer's update both run on the one compute thread, not on whichever executor thread is free."""
    from asyncrl.rollout.hf_backend import HFEngine
    from asyncrl.rollout.hf_batch import ContinuousBatcher
    from test_fit_step import _cfg, _trainer
    from fake_queue import fake_samples

    threads: set[str] = set()
    step = ContinuousBatcher.step

    def spy(self, *a, **k):
        threads.add(threading.current_thread().name)
        return step(self, *a, **k)

    async def generate():
        eng = HFEngine(model_path=str(random_model_dir), max_num_seqs=4, max_model_len=64)
        await eng.start()
        try:
            sp = SamplingParams(max_tokens=5, temperature=1.0, ignore_eos=True)
            return await asyncio.gather(*(eng.generate(f"r{i}", [5, 6, 7], sp) for i in range(6)))
        finally:
            await eng.shutdown()

    ContinuousBatcher.step = spy
    try:
        outs = asyncio.run(generate())
    finally:
        ContinuousBatcher.step = step
    assert [len(o.token_ids) for o in outs] == [5] * 6
    engine_threads = set(threads)

    cfg = _cfg("grpo", random_model_dir)
    trainer = _trainer(cfg, fake_samples(8, cfg.actor_rollout_ref.rollout.n))
    update, threads = trainer._update, set()

    def update_spy(batch):
        threads.add(threading.current_thread().name)
        return update(batch)

    trainer._update = update_spy
    assert asyncio.run(trainer.fit_step())
    assert len(engine_threads) == 1 and engine_threads == threads, (engine_threads, threads)
    assert threads.pop().startswith("asyncrl-compute")
