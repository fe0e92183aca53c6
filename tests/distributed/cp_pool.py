"""A pool of gloo processes for the distributed tests: started once (spawned; importing torch costs
seconds a process), each test sends every rank a job (a function of cp_jobs.py by name) and gets
every rank's result, or an AssertionError with the failing ranks' tracebacks.

Ranks 0..WORLD-1 form the default group; cp_jobs' groups give the 2-rank cases a subgroup of ranks
0 and 1 (rank 2 sits those out). The workers start under TRITON_INTERPRET=1 (the tests' setting),
so a job may run tilecore's Triton kernels in the interpreter or, turning it off, torch's CPU ones.
"""
from __future__ import annotations

import multiprocessing as mp
import queue
import socket
import time

import cp_jobs

WORLD = 3
START_TIMEOUT_S = 120
JOB_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Pool:
    """``run`` sends a job to every rank; after a failed or timed-out job (which may leave ranks out of
    step in their collectives) the processes are replaced before the next."""

    def __init__(self, world: int = WORLD):
        self.world = world
        self.procs = []
        self._start()

    def _start(self) -> None:
        world = self.world
        ctx = mp.get_context("spawn")
        self.jobs = [ctx.Queue() for _ in range(world)]
        self.results = ctx.Queue()
        port = free_port()
        self.procs = [ctx.Process(target=cp_jobs.serve, args=(rank, world, port, self.jobs[rank], self.results),
                                  daemon=True) for rank in range(world)]
        for p in self.procs:
            p.start()
        self.broken = False
        self._collect("ready", START_TIMEOUT_S)

    def _collect(self, what: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        got, failures = {}, []
        self.broken = True  # until every rank has answered well
        while len(got) < self.world:
            left = deadline - time.monotonic()
            try:
                rank, ok, value = self.results.get(timeout=max(left, 0.01))
            except queue.Empty:
                dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
                raise AssertionError(f"{what}: ranks {sorted(set(range(self.world)) - set(got))} gave no result "
                                     f"within {timeout} s (dead processes: {dead})") from None
            got[rank] = value
            if not ok:
                failures.append(f"--- rank {rank} ---\n{value}")
        if failures:
            raise AssertionError(f"{what} failed:\n" + "\n".join(failures))
        self.broken = False
        return got

    def run(self, job: str, timeout: float = JOB_TIMEOUT_S, **kwargs) -> dict:
        """Every rank's result of cp_jobs.<job>(rank, **kwargs) (rank -> result)."""
        if self.broken:
            self.close()
            self._start()
        for q in self.jobs:
            q.put((job, kwargs))
        return self._collect(job, timeout)

    def close(self) -> None:
        for q in self.jobs:
            q.put(None)
        for p in self.procs:
            p.join(timeout=1 if self.broken else 10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
