"""Shared stand-ins for the host-path tests (tests/host)."""
import torch

from tilecore.tiles import launch


def cpu_signature(*items, scalars=launch._KEY_SCALARS):
    """A CPU stand-in for an op's launch-key ``signature`` (which keys CUDA tensors only): tensors by shape, strides,
    dtype, device and 16-byte alignment, ``scalars`` as themselves, None for anything else (no key)."""
    out = []
    for t in items:
        if isinstance(t, torch.Tensor):
            out.append((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0))
        elif t is None or isinstance(t, scalars):
            out.append(t)
        else:
            return None
    return tuple(out)


def plain_signature(*items):
    """cpu_signature with the scalars the ops' own signature keys (bool, int, float, str)."""
    return cpu_signature(*items, scalars=(bool, int, float, str))


class Recorder:
    """A CachedLaunch's stand-in for a kernel the CPU cannot run (Gluon's): each launch's (key, grid, args, kwargs)
    in ``calls``, nothing launched. Its ``keyed`` stays empty, so a KeyedLaunch of it never binds: every launch goes
    through ``run``, recorded."""

    def __init__(self):
        self.calls = []
        self.keyed = launch.LRU(4)

    def run(self, key, grid, args, kwargs):
        self.calls.append((key, grid, args, kwargs))


def recorded(monkeypatch, module, name: str) -> Recorder:
    """``module.name`` (a CachedLaunch) replaced by a Recorder for the test; the Recorder."""
    recorder = Recorder()
    monkeypatch.setattr(module, name, recorder)
    return recorder


def clear_fft_conv() -> None:
    """fft_conv's host caches (checks, plans, recipes, launch parts, kept zeros), emptied."""
    from tilecore.ops.fft_conv import launch as conv_launch
    from tilecore.ops.fft_conv import op as fft_op
    for cache in (fft_op._CHECKED, fft_op._PLANS, fft_op._GLUON_CONVS, conv_launch._GLUON_LAUNCHES, fft_op._ZEROS):
        cache.clear()


def fft_conv_on_gluon(monkeypatch, signature=plain_signature, plans: list | None = None) -> Recorder:
    """fft_conv on the CPU as on the H100 at seqlen 1024 (its Gluon kernel cannot be interpreted): the kernel's
    launches recorded (the Recorder returned), 4 SMs, plan() the Gluon one-pass plan (each call's n appended to
    ``plans`` where given), the op's signature ``signature``, its caches emptied."""
    from tilecore import dispatch
    from tilecore.ops.fft_conv import launch as conv_launch
    from tilecore.ops.fft_conv import op as fft_op
    from tilecore.ops.fft_conv import plan as conv_plan
    recorder = recorded(monkeypatch, conv_launch, "CONV_GLUON")
    monkeypatch.setattr(dispatch, "num_sms", lambda device: 4)
    gluon = conv_plan.gluon_plan(32, 64, 3, True, True, 0, True)
    monkeypatch.setattr(fft_op, "plan", lambda n, device, dtype: gluon if plans is None else plans.append(n) or gluon)
    monkeypatch.setattr(fft_op, "signature", signature)
    clear_fft_conv()
    return recorder


def varlen_on_gluon(monkeypatch) -> Recorder:
    """attention_varlen's Gluon forward on the CPU (132 SMs): its launches recorded (the Recorder returned); the work
    table's tl kernel interpreted."""
    from tilecore.ops.attention_varlen import op as varlen_op
    recorder = recorded(monkeypatch, varlen_op, "GLUON_VARLEN_FWD")
    monkeypatch.setattr(varlen_op.dispatch, "num_sms", lambda device: 132)
    return recorder


def fp8_on_gluon(monkeypatch) -> Recorder:
    """attention_fp8's Gluon forward on the CPU: its launches recorded (the Recorder returned), a 7-program tiling."""
    from tilecore.ops.attention_fp8 import launch as fp8_launch
    recorder = recorded(monkeypatch, fp8_launch, "GLUON_FWD")
    monkeypatch.setattr(fp8_launch, "_tiling", lambda q, k, rows, block_n, causal: ((7,), 2, None))
    return recorder


class Kept:
    """A KeyedLaunch stand-in whose launches go the kept way (KeyedLaunch.all_kept and kept() say so): records each
    launch's arguments in ``calls`` (and counts it in ``counts["launch"]`` where a dict is given), launches nothing."""

    def __init__(self, counts: dict | None = None):
        self.calls, self.counts = [], counts

    @property
    def _hit(self):  # (KeyedLaunch.all_kept reads a kept launch's device there)
        return (launch._current_cuda_device(),)

    def kept(self):
        return True

    def __call__(self, args):
        self.calls.append(args)
        if self.counts is not None:
            self.counts["launch"] += 1


def served_calls(monkeypatch, recipe_class, caches):
    """A fixture's body for a recipe class's tests: ``caches`` emptied before and after, and the list that each call
    of a ``recipe_class`` instance appends to (``recipe_class.__call__`` wrapped for the test)."""
    for cache in caches:
        cache.clear()
    calls = []
    call = recipe_class.__call__
    monkeypatch.setattr(recipe_class, "__call__", lambda self, *args: calls.append(1) or call(self, *args))
    yield calls
    for cache in caches:
        cache.clear()
