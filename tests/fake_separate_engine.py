"""A test engine whose ``start`` spawns a child process, as vLLM's engine core does (``separate_engine_processes``):
``tests/test_cpu_affinity.py`` checks that the replica's front end moves off the rollout core and the child stays. It
generates nothing."""

import subprocess
import sys


class FakeSeparateProcessEngine:
    separate_engine_processes = True

    def __init__(self, **kwargs):
        self.child = None

    async def start(self) -> None:
        self.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
