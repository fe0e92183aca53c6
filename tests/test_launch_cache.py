"""tiles.launch.CachedLaunch's key: it must change exactly when Triton would compile another kernel."""
import torch
from triton.runtime.jit import JITFunction

from tilecore.ops.hadamard import kernels
from tilecore.tiles.launch import CachedLaunch


def key_for(x, out, rows, n=256, **over):
    cfg = dict(N=n, S=4, N1=1, N2=64, B=32, IN_PIECES=1, MID_PIECES=2, MMA_DTYPE=kernels.tl.float16,
               PIECE_DTYPE=kernels.tl.bfloat16, GRID=132, TMA_LOAD=False, TMA_STORE=False, num_warps=8,
               num_stages=3) | over
    # The compiled (not interpreted) kernel, as on a GPU, whatever TRITON_INTERPRET says here.
    launcher = CachedLaunch(JITFunction(kernels.hadamard_kernel.fn))
    return launcher.key((x, out, rows, x.stride(0), out.stride(0), 0.5), cfg)


def test_key_orders_every_argument_and_specializes_like_triton():
    x = torch.randn(64, 256, dtype=torch.float16)
    out = torch.empty_like(x)
    key, ordered = key_for(x, out, 64)
    assert len(ordered) == len(kernels.hadamard_kernel.arg_names)
    assert key == key_for(torch.randn(128, 256, dtype=torch.float16), torch.empty(128, 256, dtype=torch.float16), 128)[0]
    assert key != key_for(x, out, 63)[0]  # rows no longer divisible by 16
    assert key != key_for(x, out, 1)[0]  # 1 is compiled in as a constant
    assert key != key_for(x.bfloat16(), out.bfloat16(), 64)[0]
    assert key != key_for(x, out, 64, MMA_DTYPE=kernels.tl.bfloat16)[0]
    assert key != key_for(x, out, 64, num_stages=2)[0]
    misaligned = torch.randn(64 * 256 + 1, dtype=torch.float16)[1:].view(64, 256)
    assert key != key_for(misaligned, out, 64)[0]


# ---- the fast path's errors, its fallback and its threads (no GPU: the JIT launch and the compiled
# kernel are stand-ins; the key is the real one, of a compiled-mode JITFunction)

import inspect  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402
import triton.language as tl  # noqa: E402

from tilecore.tiles import launch  # noqa: E402


def _tiny(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


class Compiled:
    """A compiled kernel's stand-in: Triton 3.6's runner(*args, stream=None), recording each launch;
    ``fail`` raises from the next launches (as a launch error would)."""

    def __init__(self, fail=None):
        self.calls = []
        self.fail = fail
        self.src = type("Src", (), {"signature": {p: None for p in inspect.signature(_tiny).parameters}})()

    def __getitem__(self, grid):
        def runner(*args, stream=None):
            self.calls.append((grid, args))
            if self.fail is not None:
                raise self.fail
        return runner


@pytest.fixture
def gpu_like(monkeypatch):
    """``gpu_like(compiled=None, delay=0)``: a CachedLaunch of _tiny whose launches take the fast path as
    on a GPU, its JIT launches recorded in ``.jit_calls`` and returning ``compiled`` (a new Compiled
    where None) after ``delay`` seconds."""
    monkeypatch.setattr(launch.dispatch, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    def make(compiled=None, delay=0.0, kernel=None):
        cached = launch.CachedLaunch(kernel or JITFunction(_tiny))
        cached.jit_calls = []

        def jit_launch(grid, args, kwargs):
            cached.jit_calls.append((grid, args, kwargs))
            time.sleep(delay)
            return compiled if compiled is not None else Compiled()
        monkeypatch.setattr(cached, "_jit_launch", jit_launch)
        return cached
    return make


def test_a_launch_error_propagates_once_and_the_fast_path_stays_on(gpu_like):
    compiled = Compiled()
    cached = gpu_like(compiled)
    x = torch.zeros(8)
    cached[(1,)](x, 8, BLOCK=8)  # the JIT launch that compiles
    assert len(cached.jit_calls) == 1 and compiled.calls == []
    compiled.fail = RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        cached[(2,)](x, 8, BLOCK=8)
    # launched once, on the fast path; not again through the JIT
    assert len(compiled.calls) == 1 and len(cached.jit_calls) == 1
    assert cached.fast
    compiled.fail = None
    cached[(3,)](x, 8, BLOCK=8)
    assert compiled.calls[-1][0] == (3, 1, 1) and len(cached.jit_calls) == 1


def test_an_error_of_the_first_launch_propagates_and_nothing_is_cached(gpu_like, monkeypatch):
    cached = gpu_like()
    x = torch.zeros(8)

    def broken(grid, args, kwargs):
        raise ValueError("compilation failed")
    monkeypatch.setattr(cached, "_jit_launch", broken)
    with pytest.raises(ValueError, match="compilation failed"):
        cached[(1,)](x, 8, BLOCK=8)
    assert cached.fast and len(cached.compiled) == 0


@pytest.mark.parametrize("problem", ["not compiled", "signature", "runner"])
def test_a_kernel_the_fast_path_cannot_call_launches_through_the_jit(gpu_like, problem):
    """What fast_path_problem finds, found before any fast launch: that kernel goes through the JIT
    from then on, each call launching once."""
    if problem == "not compiled":
        compiled = object()
    else:
        compiled = Compiled()
        if problem == "signature":  # a launcher without the constexprs
            compiled.src.signature = {"x_ptr": None, "n": None}
        else:  # a runner that takes a list, not the arguments
            compiled.__class__ = type("OtherRunner", (Compiled,), {"__getitem__": lambda self, grid: lambda args: None})
    cached = gpu_like(compiled)
    x = torch.zeros(8)
    for i in range(3):
        cached[(1,)](x, 8, BLOCK=8)
        assert len(cached.jit_calls) == i + 1
    assert not cached.fast and len(cached.compiled) == 0
    if problem != "not compiled":
        assert compiled.calls == []


def test_this_tritons_compiled_kernel_suits_the_fast_path():
    """fast_path_problem's picture of Triton's compiled kernel, against the real one (compiled for sm_90a
    without a GPU; only its driver handles, which need one, are left out)."""
    from tilecore.tiles.compile import compile_kernel

    x = torch.zeros(64)
    compiled = compile_kernel(JITFunction(_tiny), dict(x_ptr=x, n=64, BLOCK=64))
    compiled._init_handles = lambda: None
    assert launch.fast_path_problem(compiled, [x, 64, 64]) is None
    assert launch.fast_path_problem(compiled, [x, 64]) is not None


def test_tma_operand_has_every_field_of_gluons_tensor_descriptor():
    assert launch.tma_operand_problem() is None
    x = torch.zeros(64, 64, dtype=torch.float16)
    assert launch.fast_path_problem(Compiled(), [launch.TmaOperand(x, [64, 64]), 1, 2]) is None


def _race(count, target):
    """Run target(i) in ``count`` threads released together; their exceptions, re-raised here."""
    barrier = threading.Barrier(count)
    errors = []

    def run(i):
        try:
            barrier.wait()
            target(i)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread hangs"
    if errors:
        raise errors[0]


def test_first_fill_from_many_threads_compiles_once(gpu_like):
    compiled = Compiled()
    cached = gpu_like(compiled, delay=0.2)
    x = torch.zeros(8)
    _race(8, lambda i: cached[(i + 1,)](x, 8, BLOCK=8))
    # one JIT launch (the one that compiles), the other seven on the fast path: each call launched once
    assert len(cached.jit_calls) == 1
    assert sorted(g[0] for g, _ in compiled.calls) + [cached.jit_calls[0][0][0]] == sorted(range(1, 9))
    assert len(cached.compiled) == 1 and cached.fast


def test_first_setup_from_many_threads_loads_the_kernel_once(gpu_like):
    loads = []

    def loader():
        loads.append(1)
        time.sleep(0.2)
        return JITFunction(_tiny)
    cached = gpu_like(kernel=loader)
    keys = [None] * 8

    def first_key(i):
        keys[i] = cached.key((torch.zeros(8), 8), {"BLOCK": 8})[0]
    _race(8, first_key)
    assert len(loads) == 1 and len(set(keys)) == 1


def test_compiled_kernels_are_bounded_least_recently_used_first(gpu_like):
    cached = gpu_like()
    cached.compiled = launch.LRU(2)
    x = torch.zeros(8)
    for block in (8, 16, 8, 32):  # BLOCK is compiled in: three keys, 8 used again before 32 comes
        cached[(1,)](x, 8, BLOCK=block)
    assert len(cached.jit_calls) == 3 and len(cached.compiled) == 2
    cached[(1,)](x, 8, BLOCK=8)  # kept
    assert len(cached.jit_calls) == 3
    cached[(1,)](x, 8, BLOCK=16)  # dropped: compiled (found in Triton's cache) and kept again
    assert len(cached.jit_calls) == 4


def test_lru():
    cache = launch.LRU(3)
    for k in "abc":
        cache.put(k, k.upper())
    assert cache.get("a") == "A"  # a is now the most recent
    cache.put("d", "D")
    assert "b" not in cache and [cache.get(k) for k in "acd"] == ["A", "C", "D"] and len(cache) == 3
    assert cache.get("b", 0) == 0
    cache.put("e", "E")  # every entry used since: a fill still drops one (the one at the front), not the new one
    assert len(cache) == 3 and sum(k in cache for k in "acd") == 2 and cache.get("e") == "E"
    kept = next(k for k in "acd" if k in cache)
    cache.put(kept, "again")  # a key already there: replaced, nothing dropped
    assert len(cache) == 3 and cache.get(kept) == "again"
    with pytest.raises(ValueError):
        launch.LRU(0)


def test_lru_from_many_threads_stays_bounded():
    cache = launch.LRU(16)

    def churn(i):
        for n in range(2000):
            key = (i * 7 + n) % 40
            if cache.get(key) is None:
                cache.put(key, key)
            assert len(cache) <= 16
    _race(6, churn)
    assert len(cache) <= 16 and all(cache.get(k) in (None, k) for k in range(40))


def test_the_interpreter_runs_one_launch_at_a_time():
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run
    assert run._tilecore_serialized
    launch.serialize_interpreter()  # installed once
    assert InterpretedFunction.run is run


def test_tilecore_kernels_compile_with_the_users_ptxas(monkeypatch):
    """torch.compile sets TRITON_PTXAS_PATH to torch's ptxas in the process; a tilecore kernel's JIT
    launch runs with it set back to the user's value (here: unset, Triton's own), restored after, and
    other kernels' launches see Inductor's value."""
    import os
    import types

    from tilecore.tiles import launch

    from tilecore import dispatch

    inductor = os.path.join(os.path.dirname(torch.__file__), "bin", "ptxas")
    assert dispatch.inductor_ptxas(inductor)
    monkeypatch.setattr(dispatch, "_USER_PTXAS", None)
    monkeypatch.setenv("TRITON_PTXAS_PATH", inductor)
    run = launch.with_pinned_ptxas(lambda self, *a, **k: (os.environ.get("TRITON_PTXAS_PATH"), a, k))
    ours, theirs = types.SimpleNamespace(__module__="tilecore.ops.x"), types.SimpleNamespace(__module__="user")
    assert run(ours, 1, grid=(1,)) == (None, (1,), {"grid": (1,)})
    assert os.environ["TRITON_PTXAS_PATH"] == inductor
    assert run(theirs)[0] == inductor
    monkeypatch.setattr(dispatch, "_USER_PTXAS", "/opt/my/ptxas")
    assert run(ours)[0] == "/opt/my/ptxas" and os.environ["TRITON_PTXAS_PATH"] == inductor
    from triton.runtime.jit import JITFunction
    assert getattr(JITFunction.run, "_tilecore_ptxas", False)  # installed on import
