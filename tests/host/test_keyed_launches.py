"""Session 31's kept keyed launches (issue 31's host time): tiles.launch.KeyedLaunch, a kernel's launches under one
launch key whose compiled kernel, grid and constexpr tail are kept after the key's first launches, and the ops'
per-key launch recipes built on it (attention's split-key decode). A KeyedLaunch hit must hand the compiled kernel
exactly the arguments CachedLaunch.run's keyed hit hands it; a recipe must launch what the general path launches."""
import inspect

import pytest
import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

from tilecore.ops.attention_decode import launch as decode_launch
from tilecore.ops.attention import op as attention_op
from tilecore.tiles import launch
from tilecore.tiles.launch import CachedLaunch, KeyedLaunch, TmaOperand
from host_testing import Kept, clear_fft_conv, cpu_signature, fft_conv_on_gluon, fp8_on_gluon, varlen_on_gluon


def _tiny(x_ptr, n, y_ptr, BLOCK: tl.constexpr, FLAG: tl.constexpr = False):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


class Compiled:
    """A compiled kernel's stand-in (Triton 3.6's runner(*args, stream=None)), recording each launch."""

    def __init__(self):
        self.calls = []
        self.src = type("Src", (), {"signature": {p: None for p in inspect.signature(_tiny).parameters}})()

    def __getitem__(self, grid):
        def runner(*args, stream=None):
            self.calls.append((grid, args))
        return runner


@pytest.fixture
def gpu_like(monkeypatch):
    """A CachedLaunch of _tiny launching as on a GPU: its one JIT launch recorded and giving ``compiled``."""
    monkeypatch.setattr(launch.dispatch, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    compiled = Compiled()
    cached = CachedLaunch(JITFunction(_tiny))
    cached.jit_calls = []

    def jit_launch(grid, args, kwargs):
        cached.jit_calls.append((grid, args, kwargs))
        return compiled
    monkeypatch.setattr(cached, "_jit_launch", jit_launch)
    yield cached, compiled
    launch.bind_keyed_launches(True)


def test_a_kept_launch_hands_the_compiled_kernel_what_the_keyed_hit_does(gpu_like):
    cached, compiled = gpu_like
    bound = KeyedLaunch(cached, ("call", 1), (3,), dict(BLOCK=16, num_warps=2))
    x, y = torch.zeros(16), torch.zeros(16)
    bound((x, 16, y))  # the key's first launch: the JIT (checked), kept by the key
    assert len(cached.jit_calls) == 1 and compiled.calls == []
    assert bound._hit and bound._hit[1] == 3
    x2, y2 = torch.ones(16), torch.ones(16)
    bound((x2, 16, y2))  # kept: no lookup, the grid and constexprs as kept
    launch.bind_keyed_launches(False)
    bound((x2, 16, y2))  # the same launch through CachedLaunch.run's keyed hit
    assert len(compiled.calls) == 2 and len(cached.jit_calls) == 1
    (grid_kept, args_kept), (grid_run, args_run) = compiled.calls
    assert grid_kept == grid_run == (3, 1, 1)
    assert args_kept == args_run and args_kept[0] is x2 and args_kept[2] is y2
    assert list(args_kept) == cached.key((x2, 16, y2), dict(BLOCK=16, num_warps=2))[1]  # Triton's order, defaults in


def test_a_launch_on_another_device_or_with_other_arguments_goes_the_keyed_way(gpu_like, monkeypatch):
    cached, compiled = gpu_like
    bound = KeyedLaunch(cached, ("call", 2), (1,), dict(BLOCK=16))
    x = torch.zeros(16)
    bound((x, 16, x))
    bound((x, 16, x))
    assert len(compiled.calls) == 1
    runs = []
    run = cached.run
    monkeypatch.setattr(cached, "run", lambda *a: runs.append(a) or run(*a))
    monkeypatch.setattr(launch, "_current_cuda_device", lambda: 7)  # another device than the kept one
    bound((x, 16, x))
    assert len(runs) == 1


def test_a_per_call_keyword_argument_is_never_kept(gpu_like):
    cached, compiled = gpu_like
    x = torch.zeros(16)
    bound = KeyedLaunch(cached, ("call", 3), (1,), dict(y_ptr=x, BLOCK=16))  # y_ptr: not a constexpr
    bound((x, 16))
    bound((x, 16))
    assert bound._hit is False and len(compiled.calls) == 1  # the second through CachedLaunch.run's keyed hit


def test_descriptor_positions_take_tensors_and_launch_their_tma_operands(gpu_like):
    cached, compiled = gpu_like
    bound = KeyedLaunch(cached, ("call", 4), (1,), dict(BLOCK=16), operands={2: lambda t: TmaOperand(t, [16])})
    x, y = torch.zeros(16), torch.ones(16)
    for _ in range(3):  # the JIT launch, the keyed hit, the kept launch (the stand-in's runner: no direct launch)
        bound((x, 16, y))
    (_, jit_args, _), = cached.jit_calls
    assert type(jit_args[2]) is TmaOperand and jit_args[2].base is y and jit_args[2].block_shape == [16]
    assert len(compiled.calls) == 2
    for _, args in compiled.calls:
        assert type(args[2]) is TmaOperand and args[2].base is y and args[0] is x


def _tiny_desc(x_ptr, n, BLOCK: tl.constexpr, y_desc=None, FLAG: tl.constexpr = False):
    pass


def test_a_derived_descriptor_goes_by_keyword_then_in_its_place(monkeypatch):
    monkeypatch.setattr(launch.dispatch, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    compiled = Compiled()
    compiled.src.signature = {p: None for p in inspect.signature(_tiny_desc).parameters}
    cached = CachedLaunch(JITFunction(_tiny_desc))
    jit_calls = []
    monkeypatch.setattr(cached, "_jit_launch", lambda grid, args, kwargs: jit_calls.append((args, kwargs)) or compiled)
    bound = KeyedLaunch(cached, ("call", 5), (2,), dict(BLOCK=16, FLAG=True),
                        derived={"y_desc": (0, lambda t: TmaOperand(t, [8]))})
    x = torch.zeros(16)
    for _ in range(3):  # the JIT launch, the keyed hit, the kept launch
        bound((x, 16))
    (args, kwargs), = jit_calls
    assert type(kwargs["y_desc"]) is TmaOperand and kwargs["y_desc"].base is x and kwargs["FLAG"] is True
    (_, hit_args), (_, kept_args) = compiled.calls
    assert len(hit_args) == len(kept_args) == 5 and kept_args[1:3] == (16, 16) and kept_args[4] is True
    for a in (hit_args, kept_args):
        assert type(a[3]) is TmaOperand and a[3].base is x and a[3].block_shape == [8]


def test_all_kept_once_every_launch_is_bound_on_this_device_and_the_switch_is_on(gpu_like, monkeypatch):
    cached, compiled = gpu_like
    first, second = (KeyedLaunch(cached, ("call", i), (1,), dict(BLOCK=16)) for i in (6, 7))
    x = torch.zeros(16)
    first((x, 16, x))
    assert first.kept() and not second.kept() and not KeyedLaunch.all_kept(first, second)
    second((x, 16, x))
    assert KeyedLaunch.all_kept(first, second)
    launch.bind_keyed_launches(False)
    assert not KeyedLaunch.all_kept(first, second) and not first.kept()
    launch.bind_keyed_launches(True)
    monkeypatch.setattr(launch, "_current_cuda_device", lambda: 7)
    assert not KeyedLaunch.all_kept(first, second) and not first.kept()


def test_a_key_is_required():
    with pytest.raises(ValueError, match="launch key"):
        KeyedLaunch(CachedLaunch(JITFunction(_tiny)), None, (1,), {})


# ---- attention's split-key decode by its per-key recipe (interpreter: the recipe's arguments go through
# CachedLaunch.run, whose keyed launch is recorded with Triton's own key of them, then launched plainly)


_cpu_signature = cpu_signature


@pytest.fixture
def keyed_attention(monkeypatch):
    seen = {}

    def launch_keyed(self, key, grid, args, kwargs):
        triton_key, _ = CachedLaunch(JITFunction(self.kernel.fn)).key(args, kwargs)
        seen.setdefault((self.kernel.fn.__name__, key), set()).add(triton_key)
        return self[grid](*args, **kwargs)

    monkeypatch.setattr(CachedLaunch, "launch_keyed", launch_keyed)
    monkeypatch.setattr(attention_op, "signature", _cpu_signature)
    attention_op._PLANS.clear()
    decode_launch._DECODE_LAUNCHES.clear()
    yield seen
    attention_op._PLANS.clear()
    decode_launch._DECODE_LAUNCHES.clear()


@pytest.mark.parametrize("nk, causal, window, softcap, scale", [
    (300, False, (-1, -1), 0.0, None),  # three key ranges and the merge
    (100, True, (-1, -1), 0.0, 0.3),  # one range: no merge
    (300, True, (40, 0), 5.0, None),  # a window and a softcap
])
def test_decode_recipe_gives_the_general_paths_bits(keyed_attention, monkeypatch, nk, causal, window, softcap, scale):
    torch.manual_seed(0)
    calls = []
    for _ in range(3):  # every call new values: the recipe keeps no tensor
        q = torch.randn(1, 4, 2, 32, dtype=torch.float16)
        k = torch.randn(1, 2, nk, 32, dtype=torch.float16)
        v = torch.randn(1, 2, nk, 32, dtype=torch.float16)
        calls.append((q, k, v))
    options = dict(causal=causal, window_size=window, softcap=softcap, scale=scale, return_lse=True)
    keyed = [attention_op.attention(*c, **options) for c in calls]
    keyed_out = [attention_op.attention(*c, **dict(options, return_lse=False)) for c in calls]  # lse in the parts
    assert len(decode_launch._DECODE_LAUNCHES) == 1  # one key, its recipe made once
    recipe = next(iter(decode_launch._DECODE_LAUNCHES._data.values()))[0]
    assert recipe and (recipe.merge is None) == (nk == 100)
    monkeypatch.setattr(attention_op, "signature", lambda *items: None)  # the general path: no key, no recipe
    plain = [attention_op.attention(*c, **options) for c in calls]
    for (o, lse), o_only, (o_plain, lse_plain) in zip(keyed, keyed_out, plain):
        assert torch.equal(o, o_plain) and torch.equal(lse, lse_plain) and torch.equal(o_only, o_plain)
    assert keyed_attention and all(len(triton_keys) == 1 for triton_keys in keyed_attention.values())


# ---- the KV cache's decode by its per-key recipe (the merge's key ranges included)

from tilecore.ops.attention_kvcache import op as kvcache  # noqa: E402


@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_recipe_gives_the_general_paths_bits(monkeypatch, paged):
    seen = {}

    def launch_keyed(self, key, grid, args, kwargs):
        triton_key, _ = CachedLaunch(JITFunction(self.kernel.fn)).key(args, kwargs)
        seen.setdefault((self.kernel.fn.__name__, key), set()).add(triton_key)
        return self[grid](*args, **kwargs)

    monkeypatch.setattr(CachedLaunch, "launch_keyed", launch_keyed)
    monkeypatch.setattr(kvcache, "signature", _cpu_signature)
    for cache in (kvcache._CHECKED, kvcache._LAYOUTS, kvcache._LAUNCHES):
        cache.clear()
    torch.manual_seed(1)
    if paged:  # three pages of 256 keys, in another order
        kc, vc = (torch.randn(3, 256, 1, 32, dtype=torch.float16) for _ in range(2))
        table = torch.tensor([[2, 0, 1]], dtype=torch.int32)
    else:
        kc, vc = (torch.randn(1, 768, 1, 32, dtype=torch.float16) for _ in range(2))
        table = None
    lengths = torch.tensor([600], dtype=torch.int32)
    qs = [torch.randn(1, 1, 4, 32, dtype=torch.float16) for _ in range(2)]
    options = dict(cache_seqlens=lengths, block_table=table, softcap=3.0, return_lse=True)
    keyed = [kvcache.attention_with_kvcache(q, kc, vc, **options) for q in qs]
    keyed_out = [kvcache.attention_with_kvcache(q, kc, vc, **dict(options, return_lse=False)) for q in qs]
    recipe = next(iter(kvcache._LAUNCHES._data.values()))[0]
    assert len(kvcache._LAUNCHES) == 1 and recipe.merge is not None and recipe.part_shapes[0][0] == 3
    monkeypatch.setattr(kvcache, "signature", lambda *items: None)
    plain = [kvcache.attention_with_kvcache(q, kc, vc, **options) for q in qs]
    for (o, lse), o_only, (o_plain, lse_plain) in zip(keyed, keyed_out, plain):
        assert torch.equal(o, o_plain) and torch.equal(lse, lse_plain) and torch.equal(o_only, o_plain)
    assert {name for name, _ in seen} == {"kvcache_fwd_split", "kvcache_merge_splits"}
    assert all(len(triton_keys) == 1 for triton_keys in seen.values())
    for cache in (kvcache._CHECKED, kvcache._LAYOUTS, kvcache._LAUNCHES):
        cache.clear()


# ---- mamba2_step by its per-key recipe (the dt kernel and the step kernel)

from tilecore.ops.linear_attention import op as la_op  # noqa: E402


@pytest.mark.parametrize("d_dim, with_z, with_bias", [(0, False, False), (1, True, True), (2, False, True)])
def test_mamba2_step_recipe_gives_the_general_paths_bits(monkeypatch, d_dim, with_z, with_bias):
    seen = {}

    def launch_keyed(self, key, grid, args, kwargs):
        triton_key, _ = CachedLaunch(JITFunction(self.kernel.fn)).key(args, kwargs)
        seen.setdefault((self.kernel.fn.__name__, key), set()).add(triton_key)
        return self[grid](*args, **kwargs)

    monkeypatch.setattr(CachedLaunch, "launch_keyed", launch_keyed)
    monkeypatch.setattr(la_op, "signature", _cpu_signature)
    for cache in (la_op._CHECKED, la_op._PLANS, la_op._MAMBA_STEPS):
        cache.clear()
    torch.manual_seed(2)
    Bsz, H, P, G, S = 2, 4, 16, 1, 16
    state0 = torch.randn(Bsz, H, P, S)
    calls = []
    for _ in range(3):  # new values each call
        x = torch.randn(Bsz, H, P, dtype=torch.float16)
        dt = torch.rand(H, Bsz).t() - 0.1  # strided, a few below dt_limit's 0
        A = -torch.rand(H)
        Bm, Cm = (torch.randn(Bsz, G, S, dtype=torch.float16) for _ in range(2))
        D = None if d_dim == 0 else torch.randn(H) if d_dim == 1 else torch.randn(H, P)
        z = torch.randn(Bsz, H, P, dtype=torch.float16) if with_z else None
        bias = torch.rand(H) * 0.1 if with_bias else None
        calls.append((x, dt, A, Bm, Cm, dict(D=D, z=z, dt_bias=bias)))
    runs = []
    for plain in (False, True):
        if plain:
            monkeypatch.setattr(la_op, "signature", lambda *items: None)
        state = state0.clone()
        outs = [la_op.mamba2_step(state, x, dt, A, Bm, Cm, **kw) for x, dt, A, Bm, Cm, kw in calls]
        runs.append(outs + [state])
        if not plain:
            assert len(la_op._MAMBA_STEPS) == 1 and next(iter(la_op._MAMBA_STEPS._data.values()))[0]
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    assert {name for name, _ in seen} == {"mamba_dt_kernel", "la_step_kernel"}
    assert all(len(triton_keys) == 1 for triton_keys in seen.values())
    for cache in (la_op._CHECKED, la_op._PLANS, la_op._MAMBA_STEPS):
        cache.clear()


# ---- descriptors whose views a key fixes: encoded once per base address (descriptor_expander's ``operands``)

import triton.backends.nvidia.driver as nvidia_driver  # noqa: E402

from tilecore.tiles.launch import descriptor_expander  # noqa: E402

SIGNATURE = {0: "*bf16", 1: "tensordesc<bf16[1, 64, 64]>", 2: "i32", 3: "*fp32",
             4: "tensordesc<bf16[1, 64, 64]>", 5: "fp32"}
METAS = [dict(swizzle=3, elem_size=2, elem_type=9, block_size=[1, 64, 64], fp4_padded=False),
         dict(swizzle=2, elem_size=2, elem_type=9, block_size=[1, 64, 32], fp4_padded=False)]
BASE = tuple(range(13))
OPERANDS = {1: lambda t: TmaOperand(t, [1, 64, 64]), 4: lambda t: TmaOperand(t, [1, 64, 32], shape=[2, 128, 32])}


def test_fixed_descriptors_expand_as_tritons_wrapper_one_encoding_per_address(monkeypatch):
    if getattr(nvidia_driver, "_BASE_ARGS_FORMAT_LEN", None) != 13:  # triton 3.7 on: another wrapper and launcher
        inner = nvidia_driver.wrap_handle_tensordesc(lambda *a: None, SIGNATURE, METAS)
        assert descriptor_expander(inner, OPERANDS) is None  # declined: Triton's own launcher encodes each launch
        pytest.skip("this triton's descriptor wrapper is not 3.6's: descriptor_expander declines it")
    encoded = []

    def encode(arg, meta):
        encoded.append(arg.base.data_ptr())
        return [("map", arg.base.data_ptr(), tuple(arg.shape), tuple(arg.strides), meta["swizzle"]),
                *arg.shape, *arg.strides]

    monkeypatch.setattr(nvidia_driver, "make_tensordesc_arg", encode)
    received = []
    inner = nvidia_driver.wrap_handle_tensordesc(lambda *a: received.append(a), SIGNATURE, METAS)
    assert descriptor_expander(inner, {1: OPERANDS[1]}) is None  # every descriptor position or none
    raw, expand = descriptor_expander(inner, OPERANDS)
    torch.manual_seed(0)
    q, q2, out = torch.randn(2, 128, 64), torch.randn(2, 128, 64), torch.empty(4)
    for x in (q, q2, q, q2):
        inner(*BASE, *[x, OPERANDS[1](x), 7, out, OPERANDS[4](x), 0.5])  # Triton's wrapper, TmaOperands
        raw(*BASE, *expand([x, x, 7, out, x, 0.5]))  # the tensors themselves
        assert received[-1] == received[-2]
    assert len(encoded) == 2 * 4 + 2 * 2  # the wrapper each launch; the fixed expander each address once a slot


# ---- attention_fp8's Gluon launch by its per-key recipe (no Gluon kernel runs on the CPU: its launches recorded)


@pytest.mark.parametrize("permuted", [False, True])
def test_fp8_recipe_launches_what_the_general_path_launches(monkeypatch, permuted):
    from tilecore.ops.attention_fp8 import launch as fp8_launch
    from tilecore.ops.attention_fp8.reference import keys_permuted

    calls = fp8_on_gluon(monkeypatch).calls
    for cache in (fp8_launch._GLUON_LAYOUTS, fp8_launch._TILINGS, fp8_launch._FP8_LAUNCHES):
        cache.clear()
    torch.manual_seed(13)
    q = torch.randn(1, 4, 40, 64).to(torch.float8_e4m3fn).transpose(1, 2).contiguous().transpose(1, 2)  # strided
    k = torch.randn(1, 2, 40, 64).to(torch.float8_e4m3fn)
    v = torch.randn(1, 2, 40, 64).to(torch.float8_e4m3fn)
    v_in = keys_permuted(v) if permuted else v
    scales = [torch.rand(1, 4) + 0.5, (torch.rand(1, 2, 1) + 0.5).double(), torch.rand(1, 2) + 0.5]  # k's: float64
    p = fp8_launch.plan(q, k, True, path="gluon")
    key = ("test", permuted)
    assert fp8_launch.prepared(key, p, q, k, v_in, *scales, True, 0.125, torch.bfloat16, permuted) is None  # no call yet
    out, lse = fp8_launch.forward(p, q, k, v_in, *scales, True, 0.125, torch.bfloat16, v_permuted=permuted, key=key)
    recipe = fp8_launch.prepared(key, p, q, k, v_in, *scales, True, 0.125, torch.bfloat16, permuted)
    assert recipe and len(fp8_launch._FP8_LAUNCHES) == 1 and recipe.ready == (True, False, True)
    out2, lse2 = recipe(q, k, v_in, *scales)
    assert (out2.shape, out2.dtype, lse2.shape, lse2.dtype) == (out.shape, out.dtype, lse.shape, lse.dtype)
    (key0, grid0, args0, opts0), (key1, grid1, args1, opts1) = calls
    assert key0 == key1 == key and grid0 == (7,) and grid1 == (7, 1, 1) and opts0 == opts1
    assert len(args0) == len(args1)
    for i, (a, b) in enumerate(zip(args0, args1)):
        if isinstance(a, launch.TmaOperand):
            assert type(b) is launch.TmaOperand
            assert (a.shape, a.strides, a.block_shape, a.layout, a.padding) == (b.shape, b.strides, b.block_shape,
                                                                                b.layout, b.padding)
            if i < 2 or (i == 2 and permuted):  # q, k and a permuted v: the inputs themselves
                assert a.base.data_ptr() == b.base.data_ptr()
            elif i == 2:  # v's permuted copy: made each call, equal
                assert torch.equal(a.base.view(torch.uint8), b.base.view(torch.uint8))
        elif isinstance(a, torch.Tensor):
            assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b) or i in (4,)  # lse: fresh
        else:
            assert a == b
    for cache in (fp8_launch._GLUON_LAYOUTS, fp8_launch._TILINGS, fp8_launch._FP8_LAUNCHES):
        cache.clear()


# ---- attention_varlen's Gluon forward by its per-key recipe (the work table by the interpreter each call; the
# Gluon launch recorded)


@pytest.mark.parametrize("ranked", [True, False])
def test_varlen_recipe_launches_what_the_general_path_launches(monkeypatch, ranked):
    from tilecore.ops.attention_varlen import op as varlen_op

    calls = varlen_on_gluon(monkeypatch).calls
    monkeypatch.setattr(varlen_op, "VARLEN_RANKED_TABLE", ranked)
    for cache in (varlen_op._GLUON_FORWARD_LAYOUTS, varlen_op._GLUON_FORWARDS):
        cache.clear()
    q = torch.randn(60, 4, 64, dtype=torch.bfloat16)
    kv = torch.randn(70, 2, 64, dtype=torch.bfloat16)
    key = ("test", ranked)
    first = torch.tensor([0, 10, 60], dtype=torch.int32), torch.tensor([0, 30, 70], dtype=torch.int32)
    varlen_op.forward_gluon(q, kv, kv, *first, True, 0.125, 2.0, key=key)  # the key's first call: kept
    recipe = varlen_op._GLUON_FORWARDS.get(key)
    assert recipe and recipe.ranked is ranked
    for lengths in (([0, 50, 60], [0, 10, 70]), ([0, 0, 60], [0, 70, 70])):  # new lengths: this call's table
        cu_q, cu_k = (torch.tensor(x, dtype=torch.int32) for x in lengths)
        varlen_op.forward_gluon(q, kv, kv, cu_q, cu_k, True, 0.125, 2.0)  # the general path, no key
        out, lse = recipe(q, kv, kv, cu_q, cu_k)
        assert out.shape == q.shape and lse.shape == (4, 60)
        (_, grid0, args0, opts0), (key1, grid1, args1, opts1) = calls[-2:]
        assert key1 == key and grid0 + (1, 1) == grid1 and opts0 == opts1 and len(args0) == len(args1)
        for i, (a, b) in enumerate(zip(args0, args1)):
            if isinstance(a, launch.TmaOperand):
                assert (a.shape, a.strides, a.block_shape, a.key[:4]) == (b.shape, b.strides, b.block_shape,
                                                                           b.key[:4])
                assert i == 3 or a.base is b.base  # q, k, v themselves; O fresh
            elif isinstance(a, torch.Tensor):
                assert a.shape == b.shape and a.dtype == b.dtype
                assert a.dtype != torch.int32 or torch.equal(a, b)  # cu_seqlens and this call's work table
            else:
                assert a == b
    for cache in (varlen_op._GLUON_FORWARD_LAYOUTS, varlen_op._GLUON_FORWARDS):
        cache.clear()


# ---- fft_conv's Gluon kernel by its per-key recipe (the launches recorded: Gluon cannot be interpreted)


def test_fft_conv_recipe_launches_what_the_general_path_launches(monkeypatch):
    from tilecore.ops.fft_conv import op as fft_op

    calls = fft_conv_on_gluon(monkeypatch, _cpu_signature).calls
    torch.manual_seed(5)
    B, H, n = 4, 2, 1024
    inputs = [(torch.randn(B, H, n).to(torch.bfloat16), torch.randn(H, 300)) for _ in range(3)]
    for u, k in inputs:
        fft_op.fft_conv(u, k)
    assert len(fft_op._GLUON_CONVS) == 1 and next(iter(fft_op._GLUON_CONVS._data.values()))[0]
    keyed = calls[:]
    monkeypatch.setattr(fft_op, "signature", lambda *items: None)
    for u, k in inputs:
        fft_op.fft_conv(u, k)
    plain = calls[len(keyed):]
    for (u, k), (key0, grid0, args0, kw0), (key1, grid1, args1, kw1) in zip(inputs, plain, keyed):
        assert key0 is None and key1[1:] == (False, False)
        assert tuple(grid0) + (1,) * (3 - len(grid0)) == tuple(grid1) + (1,) * (3 - len(grid1))
        assert len(args0) == len(args1) and args1[0] is u and set(kw0) == set(kw1)
        for a, b in zip(args0, args1):
            if isinstance(a, torch.Tensor):
                assert a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
                assert a is args0[2] or torch.equal(a, b)  # (y: fresh each call)
            else:
                assert a == b
        for name in kw0:
            a, b = kw0[name], kw1[name]
            if isinstance(a, launch.TmaOperand):
                assert (a.shape, a.strides, a.block_shape, a.layout) == (b.shape, b.strides, b.block_shape, b.layout)
                assert (a.base is u) == (b.base is u)
            else:
                assert a == b
    clear_fft_conv()


# ---- two internal buffers in one allocation: by address once both launches go the kept way


def test_kvcache_recipe_hands_kept_launches_the_lse_part_by_address(monkeypatch):
    monkeypatch.setattr(kvcache, "signature", _cpu_signature)
    for cache in (kvcache._CHECKED, kvcache._LAYOUTS, kvcache._LAUNCHES):
        cache.clear()
    kc, vc = (torch.randn(1, 768, 1, 32, dtype=torch.float16) for _ in range(2))
    lengths = torch.tensor([600], dtype=torch.int32)
    q = torch.randn(1, 1, 4, 32, dtype=torch.float16)
    kvcache.attention_with_kvcache(q, kc, vc, cache_seqlens=lengths)  # the key's first call: its recipe made
    recipe = next(iter(kvcache._LAUNCHES._data.values()))[0]
    recipe.split, recipe.merge = Kept(), Kept()
    kvcache.attention_with_kvcache(q, kc, vc, cache_seqlens=lengths)
    (split,), (merge,) = recipe.split.calls, recipe.merge.calls
    parts, lse_part = split[7], split[8]
    (splits, rows), offset = recipe.part_shapes
    assert merge[2] is parts and merge[3] == lse_part and isinstance(lse_part, int)
    assert offset % 4 == 0 and offset >= splits * rows * 32
    assert lse_part == parts.data_ptr() + 4 * offset and lse_part % 16 == 0
    # O alone returned: the merge's lse in the same allocation, after the parts, 16-byte aligned
    lse_at = -(-(offset + splits * rows) // 4) * 4
    assert parts.numel() == lse_at + rows and split[6] == merge[1] == parts.data_ptr() + 4 * lse_at
    for cache in (kvcache._CHECKED, kvcache._LAYOUTS, kvcache._LAUNCHES):
        cache.clear()


def _mamba_step_recipe(monkeypatch):
    """mamba2_step's recipe of a B3 H5 P16 N16 step (made by the key's first call) and the step's arguments."""
    monkeypatch.setattr(la_op, "signature", _cpu_signature)
    for cache in (la_op._CHECKED, la_op._PLANS, la_op._MAMBA_STEPS):
        cache.clear()
    state = torch.randn(3, 5, 16, 16)
    x = torch.randn(3, 5, 16, dtype=torch.float16)
    dt, A = torch.rand(3, 5), -torch.rand(5)
    Bm, Cm = (torch.randn(3, 1, 16, dtype=torch.float16) for _ in range(2))
    la_op.mamba2_step(state, x, dt, A, Bm, Cm)
    return next(iter(la_op._MAMBA_STEPS._data.values()))[0], (state, x, dt, A, Bm, Cm)


def test_mamba2_step_recipe_hands_kept_launches_g_by_address(monkeypatch):
    recipe, (state, x, dt, A, Bm, Cm) = _mamba_step_recipe(monkeypatch)
    recipe.dt_launch, recipe.step = Kept(), Kept()
    la_op.mamba2_step(state, x, dt, A, Bm, Cm)
    (dt_args,), (step_args,) = recipe.dt_launch.calls, recipe.step.calls
    dt_eff, g = dt_args[3], dt_args[4]
    assert isinstance(g, int) and g % 16 == 0 and g >= dt_eff.data_ptr() + 4 * 15
    assert g + 4 * 15 <= dt_eff.data_ptr() + 4 * dt_eff.numel()  # both within the one allocation
    assert step_args[3] == g and step_args[4] is dt_eff  # the step's g and beta (dt_eff)
    for cache in (la_op._CHECKED, la_op._PLANS, la_op._MAMBA_STEPS):
        cache.clear()


def test_decode_recipe_hands_kept_launches_the_lse_part_by_address(keyed_attention):
    q = torch.randn(1, 4, 2, 32, dtype=torch.float16)
    k = torch.randn(1, 2, 300, 32, dtype=torch.float16)
    attention_op.attention(q, k, k)  # the key's first call: its recipe made
    recipe = next(iter(decode_launch._DECODE_LAUNCHES._data.values()))[0]
    recipe.split, recipe.merge = Kept(), Kept()
    attention_op.attention(q, k, k)
    (split,), (merge,) = recipe.split.calls, recipe.merge.calls
    parts, lse_part = split[5], split[6]
    lse_size, offset = recipe.part_shapes
    rows, dv, splits = recipe.head
    assert merge[2] is parts and merge[3] == lse_part and isinstance(lse_part, int) and lse_size == splits * rows > rows
    assert offset % 4 == 0 and offset >= lse_size * dv
    assert lse_part == parts.data_ptr() + 4 * offset
    # O alone returned: the merge's lse in the same allocation, after the parts, 16-byte aligned
    lse_at = -(-(offset + lse_size) // 4) * 4
    assert parts.numel() == lse_at + rows and split[4] == merge[1] == parts.data_ptr() + 4 * lse_at


class _RawBlocks:
    """The caching allocator's raw blocks, faked: each block is a kept CPU tensor's memory (alloc gives its address),
    every alloc and delete recorded in ``log``."""

    def __init__(self):
        self.log, self.kept = [], {}

    def alloc(self, nbytes, stream):
        t = torch.empty(nbytes, dtype=torch.uint8)
        self.kept[t.data_ptr()] = t
        self.log.append(("alloc", nbytes, stream, t.data_ptr()))
        return t.data_ptr()

    def delete(self, address):
        self.log.append(("delete", address))
        self.kept.pop(address)


class _Failing(Kept):
    """A kept launch that raises (after recording its arguments): a raw block must still be given back."""

    def __call__(self, args):
        super().__call__(args)
        raise RuntimeError("launch failed")


@pytest.fixture
def raw_blocks(monkeypatch):
    """_RawBlocks as tiles.launch's raw allocator, the current device 0 and its raw stream 1000."""
    blocks = _RawBlocks()
    monkeypatch.setattr(launch, "_RAW_ALLOC", blocks.alloc)
    monkeypatch.setattr(launch, "_RAW_DELETE", blocks.delete)
    monkeypatch.setattr(launch, "_RAW_STREAM", lambda device: 1000 + device)
    monkeypatch.setattr(launch, "_current_cuda_device", lambda: 0)
    return blocks


def _kept_varlen_recipe(monkeypatch, key):
    """attention_varlen's recipe of a 2-sequence call (the Gluon launch recorded for its first call), its launches
    then kept stand-ins; (recipe, q, cu_seqlens)."""
    from tilecore.ops.attention_varlen import op as varlen_op

    varlen_on_gluon(monkeypatch)
    q = torch.randn(60, 4, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 10, 60], dtype=torch.int32)
    varlen_op.forward_gluon(q, q, q, cu, cu, True, 0.125, 0.0, key=key)
    recipe = varlen_op._GLUON_FORWARDS.get(key)
    recipe.table, recipe.forward = Kept(), Kept()
    return recipe, q, cu


@pytest.mark.parametrize("fail", [False, True])
def test_decode_recipes_take_a_raw_block_for_their_parts_and_release_it(monkeypatch, keyed_attention, raw_blocks,
                                                                         fail):
    """RAW_SCRATCH: where both launches go the kept way the split parts (and the merged lse of an O-only call) are one
    raw block of the caching allocator on the current stream, its size the tensor's bytes, handed to the launches by
    address and given back once both are queued (also where a launch raises); attention's split-key decode and the
    KV-cache decode. Off (or a launch not kept): a tensor, as before."""
    blocks = raw_blocks
    q = torch.randn(1, 4, 2, 32, dtype=torch.float16)
    k = torch.randn(1, 2, 300, 32, dtype=torch.float16)
    attention_op.attention(q, k, k)  # the key's first call: its recipe made
    recipe = next(iter(decode_launch._DECODE_LAUNCHES._data.values()))[0]
    recipe.split, recipe.merge = Kept(), (_Failing() if fail else Kept())
    lse_size, offset = recipe.part_shapes
    rows = recipe.head[0]
    lse_at = -(-(offset + lse_size) // 4) * 4
    # (the switch set for the test: a patched block would move the plans' generation, and with it the key)
    monkeypatch.setattr(launch, "RAW_SCRATCH", True)
    if fail:
        with pytest.raises(RuntimeError, match="launch failed"):
            attention_op.attention(q, k, k)
    else:
        attention_op.attention(q, k, k)
    (split,), (merge,) = recipe.split.calls, recipe.merge.calls
    (_, nbytes, stream, address), released = blocks.log
    assert nbytes == 4 * (lse_at + rows) and stream == 1000 and released == ("delete", address) and not blocks.kept
    assert split[5] == merge[2] == address and split[6] == merge[3] == address + 4 * offset
    assert split[4] == merge[1] == address + 4 * lse_at  # (O alone returned: the merged lse in the block)
    if fail:
        return
    monkeypatch.setattr(launch, "RAW_SCRATCH", False)  # off: the tensor
    attention_op.attention(q, k, k)
    assert len(blocks.log) == 2 and isinstance(recipe.split.calls[-1][5], torch.Tensor)
    # the KV-cache decode's recipe: the same block, given back
    monkeypatch.setattr(kvcache, "signature", _cpu_signature)
    for cache in (kvcache._CHECKED, kvcache._LAYOUTS, kvcache._LAUNCHES):
        cache.clear()
    kc, vc = (torch.randn(3, 256, 1, 32, dtype=torch.float16) for _ in range(2))
    table, lengths = torch.tensor([[2, 0, 1]], dtype=torch.int32), torch.tensor([600], dtype=torch.int32)
    kvcache.attention_with_kvcache(q[:, :1].transpose(1, 2), kc, vc, cache_seqlens=lengths, block_table=table)
    kept = next(iter(kvcache._LAUNCHES._data.values()))[0]
    kept.split, kept.merge = Kept(), Kept()
    monkeypatch.setattr(launch, "RAW_SCRATCH", True)
    kvcache.attention_with_kvcache(q[:, :1].transpose(1, 2), kc, vc, cache_seqlens=lengths, block_table=table)
    (split,), (merge,) = kept.split.calls, kept.merge.calls
    (_, _, _, address), released = blocks.log[2:]
    assert released == ("delete", address) and split[7] == merge[2] == address and not blocks.kept
    for cache in (kvcache._CHECKED, kvcache._LAYOUTS, kvcache._LAUNCHES):
        cache.clear()


def test_varlen_recipe_takes_a_raw_block_for_its_work_table_and_the_kept_stream_counter(monkeypatch, raw_blocks):
    """attention_varlen's recipe under RAW_SCRATCH, O alone returned: the work table and lse in one raw block (the
    table's entries, then lse 16-byte aligned) handed to both kept launches by address and given back after them;
    the tile counter by kept_tile_counter (on the CPU: tile_counter's fresh zero)."""
    from tilecore.ops.attention_varlen import op as varlen_op

    blocks = raw_blocks
    recipe, q, cu = _kept_varlen_recipe(monkeypatch, ("raw test",))
    monkeypatch.setattr(launch, "RAW_SCRATCH", True)
    out, lse = recipe(q, q, q, cu, cu, False)
    (table_args,), (args,) = recipe.table.calls, recipe.forward.calls
    entries = recipe.shapes[2][0]
    (_, nbytes, stream, address), released = blocks.log
    assert lse is None and out.shape == q.shape and stream == 1000 and released == ("delete", address)
    assert nbytes == 4 * (entries * 4 + 4 * 60) and table_args[2] == args[9] == address
    assert args[6] == address + 16 * entries and not blocks.kept
    assert isinstance(args[-1], torch.Tensor) and args[-1].shape == (1,) and args[-1].dtype == torch.int32
    varlen_op._GLUON_FORWARDS.clear()
    varlen_op._GLUON_FORWARD_LAYOUTS.clear()


def test_kept_tile_counter_finds_the_streams_counter(monkeypatch):
    """kept_tile_counter: the counter tile_counter keeps for (the device, its current raw stream), by that lookup
    alone; tile_counter where the device is not a CUDA one with an index (here: the CPU's fresh zero)."""
    kept = torch.zeros(1, dtype=torch.int32)
    monkeypatch.setattr(launch, "_RAW_STREAM", lambda index: 77 + index)
    monkeypatch.setattr(launch, "_TILE_COUNTERS", launch.LRU(4))
    launch._TILE_COUNTERS.put((torch.device("cuda", 1), 78), kept)
    assert launch.kept_tile_counter(torch.device("cuda", 1)) is kept
    cpu = launch.kept_tile_counter(torch.device("cpu"))
    assert cpu is not kept and cpu.shape == (1,) and not cpu.any()


def test_varlen_op_finds_the_recipe_before_its_checks(monkeypatch):
    from tilecore.ops.attention_varlen import op as varlen_op

    calls = varlen_on_gluon(monkeypatch).calls
    monkeypatch.setattr(varlen_op, "gluon_forward_fits", lambda *a, **kw: True)
    monkeypatch.setattr(varlen_op, "signature", _cpu_signature)
    checks = []
    check = varlen_op.check
    monkeypatch.setattr(varlen_op, "check", lambda *a: checks.append(1) or check(*a))
    for cache in (varlen_op._CHECKED, varlen_op._GLUON_FITS, varlen_op._GLUON_FORWARD_LAYOUTS, varlen_op._GLUON_FORWARDS):
        cache.clear()
    q = torch.randn(60, 4, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 10, 60], dtype=torch.int32)
    for _ in range(3):
        out = varlen_op.attention_varlen(q, q, q, cu, cu, 50, 50, causal=True, validate=False)
        assert out.shape == q.shape
    assert len(checks) == 1 and len(calls) == 3 and len(varlen_op._GLUON_FORWARDS) == 1
    assert calls[0][0] == calls[1][0] == calls[2][0] and calls[0][0][0] == "attention_varlen"
    xg = q.clone().requires_grad_()  # recording a gradient: the Function (whose forward launches by the recipe)
    assert varlen_op.attention_varlen(xg, q, q, cu, cu, 50, 50, causal=True, validate=False).grad_fn is not None
    assert len(calls) == 4 and calls[3][0] == calls[0][0]
    for cache in (varlen_op._CHECKED, varlen_op._GLUON_FITS, varlen_op._GLUON_FORWARD_LAYOUTS, varlen_op._GLUON_FORWARDS):
        cache.clear()


def test_fp8_op_finds_the_recipe_before_its_checks_and_still_checks_the_scales(monkeypatch):
    from tilecore.ops.attention_fp8 import launch as fp8_launch
    from tilecore.ops.attention_fp8 import op as fp8_op

    calls = fp8_on_gluon(monkeypatch).calls
    monkeypatch.setattr(fp8_op.launch, "plan", lambda q, k, causal: fp8_launch.Plan("gluon", dict(
        fp8_launch.configs.gluon_config(q.shape[-1], causal))))
    monkeypatch.setattr(fp8_op, "signature", _cpu_signature)
    checks = []
    check = fp8_op.check
    monkeypatch.setattr(fp8_op, "check", lambda *a: checks.append(1) or check(*a))
    caches = (fp8_op._CHECKED, fp8_op._PLANS, fp8_launch._GLUON_LAYOUTS, fp8_launch._TILINGS, fp8_launch._FP8_LAUNCHES)
    for cache in caches:
        cache.clear()
    q = torch.randn(1, 2, 40, 64).to(torch.float8_e4m3fn)
    one = torch.ones(1, 2)
    for _ in range(3):
        fp8_op.attention_fp8(q, q, q, q_scale=one, k_scale=one, v_scale=one)
    assert len(checks) == 1 and len(calls) == 3 and len(fp8_launch._FP8_LAUNCHES) == 1
    with pytest.raises(ValueError):  # the descales' values: still checked each call
        fp8_op.attention_fp8(q, q, q, q_scale=one, k_scale=-one, v_scale=one)
    assert len(calls) == 3
    for cache in caches:
        cache.clear()


def test_varlen_and_fft_conv_recipes_hand_kept_launches_addresses(monkeypatch):
    from tilecore.ops.attention_varlen import op as varlen_op
    from tilecore.ops.fft_conv import op as fft_op

    # varlen: O alone returned, lse in the work table's allocation after its entries
    recipe, q, cu = _kept_varlen_recipe(monkeypatch, ("kept test",))
    out, lse = recipe(q, q, q, cu, cu, False)
    (table_args,), (args,) = recipe.table.calls, recipe.forward.calls
    work, entries = args[9], recipe.shapes[2][0]
    assert lse is None and table_args[2] is work and work.dtype == torch.int32
    assert work.numel() == entries * 4 + 4 * 60 and args[6] == work.data_ptr() + 16 * entries
    varlen_op._GLUON_FORWARDS.clear()
    varlen_op._GLUON_FORWARD_LAYOUTS.clear()
    # fft_conv: the fresh spectrum's memory by address (its float32 pairs), where the plan reads rfft bins
    fft_conv_on_gluon(monkeypatch, _cpu_signature)
    u, k = torch.randn(4, 2, 1024).to(torch.bfloat16), torch.randn(2, 300)
    fft_op.fft_conv(u, k)
    recipe = next(iter(fft_op._GLUON_CONVS._data.values()))[0]
    recipe.launch = Kept()
    recipe(u, k)
    (args,) = recipe.launch.calls
    assert isinstance(args[1], int) and args[0] is u and args[2].shape == u.shape
    clear_fft_conv()


@pytest.mark.parametrize("n", [1, 40])  # the split-key decode and the query-block forward
def test_attention_recording_a_gradient_of_o_alone_gives_the_two_output_functions_gradients(n):
    torch.manual_seed(8)
    leaves = [torch.randn(1, 4, n, 32, dtype=torch.float16), torch.randn(1, 2, 50, 32, dtype=torch.float16),
              torch.randn(1, 2, 50, 32, dtype=torch.float16)]
    g = torch.randn(1, 4, n, 32, dtype=torch.float16)
    grads = []
    for return_lse in (False, True):
        ins = [t.clone().requires_grad_() for t in leaves]
        out = attention_op.attention(*ins, causal=True, return_lse=return_lse)
        out = out[0] if return_lse else out
        assert out.grad_fn is not None and type(out.grad_fn).__name__.startswith(
            "_AttentionOutFunction" if not return_lse else "_AttentionFunction")
        out.backward(g)
        grads.append([out.detach()] + [t.grad for t in ins])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_tma_operand_holds_every_field_tritons_launcher_reads():
    """Triton's launcher reads a kept launch's TmaOperand as the Gluon TensorDescriptor it stands for: every field
    of the installed triton's TensorDescriptor is an attribute of TmaOperand, with TensorDescriptor's default where
    TmaOperand holds a constant (3.7 added round_f32_to_tf32, which turned every kept TMA launch off until TmaOperand
    had it: session 34), so tma_operand_problem() is None under each triton of the compat matrix."""
    import dataclasses

    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from tilecore.tiles.launch import tma_operand_problem

    op = TmaOperand(torch.zeros(4, 16), [4, 16])
    for f in dataclasses.fields(TensorDescriptor):
        assert hasattr(op, f.name), f.name
        if f.name in ("padding", "round_f32_to_tf32"):
            assert getattr(op, f.name) == f.default, f.name
    assert tma_operand_problem() is None


@pytest.mark.parametrize("case", ["rms", "ln", "ln two passes", "prenorm residual"])
def test_norm_plain_call_takes_its_statistics_as_a_raw_block(monkeypatch, raw_blocks, case):
    """A plain eager norm call by its key's NormForward under RAW_SCRATCH and STATS_SCRATCH, every launch kept: mean
    (LayerNorm) and rstd,
    which the call returns neither of, are one raw block (the mean's rows, then rstd 16-byte aligned), handed to the
    stats and forward kernels by address and given back once they are queued (also where a launch raises); y and h
    still tensors. Off, or a launch not kept: the tensors of NormForward.outputs, as before."""
    from tilecore.ops.norm import configs as norm_configs, launch as norm_launch, op as norm_op

    monkeypatch.setattr(norm_op, "signature", cpu_signature)
    caches = (norm_op._CHECKED, norm_op._PLANS, norm_op._FORWARDS, norm_launch._FORWARD_OPTIONS)
    for cache in caches:
        cache.clear()
    if case == "ln two passes":
        monkeypatch.setattr(norm_configs, "WHOLE_ROW_MAX", 16)
    rms = case in ("rms", "prenorm residual")
    x, w = torch.randn(2, 5, 32, dtype=torch.float16), torch.randn(32, dtype=torch.float16)
    b = None if rms else torch.randn(32, dtype=torch.float16)
    res = torch.randn(2, 5, 32, dtype=torch.float32) if case == "prenorm residual" else None

    def call():
        return norm_op.layer_norm(x, w, b, residual=res, rms=rms, prenorm=res is not None)
    call()  # (the key's first call: its NormForward)
    recipe = next(iter(norm_op._FORWARDS._data.values()))[0]
    monkeypatch.setattr(norm_launch, "STATS_SCRATCH", True)
    assert (recipe.stats is not None) == (case == "ln two passes")
    for fail in (False, True):
        blocks = raw_blocks.log.clear() or raw_blocks
        recipe.forward = _Failing() if fail else Kept()
        recipe.stats = Kept() if recipe.stats is not None else None
        monkeypatch.setattr(launch, "RAW_SCRATCH", True)
        if fail:
            with pytest.raises(RuntimeError, match="launch failed"):
                call()
        else:
            out = call()
            y, h = out if res is not None else (out, None)
            assert y.shape == x.shape and y.dtype == x.dtype
            assert (h is not None) == (res is not None) and (h is None or h.dtype == torch.float32)
        (_, nbytes, stream, address), released = blocks.log
        rows = 10
        rstd_at = 0 if rms else 16 * 3  # (10 rows of float32: 40 bytes, rstd at 48)
        assert nbytes == rstd_at + 4 * rows and stream == 1000 and released == ("delete", address) and not blocks.kept
        (args,) = recipe.forward.calls
        assert args[6] == (None if rms else address) and args[7] == address + rstd_at
        assert isinstance(args[4], torch.Tensor) and (args[5] is None) == (res is None)
        if recipe.stats is not None:
            (stats,) = recipe.stats.calls
            assert stats[2] == address and stats[3] == address + rstd_at
    for module, switch in ((launch, "RAW_SCRATCH"), (norm_launch, "STATS_SCRATCH")):  # off: outputs' tensors, no block
        monkeypatch.setattr(module, switch, False)
        raw_blocks.log.clear()
        recipe.forward = Kept()
        call()
        (args,) = recipe.forward.calls
        assert raw_blocks.log == [] and isinstance(args[7], torch.Tensor) and args[7].shape == (10,)
        assert (args[6] is None) == rms
        monkeypatch.setattr(module, switch, True)
    for cache in caches:
        cache.clear()


def test_mamba2_step_recipe_takes_a_raw_block_for_dt_eff_and_g(monkeypatch, raw_blocks):
    """RAW_SCRATCH, both launches kept: mamba2_step's recipe hands dt_eff and g (g 16-byte aligned after it) as one raw
    block of the caching allocator, by address, given back once both launches are queued (also where one raises); y a
    tensor of x's dtype. Off: one tensor, g by address in it, as before."""
    recipe, (state, x, dt, A, Bm, Cm) = _mamba_step_recipe(monkeypatch)
    monkeypatch.setattr(launch, "RAW_SCRATCH", True)
    monkeypatch.setattr(la_op, "MAMBA_STEP_SCRATCH", True)
    for fail in (False, True):
        raw_blocks.log.clear()
        recipe.dt_launch, recipe.step = Kept(), (_Failing() if fail else Kept())
        if fail:
            with pytest.raises(RuntimeError, match="launch failed"):
                la_op.mamba2_step(state, x, dt, A, Bm, Cm)
        else:
            y = la_op.mamba2_step(state, x, dt, A, Bm, Cm)
            assert y.shape == x.shape and y.dtype == x.dtype
        (_, nbytes, stream, address), released = raw_blocks.log
        assert nbytes == 4 * (16 + 15) and stream == 1000 and released == ("delete", address) and not raw_blocks.kept
        (dt_args,), (step_args,) = recipe.dt_launch.calls, recipe.step.calls
        assert dt_args[3] == step_args[4] == address and dt_args[4] == step_args[3] == address + 4 * 16
    for module, switch in ((launch, "RAW_SCRATCH"), (la_op, "MAMBA_STEP_SCRATCH")):  # off: a tensor, g in it
        monkeypatch.setattr(module, switch, False)
        raw_blocks.log.clear()
        recipe.dt_launch, recipe.step = Kept(), Kept()
        la_op.mamba2_step(state, x, dt, A, Bm, Cm)
        (dt_args,), (step_args,) = recipe.dt_launch.calls, recipe.step.calls
        assert raw_blocks.log == [] and isinstance(dt_args[3], torch.Tensor) and step_args[4] is dt_args[3]
        assert dt_args[4] == dt_args[3].data_ptr() + 4 * 16
        monkeypatch.setattr(module, switch, True)
    for cache in (la_op._CHECKED, la_op._PLANS, la_op._MAMBA_STEPS):
        cache.clear()
