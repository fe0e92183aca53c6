"""Session 32's per-key recipes (tiles.launch.OP_RECIPES; issue 31's host time): gemm's and gemm_fp8's GluonGemm must
hand the Gluon kernel what the general path (launch.launch with the key) hands it: the same grid, constexprs and
options, the same scalars and buffers, and TMA descriptors of the same memory, views and boxes. The Gluon kernel
cannot run on the CPU, so its launcher is replaced by a recorder here; the GPU check is host_time.py's bits."""
import pytest
import torch

import host_testing
from host_testing import cpu_signature as _cpu_signature
from tilecore.ops.gemm import configs, launch as gemm_launch, op as gemm_op
from tilecore.ops.gemm.plan import Plan
from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.launch import TmaOperand


@pytest.fixture(autouse=True)
def forward_recipes():
    """FORWARD_RECIPES (on by default since session 33's H100 run 2) on for these tests; put back after."""
    was = tiles_launch.FORWARD_RECIPES
    tiles_launch.keep_forward_recipes(True)
    yield
    tiles_launch.keep_forward_recipes(was)


class Recorder(host_testing.Recorder):
    """_GLUON_GEMM's stand-in: every launch's (key, grid, arguments, options), descriptors by what they describe."""

    @staticmethod
    def _arg(a):
        if type(a) is TmaOperand:
            return ("tma", a.base.data_ptr(), tuple(a.shape), tuple(a.strides), tuple(a.block_shape), a.layout)
        if isinstance(a, torch.Tensor):
            return ("tensor", a.data_ptr(), a.dtype)
        return a

    def launch_keyed(self, key, grid, args, kwargs):
        grid = tuple(grid) + (1,) * (3 - len(grid))
        self.calls.append((key, grid, tuple(map(self._arg, args)), dict(kwargs)))

    def run(self, key, grid, args, kwargs):
        self.launch_keyed(key, grid, args, kwargs)


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(gemm_launch, "_GLUON_GEMM", rec)
    yield rec
    tiles_launch.keep_op_recipes(True)


def _plan(M, N, K, b_t, bias, scales=0, stream_k=False, out_dtype=torch.bfloat16):
    cfg = configs.GLUON_FP8 if scales else configs.GLUON_BF16
    return Plan("gluon", out_dtype=out_dtype, config=cfg, grid=(5,), units=11 if stream_k else 6, stream_k=stream_k,
                has_bias=bias, scales=scales, b_t=b_t, c_dtype=out_dtype)


@pytest.mark.parametrize("b_t", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("stream_k", [False, True])
def test_gluon_gemm_recipe_launches_what_the_general_path_launches(recorder, b_t, bias, stream_k):
    M, N, K = 48, 64, 32
    a = torch.randn(M, K, dtype=torch.bfloat16)
    b = torch.randn(N, K, dtype=torch.bfloat16).t() if b_t else torch.randn(K, N, dtype=torch.bfloat16)
    bvec = torch.randn(N, dtype=torch.bfloat16) if bias else None
    p = _plan(M, N, K, b_t, bias, stream_k=stream_k)
    key = ("test gemm", b_t, bias, stream_k)
    c_general = gemm_launch.launch(p, a, b, bvec, key=key)
    recipe = gemm_launch.recipe(p, a, b, bvec, key=key)
    assert type(recipe) is gemm_launch.GluonGemm
    c_recipe = recipe(a, b, bvec)
    (k1, g1, args1, kw1), (k2, g2, args2, kw2) = recorder.calls
    assert k1 == k2 == key and g1 == g2 and kw1 == kw2
    assert c_general.shape == c_recipe.shape == (M, N) and c_general.dtype == c_recipe.dtype == torch.bfloat16
    # C is each call's own allocation: the same view of it, at its own address
    assert args1[2][0] == "tma" and args1[2][1] == c_general.data_ptr() and args2[2][1] == c_recipe.data_ptr()
    assert args1[2][2:] == args2[2][2:]
    unused = (6, 7, 8) if not bias else (7, 8)  # the pointers a launch without bias / scales passes: C itself
    same = [i for i in range(len(args1)) if i != 2 and i not in unused]
    assert all(args1[i] == args2[i] for i in same), (args1, args2)
    for i in unused:
        assert args1[i][1] == c_general.data_ptr() and args2[i][1] == c_recipe.data_ptr()


def test_gluon_gemm_recipe_for_fp8_scales(recorder):
    M, N, K = 32, 48, 64
    a = torch.randn(M, K).to(torch.float8_e4m3fn)
    b = torch.randn(N, K).to(torch.float8_e4m3fn).t()
    scales = (torch.rand(M, 1), torch.rand(1, N))
    p = _plan(M, N, K, True, False, scales=4)
    key = ("test fp8",)
    gemm_launch.launch(p, a, b, scales=scales, key=key)
    recipe = gemm_launch.recipe(p, a, b, None, scales, key=key)
    recipe(a, b, None, scales)
    (_, g1, args1, kw1), (_, g2, args2, kw2) = recorder.calls
    assert g1 == g2 and kw1 == kw2
    assert args1[:2] == args2[:2] and args1[3:6] == args2[3:6] and args1[7:] == args2[7:]
    assert args1[7][1] == scales[0].data_ptr() and args1[8][1] == scales[1].data_ptr()


@pytest.mark.parametrize("what", ["copy_a", "operand_dtype", "bias_dtype", "c_dtype", "batched", "scales", "off"])
def test_gluon_gemm_recipe_refused_where_the_general_path_converts(recorder, what):
    M, N, K = 16, 32, 32
    a = torch.randn(2, M, K, dtype=torch.bfloat16) if what == "batched" else torch.randn(M, K, dtype=torch.bfloat16)
    b = torch.randn(K, N, dtype=torch.bfloat16)
    fields = dict(copy_a=what == "copy_a", operand_dtype=torch.float16 if what == "operand_dtype" else None,
                  bias_dtype=torch.float32 if what == "bias_dtype" else None)
    p = Plan("gluon", out_dtype=torch.bfloat16, config=configs.GLUON_BF16, grid=(2,), units=2, has_bias=True,
             c_dtype=torch.float32 if what == "c_dtype" else torch.bfloat16, **fields)
    scales = (torch.rand(M, 1, dtype=torch.float64), torch.rand(1, N)) if what == "scales" else None
    if what == "off":
        tiles_launch.keep_op_recipes(False)
    assert gemm_launch.recipe(p, a, b, torch.randn(N, dtype=torch.bfloat16), scales, key=("k",)) is False


def test_gemm_op_reaches_the_recipe_on_a_keys_second_call(recorder, monkeypatch):
    """gemm() with a key: the first call plans and launches (general path) and keeps the recipe; the second goes
    through the recipe alone (no plan read); each launch hands the kernel the same arguments but C."""
    M, N, K = 32, 64, 32
    a, b = torch.randn(M, K, dtype=torch.bfloat16), torch.randn(K, N, dtype=torch.bfloat16)
    p = _plan(M, N, K, False, False)
    monkeypatch.setattr(gemm_op.dispatch, "eager_mode", lambda *tensors: "direct")
    monkeypatch.setattr(gemm_op, "signature", lambda *items: ("cpu key",) + tuple(
        (t.shape, t.stride(), t.dtype) if isinstance(t, torch.Tensor) else t for t in items))
    monkeypatch.setattr(gemm_op.plan, "plan", lambda *args, **kwargs: p)
    gemm_op._PLANS.clear()
    gemm_op._GEMMS.clear()
    general = []
    plain = gemm_launch.launch
    monkeypatch.setattr(gemm_launch, "launch", lambda *args, **kwargs: general.append(1) or plain(*args, **kwargs))
    c1 = gemm_op.gemm(a, b)
    c2 = gemm_op.gemm(a, b)
    assert len(general) == 1  # the second call: the recipe alone
    first, second = (call[2] for call in recorder.calls)
    assert len(recorder.calls) == 2 and first[:2] == second[:2] and first[3:6] == second[3:6] and first[9:] == second[9:]
    assert c1.shape == c2.shape == (M, N)
    gemm_op._PLANS.clear()
    gemm_op._GEMMS.clear()


# ---- the norm forward's NormForward (tl kernels: under Triton's interpreter, bit for bit against the plain call)


@pytest.mark.parametrize("case", ["ln", "rms", "prenorm residual", "3-D", "dropout", "stats kernel", "row stride"])
def test_norm_recipe_gives_the_plain_calls_bits(monkeypatch, case):
    from tilecore.ops.norm import configs as norm_configs, launch as norm_launch, op as norm_op

    def clear():
        for cache in (norm_op._CHECKED, norm_op._PLANS, norm_op._FORWARDS, norm_launch._FORWARD_OPTIONS):
            cache.clear()

    clear()
    if case == "stats kernel":  # rows wider than a tile: the stats kernel first
        monkeypatch.setattr(norm_configs, "WHOLE_ROW_MAX", 32)
    served = []
    call = norm_launch.NormForward.__call__
    monkeypatch.setattr(norm_launch.NormForward, "__call__", lambda self, *a: served.append(1) or call(self, *a))
    torch.manual_seed(0)
    n = 48
    shape = (2, 3, n) if case == "3-D" else (6, n)
    xs = [torch.randn(shape, dtype=torch.float16) for _ in range(4)]
    if case == "row stride":
        xs = [torch.randn(6, 2 * n, dtype=torch.float16)[:, :n] for _ in range(4)]
    w, b = torch.randn(n, dtype=torch.float16), torch.randn(n, dtype=torch.float16)
    res = torch.randn(shape, dtype=torch.float32) if case == "prenorm residual" else None
    kw = dict(rms=case == "rms", prenorm=case == "prenorm residual", residual=res,
              dropout_p=0.25 if case == "dropout" else 0.0)
    runs = []
    for sig in (_cpu_signature, lambda *items: None):
        monkeypatch.setattr(norm_op, "signature", sig)
        outs = []
        for i, x in enumerate(xs):
            torch.manual_seed(100 + i)  # (the dropout seed: the same draw both ways)
            y = norm_op.layer_norm(x, w, None if case == "rms" else b, **kw)
            outs += list(y) if isinstance(y, tuple) else [y]
        runs.append(outs)
        if sig is _cpu_signature:
            assert len(served) == len(xs) - 1  # every call after the key's first: the recipe
            assert type(norm_op._FORWARDS.get(next(iter(norm_op._FORWARDS._data)))) is norm_launch.NormForward
    assert all(a.shape == c.shape and a.dtype == c.dtype and torch.equal(a, c) for a, c in zip(*runs))
    clear()


def test_norm_recipe_refused_for_a_copy(monkeypatch):
    """A residual op._rows must copy (last dimension strided): no recipe, the general path each call."""
    from tilecore.ops.norm import launch as norm_launch, op as norm_op

    norm_op._FORWARDS.clear()
    monkeypatch.setattr(norm_op, "signature", _cpu_signature)
    x = torch.randn(4, 32, dtype=torch.float16)
    res = torch.randn(32, 4, dtype=torch.float16).t()  # stride (1, 4): _rows copies it
    for _ in range(3):
        norm_op.layer_norm(x, None, residual=res)
    assert list(norm_op._FORWARDS._data.values())[0][0] is False
    norm_op._FORWARDS.clear()


# ---- linear_attention_step's _LaStep (the tl step kernel: interpreter, bit for bit against the plain call)


@pytest.mark.parametrize("case", ["plain", "token axis", "decay (B, H)", "decay (B, 1, H)", "decay per feature",
                                  "based"])
def test_linear_attention_step_recipe_gives_the_plain_calls_bits(monkeypatch, case):
    from tilecore.ops.linear_attention import op as la_op

    def clear():
        for cache in (la_op._CHECKED, la_op._PLANS, la_op._LA_STEPS):
            cache.clear()

    clear()
    served = []
    call = la_op._LaStep.__call__
    monkeypatch.setattr(la_op._LaStep, "__call__", lambda self, *a: served.append(1) or call(self, *a))
    torch.manual_seed(3)
    B, H, Hqk, D = 2, 4, 2, 16 if case != "based" else 4
    Dv = 16
    token = case == "token axis" or case == "decay (B, 1, H)"
    F = 1 + D + D * D if case == "based" else D
    calls = []
    for _ in range(3):
        shape_qk, shape_v = ((B, 1, Hqk, D), (B, 1, H, Dv)) if token else ((B, Hqk, D), (B, H, Dv))
        q, k = torch.randn(shape_qk, dtype=torch.float16), torch.randn(shape_qk, dtype=torch.float16)
        v = torch.randn(shape_v, dtype=torch.float16)
        decay = {"decay (B, H)": lambda: -torch.rand(B, H), "decay (B, 1, H)": lambda: -torch.rand(B, 1, H),
                 "decay per feature": lambda: -torch.rand(B, H, D)}.get(case, lambda: None)()
        calls.append((q, k, v, decay))
    state0 = torch.randn(B, H, F, Dv)
    runs = []
    for sig in (_cpu_signature, lambda *items: None):
        monkeypatch.setattr(la_op, "signature", sig)
        state = state0.clone()
        outs = []
        for q, k, v, decay in calls:
            outs.append(la_op.linear_attention_step(q, k, v, state, decay=decay,
                                                    feature_map="based" if case == "based" else None))
        runs.append(outs + [state])
        if sig is _cpu_signature:
            assert len(served) == len(calls) - 1
    assert all(a.shape == c.shape and a.dtype == c.dtype and torch.equal(a, c) for a, c in zip(*runs))
    clear()


@pytest.mark.parametrize("case", ["plain", "grad", "scalar decay grad", "states", "channel decay"])
def test_linear_attention_tl_forward_recipe_gives_the_plain_calls_bits(monkeypatch, case):
    """linear_attention's tl forward kept per launch key (launch.TlForward, session 35): every call after the key's
    first launches through it (eager, and recording a gradient: its own key), with the plain calls' bits for the
    output, the final state and the gradients; per-channel decay (its GL keyword tensor) keeps forward_call."""
    from tilecore.ops.linear_attention import launch as la_launch, op as la_op

    def clear():
        for cache in (la_op._CHECKED, la_op._PLANS, la_launch._TL_FORWARDS, la_launch._GLUON_FITS):
            cache.clear()

    clear()
    served = []
    call = la_launch.TlForward.__call__
    monkeypatch.setattr(la_launch.TlForward, "__call__", lambda self, *a: served.append(1) or call(self, *a))
    torch.manual_seed(4)
    B, N, H, D = 1, 40, 2, 16
    grad = "grad" in case
    calls = []
    for _ in range(3):
        q, k, v = (torch.randn(B, N, H, D, dtype=torch.float16) for _ in range(3))
        g = {"scalar decay grad": lambda: -torch.rand(B, N, H), "channel decay": lambda: -torch.rand(B, N, H, D)
             }.get(case, lambda: None)()
        h0 = torch.randn(B, H, D, D) if case == "states" else None
        calls.append((q, k, v, g, h0, torch.randn(B, N, H, D, dtype=torch.float16)))
    runs = []
    for sig in (_cpu_signature, lambda *items: None):
        monkeypatch.setattr(la_op, "signature", sig)
        outs = []
        for q, k, v, g, h0, do in calls:
            leaves = [t.clone().requires_grad_(grad) if t is not None else None for t in (q, k, v, g)]
            y = la_op.linear_attention(*leaves[:3], decay=leaves[3], initial_state=h0,
                                       return_final_state=case == "states")
            o = y[0] if isinstance(y, tuple) else y
            outs += [o.detach()] + ([y[1]] if isinstance(y, tuple) else [])
            if grad:
                o.backward(do)
                outs += [t.grad for t in leaves if t is not None]
        runs.append(outs)
        if sig is _cpu_signature:
            kept = [entry[0] for entry in la_launch._TL_FORWARDS._data.values()]
            if case == "channel decay":
                assert kept == [False] and not served
            else:
                assert [type(r) for r in kept] == [la_launch.TlForward] and len(served) == len(calls) - 1
    assert all(a.shape == c.shape and a.dtype == c.dtype and torch.equal(a, c) for a, c in zip(*runs))
    clear()


# ---- linear_attention's GluonForward (the Gluon kernel cannot run here: its launcher recorded, the recipe against
# gluon_forward_keyed's own launch)


class LaRecorder(Recorder):
    def __init__(self, real):
        super().__init__()
        self._signature = real._load_signature()

    def _load_signature(self):
        return self._signature

    def run(self, key, grid, args, kwargs):
        flags, named = self._signature
        ordered = list(args) + [kwargs.get(name, default) for name, default in named[len(args):]]
        kw = {k: v for k, v in kwargs.items() if k not in dict(named) or k == "num_warps"}
        kw.update({name: v for (name, _), v, c in zip(named, ordered, flags) if c})
        self.calls.append((key, tuple(grid) + (1,) * (3 - len(grid)),
                           tuple(self._arg(a) for a, c in zip(ordered, flags) if not c), kw))


@pytest.mark.parametrize("states", [False, True])
def test_linear_attention_gluon_recipe_launches_what_gluon_forward_keyed_launches(monkeypatch, states):
    from tilecore.ops.linear_attention import launch as la_launch

    rec = LaRecorder(la_launch._GLUON_FORWARD)
    monkeypatch.setattr(la_launch, "_GLUON_FORWARD", rec)
    la_launch.GLUON_FORWARDS.clear()
    B, N, Hqk, H, D = 2, 128, 2, 4, 64
    q, k = (torch.randn(B, N, Hqk, D, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(B, N, H, D, dtype=torch.bfloat16)
    h0 = torch.randn(B, H, D, D) if states else None
    key = ("linear_attention", "test", states)
    o1, ht1 = la_launch.gluon_forward_keyed(key, q, k, v, None, None, None, None, h0, 0.125, states, 2)
    recipe = la_launch.GLUON_FORWARDS.get(key)
    assert type(recipe) is la_launch.GluonForward
    o2, ht2 = recipe(q, k, v, h0)
    (k1, g1, args1, kw1), (k2, g2, args2, kw2) = rec.calls
    assert k1 == k2 == key and g1 == g2 and kw1 == kw2
    assert o1.shape == o2.shape and o1.dtype == o2.dtype and (ht1 is None) == (ht2 is None) == (not states)
    outs = {o1.data_ptr(): "o", o2.data_ptr(): "o"}
    if states:
        outs.update({ht1.data_ptr(): "ht", ht2.data_ptr(): "ht"})
    # each argument the same (its own call's o / final state where it is one; the unread placeholder kept)
    norm = lambda a: (a[0], outs.get(a[1], a[1]), *a[2:]) if isinstance(a, tuple) else a
    assert [norm(a) for a in args1] == [norm(a) for a in args2]
    la_launch.GLUON_FORWARDS.clear()


@pytest.mark.parametrize("what", ["decay", "z", "off"])
def test_linear_attention_gluon_recipe_only_without_decay_beta_d_z(monkeypatch, what):
    from tilecore.ops.linear_attention import launch as la_launch

    rec = LaRecorder(la_launch._GLUON_FORWARD)
    monkeypatch.setattr(la_launch, "_GLUON_FORWARD", rec)
    la_launch.GLUON_FORWARDS.clear()
    B, N, H, D = 1, 64, 2, 64
    q, k, v = (torch.randn(B, N, H, D, dtype=torch.bfloat16) for _ in range(3))
    g = -torch.rand(B, N, H) if what == "decay" else None
    z = torch.randn(B, N, H, D, dtype=torch.bfloat16) if what == "z" else None
    if what == "off":
        tiles_launch.keep_op_recipes(False)
    try:
        la_launch.gluon_forward_keyed(("k", what), q, k, v, g, None, None, z, None, 0.125, False, 2)
    finally:
        tiles_launch.keep_op_recipes(True)
    assert not la_launch.GLUON_FORWARDS.get(("k", what))
    la_launch.GLUON_FORWARDS.clear()


# ---- attention's Gluon forward (GluonForward; the kernel's launcher recorded, against launch_forward_gluon)


@pytest.mark.parametrize("case", ["plain", "causal gqa", "window softcap", "other scale"])
def test_attention_gluon_recipe_launches_what_launch_forward_gluon_launches(monkeypatch, case):
    import dataclasses

    from tilecore import dispatch
    from tilecore.ops.attention import configs as aconfigs, launch as alaunch, plan as aplan

    monkeypatch.setattr(dispatch, "num_sms", lambda device: 132)
    rec = Recorder()
    monkeypatch.setattr(alaunch, "GLUON_FWD", rec)
    alaunch._GLUON_FORWARDS.clear()
    B, H, Hkv, N, D = 2, 4, 2 if case == "causal gqa" else 4, 256, 64
    q = torch.randn(B, H, N, D, dtype=torch.bfloat16)
    k, v = (torch.randn(B, Hkv, N, D, dtype=torch.bfloat16) for _ in range(2))
    causal = case == "causal gqa"
    window = (100, 0) if case == "window softcap" else (-1, -1)
    softcap = 30.0 if case == "window softcap" else 0.0
    p = aplan.plan_forward(q, k, v, causal, 0.125, window=window, softcap=softcap, path="gluon",
                           config=aconfigs.gluon_forward_config(D, N, N, causal))
    p = dataclasses.replace(p, launch_key=("attention test", case))
    out = torch.empty(B, H, N, D, dtype=torch.bfloat16)
    lse = torch.empty(B, H, N)
    scale = 0.3 if case == "other scale" else 0.125  # (the key holds its sign only: the recipe takes each call's)
    alaunch.launch_forward_gluon(p, q, k, v, out, lse, causal, scale, window, softcap)
    recipe = alaunch.gluon_prepared(p, q, k, v, causal, window, softcap)
    assert type(recipe) is alaunch.GluonForward
    out2, lse2 = recipe.outputs(q, k, v, scale, softcap)
    (k1, g1, args1, kw1), (k2, g2, args2, kw2) = rec.calls
    assert k1 == k2 == p.launch_key and g1 == g2 and kw1 == kw2
    assert out2.shape == out.shape and out2.dtype == out.dtype and lse2.shape == lse.shape and lse2.dtype == lse.dtype
    mine = {out.data_ptr(): "out", out2.data_ptr(): "out", lse.data_ptr(): "lse", lse2.data_ptr(): "lse"}
    norm = lambda a: (a[0], mine.get(a[1], a[1]), *a[2:]) if isinstance(a, tuple) else a
    assert [norm(a) for a in args1] == [norm(a) for a in args2]
    alaunch._GLUON_FORWARDS.clear()


def test_attention_gluon_recipe_refused_for_split_boxes_and_off(monkeypatch):
    import dataclasses

    from tilecore import dispatch
    from tilecore.ops.attention import configs as aconfigs, launch as alaunch, plan as aplan

    monkeypatch.setattr(dispatch, "num_sms", lambda device: 132)
    q = torch.randn(1, 2, 128, 64, dtype=torch.bfloat16)
    p = aplan.plan_forward(q, q, q, False, 0.125, path="gluon", config=aconfigs.gluon_forward_config(64, 128, 128, False))
    assert alaunch.GluonForward.of(dataclasses.replace(p, launch_key=None), q, q, q, False, (-1, -1), 0.0) is False
    split = dataclasses.replace(p, launch_key=("k",), config=dict(p.config, qk_pieces=3))
    assert alaunch.GluonForward.of(split, q, q, q, False, (-1, -1), 0.0) is False
    tiles_launch.keep_op_recipes(False)
    try:
        assert alaunch.gluon_prepared(dataclasses.replace(p, launch_key=("k",)), q, q, q, False, (-1, -1), 0.0) is None
    finally:
        tiles_launch.keep_op_recipes(True)


@pytest.mark.parametrize("case", ["ln", "rms", "rms prenorm residual", "rms create_graph"])
def test_norm_recipe_on_the_recorded_gradient_path(monkeypatch, case):
    """layer_norm recording a gradient (tiles.eager's Function) launches through the key's NormForward.outputs from
    its second call: outputs and every gradient the plain calls' bits. The recipe's outputs have None for an unstored
    h and RMSNorm's mean (the general path: empty tensors); "create_graph": the backward through the backward op
    (tiles.eager.backward_call's op path, whose schema takes the mean as Optional)."""
    from tilecore.ops.norm import launch as norm_launch, op as norm_op

    for cache in (norm_op._CHECKED, norm_op._PLANS, norm_op._FORWARDS, norm_launch._FORWARD_OPTIONS):
        cache.clear()
    served = []
    outputs = norm_launch.NormForward.outputs
    monkeypatch.setattr(norm_launch.NormForward, "outputs", lambda self, *a: served.append(1) or outputs(self, *a))
    torch.manual_seed(5)
    n = 32
    shape = (2, 3, n)
    xs = [torch.randn(shape, dtype=torch.float16) for _ in range(3)]
    w, b = torch.randn(n, dtype=torch.float16), torch.randn(n, dtype=torch.float16)
    res = torch.randn(shape, dtype=torch.float16) if case != "ln" else None
    g = torch.randn(shape, dtype=torch.float16)
    runs = []
    for sig in (_cpu_signature, lambda *items: None):
        monkeypatch.setattr(norm_op, "signature", sig)
        outs = []
        for x in xs:
            leaves = [t.clone().requires_grad_() for t in (x, w, b) + ((res,) if res is not None else ())]
            y = norm_op.layer_norm(leaves[0], leaves[1], None if "rms" in case else leaves[2],
                                   residual=leaves[3] if res is not None else None, rms="rms" in case,
                                   prenorm="prenorm" in case)
            y = y[0] + y[1].to(y[0].dtype) if isinstance(y, tuple) else y
            y.backward(g, create_graph="create_graph" in case)
            outs += [y.detach()] + [t.grad.detach() for t in leaves if t.grad is not None]
        runs.append(outs)
        if sig is _cpu_signature:
            assert len(served) == len(xs) - 1
    assert all(a.shape == c.shape and torch.equal(a, c) for a, c in zip(*runs))
    for cache in (norm_op._CHECKED, norm_op._PLANS, norm_op._FORWARDS, norm_launch._FORWARD_OPTIONS):
        cache.clear()


def test_the_forward_recipes_wait_for_their_switch(monkeypatch):
    import dataclasses

    from tilecore import dispatch
    from tilecore.ops.attention import configs as aconfigs, launch as alaunch, plan as aplan

    monkeypatch.setattr(dispatch, "num_sms", lambda device: 132)
    q = torch.randn(1, 2, 128, 64, dtype=torch.bfloat16)
    p = aplan.plan_forward(q, q, q, False, 0.125, path="gluon", config=aconfigs.gluon_forward_config(64, 128, 128, False))
    tiles_launch.keep_forward_recipes(False)
    assert alaunch.gluon_prepared(dataclasses.replace(p, launch_key=("k",)), q, q, q, False, (-1, -1), 0.0) is None
