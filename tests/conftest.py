"""Kernel tests run on the CPU through Triton's interpreter; it must be on before triton.jit runs."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


class FakeCompiled:
    """A compiled kernel's stand-in: records each launch's 3-D grid and arguments."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        assert len(grid) == 3
        return lambda *args: self.calls.append((grid, args))


@pytest.fixture
def fast_launch(monkeypatch):
    """``fast_launch(cached_launch)``: make a tiles.launch.CachedLaunch take its fast path without a
    GPU (as if each kernel were compiled already) and return the FakeCompiled that records it."""
    from tilecore.tiles import launch

    def take(cached):
        fake = FakeCompiled()
        monkeypatch.setattr(launch.dispatch, "interpreter_enabled", lambda: False)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(cached, "compiled", type("Compiled", (dict,), {"get": lambda self, key: fake})())
        return fake
    return take
