"""The distributed tests' process pool (cp_pool.py), started once for the session."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # cp_pool and cp_jobs, here and in the spawned workers


@pytest.fixture(scope="session")
def pool():
    import cp_pool

    started = cp_pool.Pool()
    yield started
    started.close()
