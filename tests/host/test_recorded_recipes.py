"""Per-key recipes for eager calls that record a gradient (issue 31's host time): fft_conv's filter form
under autograd launches by the key's _GluonConv (fft_conv op.RECORDED_RECIPES) what its general path launches. The
Gluon kernel cannot be interpreted: its launches are recorded, the plan stands in for the H100's."""
import pytest
import torch

from host_testing import clear_fft_conv as _clear
from host_testing import fft_conv_on_gluon
from host_testing import plain_signature as _signature
from tilecore.ops.fft_conv import launch as conv_launch
from tilecore.ops.fft_conv import op as fft_op
from tilecore.tiles import launch
from tilecore.tiles.switches import patched


def test_fft_conv_recorded_calls_launch_by_the_recipe_what_the_general_path_launches(monkeypatch):
    """Three recorded-gradient calls of one key with RECORDED_RECIPES on (the first general and keeping the recipe,
    the rest through it) against the same calls unkeyed: the same kernel, grid, options and arguments (u itself, y
    fresh, the same spectrum, tables and strides; the descriptors of the same views); the recipe's calls make no
    plan. Off, the key keeps no recipe from recorded calls."""
    plans = []
    calls = fft_conv_on_gluon(monkeypatch, plans=plans).calls
    torch.manual_seed(6)
    B, H, n = 4, 2, 1024
    inputs = [(torch.randn(B, H, n).to(torch.bfloat16).requires_grad_(), torch.randn(H, 300).requires_grad_())
              for _ in range(3)]
    with patched(fft_op, RECORDED_RECIPES=False):
        fft_op.fft_conv(*inputs[0])
        assert len(fft_op._GLUON_CONVS) == 0
    _clear()
    with patched(fft_op, RECORDED_RECIPES=True):
        calls.clear()
        for i, (u, k) in enumerate(inputs):
            plans.clear()
            y = fft_op.fft_conv(u, k)
            assert y.grad_fn is not None and y.shape == u.shape and y.dtype == u.dtype
            assert len(plans) == (1 if i == 0 else 0)  # (the recipe's calls: no plan)
        assert len(fft_op._GLUON_CONVS) == 1 and next(iter(fft_op._GLUON_CONVS._data.values()))[0]
        keyed = calls[:]
        monkeypatch.setattr(fft_op, "signature", lambda *items: None)
        for u, k in inputs:
            fft_op.fft_conv(u, k)
    plain = calls[len(keyed):]
    assert len(keyed) == len(plain) == 3
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
    _clear()


@pytest.mark.parametrize("k_dtype", [torch.float32, torch.bfloat16])
def test_fft_conv_recipe_pads_by_cat_to_the_same_spectrum(monkeypatch, k_dtype):
    """fft_conv's keyed Gluon call (op._GluonConv) with PAD_BY_CAT on hands its launch the spectrum rfft(k.float(),
    n=2N) gives, bit for bit (k 16-bit or float32, a -0.0 among its taps), as the switch off does; a spectrum given by
    the caller is read as it is (no zeros kept)."""
    calls = fft_conv_on_gluon(monkeypatch).calls  # (nothing kept: the spectrum goes as a tensor, args[1])
    torch.manual_seed(8)
    u = torch.randn(2, 3, 1024).to(torch.bfloat16)
    k = torch.randn(3, 300).to(k_dtype)
    k[1, 7] = -0.0
    for _ in range(2):  # the key's first call (general) keeps the recipe
        fft_op.fft_conv(u, k)
    recipe = next(iter(fft_op._GLUON_CONVS._data.values()))[0]
    assert recipe and recipe.zeros.shape == (3, 2048 - 300) and recipe.zeros.dtype == torch.float32
    assert not recipe.zeros.any()
    fft_op.fft_conv(torch.randn(5, 3, 1024).to(torch.bfloat16), k)  # another batch: another key, the same zeros
    fft_op.fft_conv(torch.randn(5, 3, 1024).to(torch.bfloat16), k)
    assert len(fft_op._GLUON_CONVS) == 2 and all(
        entry[0].zeros is recipe.zeros for entry in fft_op._GLUON_CONVS._data.values())
    calls.clear()
    for on in (True, False):
        with patched(fft_op, PAD_BY_CAT=on):
            fft_op.fft_conv(u, k)
    on, off = (args[1] for _, _, args, _ in calls)
    assert torch.equal(on.view(torch.int32), off.view(torch.int32))
    assert torch.equal(torch.view_as_real(fft_op.filter_spectrum(k, 1024)).reshape(on.shape), on)
    _clear()
    spectrum = fft_op.filter_spectrum(k, 1024)
    for _ in range(2):
        fft_op.fft_conv(u, spectrum)
    assert next(iter(fft_op._GLUON_CONVS._data.values()))[0].zeros is None
    _clear()


# ---- layer_norm's recorded recipe (norm op.RECORDED_RECIPES: _RecordedFunction over the key's NormForward; tl
# kernels, so under Triton's interpreter bit for bit against the general path's Function)

NORM_CASES = {  # name: (x's shape, rms, weight, bias, residual dtype or None, dropout_p, prenorm, loss uses h)
    "ln": ((6, 32), False, True, True, None, 0.0, False, False),
    "rms": ((6, 32), True, True, False, None, 0.0, False, False),
    "rms 3-D no weight": ((2, 3, 32), True, False, False, None, 0.0, False, False),
    "prenorm residual, h used": ((2, 3, 32), True, True, False, torch.float16, 0.0, True, True),
    "prenorm residual, h unused": ((6, 32), False, True, True, torch.float16, 0.0, True, False),
    "prenorm without residual": ((2, 3, 32), True, True, False, None, 0.0, True, True),
    "float32 residual": ((6, 32), True, True, False, torch.float32, 0.0, False, False),
    "dropout, prenorm": ((2, 3, 32), False, True, True, torch.float16, 0.25, True, True),
    "create_graph": ((6, 32), True, True, False, torch.float16, 0.0, True, True),
    "ln, rows in two passes (row sums)": ((6, 40), False, True, True, None, 0.0, False, False),
}


def _norm_caches():
    from tilecore.ops.norm import launch as norm_launch, op as norm_op
    return (norm_op._CHECKED, norm_op._PLANS, norm_op._FORWARDS, norm_launch._FORWARD_OPTIONS,
            norm_launch._BACKWARD_RECIPES)


@pytest.mark.parametrize("backward_recipes", [False, True])
@pytest.mark.parametrize("case", list(NORM_CASES))
def test_norm_recorded_recipe_gives_the_general_paths_bits(monkeypatch, case, backward_recipes):
    """Four recorded-gradient calls of one key with the recipe on (the first general, keeping the NormForward; the rest
    through _RecordedFunction) against the same calls with it off (the general path's Function over NormForward.outputs)
    and unkeyed: y, h and every gradient the same bits, the same dtypes and shapes; the recipe's outputs' grad_fn is
    its own; the backward's launch keys are those eager.backward_key gives (kept while dy's layout repeats). With
    BACKWARD_RECIPES the recipe's backwards after its first launch by the backward key's launch.NormBackward (not
    with create_graph, whose backward is recorded through the op)."""
    from tilecore.ops.norm import launch as norm_launch
    from tilecore.ops.norm import op as norm_op
    from tilecore.tiles import eager

    shape, rms, has_w, has_b, res_dtype, p, prenorm, use_h = NORM_CASES[case]
    n = shape[-1]
    if "two passes" in case:  # (rows wider than WHOLE_ROW_MAX: the stats and row-sums kernels, small)
        from tilecore.ops.norm import configs as norm_configs
        monkeypatch.setattr(norm_configs, "WHOLE_ROW_MAX", 16)
    torch.manual_seed(11)
    xs = [torch.randn(shape, dtype=torch.float16) for _ in range(4)]
    w = torch.randn(n, dtype=torch.float16) if has_w else None
    b = torch.randn(n, dtype=torch.float16) if has_b else None
    res = torch.randn(shape, dtype=res_dtype) if res_dtype is not None else None
    gy, gh = torch.randn(shape, dtype=torch.float16), torch.randn(shape, dtype=res_dtype or torch.float16)
    served, backward_keys = [], []
    forward, backward_key = norm_op._Recorded.backward_key, eager.backward_key
    monkeypatch.setattr(norm_op._Recorded, "backward_key",
                        lambda self, dy, dh: backward_keys.append((forward(self, dy, dh), backward_key(self, dy, dh)))
                        or backward_keys[-1][0])
    monkeypatch.setattr(eager, "signature", _signature)
    recipe_backwards, general_backwards = [], []
    recipe_call, general = norm_launch.NormBackward.__call__, norm_launch.backward
    monkeypatch.setattr(norm_launch.NormBackward, "__call__",
                        lambda self, *a: recipe_backwards.append(self.sums is not None) or recipe_call(self, *a))
    # (launch.backward builds its launches through a NormBackward too: the recipe's own backwards are the rest)
    monkeypatch.setattr(norm_launch, "backward", lambda *a, **k: general_backwards.append(1) or general(*a, **k))

    def calls(on: bool, sig):
        monkeypatch.setattr(norm_op, "signature", sig)
        for cache in _norm_caches():
            cache.clear()
        outs = []
        recipe_backwards.clear()
        general_backwards.clear()
        with patched(norm_op, RECORDED_RECIPES=on, BACKWARD_RECIPES=on and backward_recipes):
            for i, x in enumerate(xs):
                leaves = [t.clone().requires_grad_() if t is not None else None for t in (x, w, b, res)]
                torch.manual_seed(100 + i)  # (the dropout seed: the same draw every way)
                out = norm_op.layer_norm(leaves[0], leaves[1], leaves[2], residual=leaves[3], rms=rms, dropout_p=p,
                                         prenorm=prenorm)
                y, h = out if prenorm else (out, None)
                if type(y.grad_fn).__name__ == "_RecordedFunctionBackward":
                    served.append(i)
                loss = (y.float() * gy).sum() + ((h.float() * gh).sum() if use_h else 0)
                loss.backward(create_graph=case == "create_graph")
                outs += [y.detach(), None if h is None else h.detach()]
                outs += [None if t is None else t.grad.detach() for t in leaves]
        return outs

    recipe = calls(True, _signature)
    assert served == list(range(1, len(xs)))  # (every call after the key's first)
    # (the recorded recipe's first backward goes the general way and keeps the NormBackward; the rest launch by it,
    # but where a stored h's gradient comes (dh_out) and under create_graph)
    dh_out = use_h and prenorm and (res_dtype is not None or p > 0)
    expected = len(xs) - 2 if backward_recipes and case != "create_graph" and not dh_out else 0
    assert len(recipe_backwards) == len(xs) and len(general_backwards) == len(xs) - expected
    assert all(two == ("two passes" in case) for two in recipe_backwards)
    assert len(backward_keys) == len(xs) - 1 and all(kept == fresh and kept is not None for kept, fresh in backward_keys)
    for on, sig in ((False, _signature), (True, lambda *items: None)):
        served.clear()
        other = calls(on, sig)
        # (neither the switch off nor an unkeyed call reaches the recipe's own backward: every one the general path's)
        assert served == [] and len(general_backwards) == len(xs)
        for a, c in zip(recipe, other):
            assert (a is None) == (c is None)
            if a is not None:
                assert a.shape == c.shape and a.dtype == c.dtype and torch.equal(a, c)
    for cache in _norm_caches():
        cache.clear()


@pytest.mark.parametrize("needs", ["both", "u", "k"])
def test_fft_conv_recorded_function_launches_and_differentiates_as_the_general_path(monkeypatch, needs):
    """fft_conv's RECORDED_FUNCTION: a keyed filter-form call recording a gradient whose key keeps a _GluonConv
    applies _RecordedConv from fft_conv: the recipe's launch (the kernel, grid, options and arguments the general
    path's Function launches), one autograd node, and a backward that hands the general Function's backward the same
    saved u and k, dy and needs_input_grad as that Function does, its (du, dk) reaching the leaves. Off: the general
    Function."""
    backwards = []
    calls = fft_conv_on_gluon(monkeypatch).calls

    def filter_backward(ctx, dy):  # (the general Function's backward: the key's entry, then du and dk)
        u, k = ctx.saved_tensors
        backwards.append((u, k, dy, tuple(ctx.needs_input_grad)))
        return (None, torch.full_like(u, 2.0) if ctx.needs_input_grad[1] else None,
                torch.full_like(k, 3.0) if ctx.needs_input_grad[2] else None)

    monkeypatch.setattr(fft_op._FilterFunction, "backward", staticmethod(filter_backward))
    torch.manual_seed(7)
    u0, k0 = torch.randn(2, 3, 1024).to(torch.bfloat16), torch.randn(3, 200)
    dy = torch.randn(2, 3, 1024).to(torch.bfloat16)
    runs = {}
    for on in (True, False):
        _clear()
        calls.clear()
        backwards.clear()
        with patched(fft_op, RECORDED_FUNCTION=on):
            names, grads = [], []
            for _ in range(3):  # (the key's first call: the general path, keeping the recipe)
                u = u0.clone().requires_grad_(needs in ("both", "u"))
                k = k0.clone().requires_grad_(needs in ("both", "k"))
                y = fft_op.fft_conv(u, k)
                names.append(type(y.grad_fn).__name__)
                y.backward(dy)
                grads.append((u.grad, k.grad))
                assert backwards[-1][0] is u and backwards[-1][1] is k and torch.equal(backwards[-1][2], dy)
        def plain(a):  # (a descriptor by what it describes)
            return (a.shape, a.strides, a.block_shape, a.layout) if isinstance(a, launch.TmaOperand) else a
        runs[on] = ([(tuple(g), [a for a in args if not isinstance(a, torch.Tensor)],
                      {name: plain(a) for name, a in kw.items()}) for _, g, args, kw in calls],
                    [b[3] for b in backwards], grads)
        assert names[1:] == (["_RecordedConvBackward"] * 2 if on else ["_FftConvFunctionBackward"] * 2)
    assert runs[True][0] == runs[False][0] and runs[True][1] == runs[False][1]
    for (du1, dk1), (du0, dk0) in zip(runs[True][2], runs[False][2]):
        assert (du1 is None) == (du0 is None) and (dk1 is None) == (dk0 is None)
        assert (du1 is None or torch.equal(du1, du0)) and (dk1 is None or torch.equal(dk1, dk0))
    _clear()


@pytest.mark.parametrize("needs,k_dtype", [("both", torch.float32), ("u", torch.float32), ("k", torch.float32),
                                           ("both", torch.bfloat16)])
def test_fft_conv_keyed_backward_launches_what_the_general_backward_launches(monkeypatch, needs, k_dtype):
    """fft_conv's KEYED_BACKWARD: a recorded call's backward through its recipe (_RecordedConv) launches du's kernel
    with the grid, options, descriptors' views and arguments (the same spectrum, dy's layout) _filter_backward's
    unkeyed launch has, keyed by the backward's launch key (eager.backward_key of the forward's key and dy); dk the same
    bits (float32 k: torch.fft's; bfloat16 k: the pair kernel's under the interpreter, its launch keyed by (the
    backward key, "dk")); off, _filter_backward's unkeyed launches."""
    from tilecore.tiles import eager

    calls = fft_conv_on_gluon(monkeypatch).calls
    monkeypatch.setattr(eager, "signature", _signature)
    from tilecore.ops.fft_conv import configs as conv_configs
    monkeypatch.setitem(conv_configs.DK_CONFIGS, 1024, (64, 32, 1, 4))  # (the pair kernel's dk at 1024: interpreted)
    dk_keys = []
    run = launch.CachedLaunch.run
    monkeypatch.setattr(conv_launch._dk_pair, "run", lambda key, *a: dk_keys.append(key) or run(conv_launch._dk_pair,
                                                                                               key, *a))
    torch.manual_seed(12)
    u0, k0 = torch.randn(2, 3, 1024).to(torch.bfloat16), torch.randn(3, 200).to(k_dtype)
    dy = torch.randn(2, 3, 1024).to(torch.bfloat16)
    runs = {}
    for on in (True, False):
        _clear()
        launches, dks = [], []
        with patched(fft_op, KEYED_BACKWARD=on):
            for i in range(3):  # (the key's first call: the general path, keeping the recipe; then the recipe's)
                u = u0.clone().requires_grad_(needs in ("both", "u"))
                k = k0.clone().requires_grad_(needs in ("both", "k"))
                y = fft_op.fft_conv(u, k)
                calls.clear()
                y.backward(dy)
                if i:
                    assert type(y.grad_fn).__name__ == "_RecordedConvBackward"
                    launches.append(list(calls))
                    dks.append(k.grad)
                    assert (u.grad is None) == (needs == "k")
        runs[on] = launches, dks
    for keyed, plain in zip(runs[True][0], runs[False][0]):
        assert len(keyed) == len(plain) == (0 if needs == "k" else 1)  # (du's launch; the spectrum: args[1])
        for (key1, grid1, args1, kw1), (key0, grid0, args0, kw0) in zip(keyed, plain):
            assert key0 is None and key1[0][0] == "backward" and key1[1:] == (True, False)
            assert tuple(grid0) == tuple(grid1) and len(args0) == len(args1) and set(kw0) == set(kw1)
            assert torch.equal(args0[0], dy) and torch.equal(args1[0], dy)
            for i, (a, b) in enumerate(zip(args0, args1)):
                if isinstance(a, torch.Tensor):
                    assert a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
                    assert i == 2 or torch.equal(a, b)  # (du: fresh each call)
                else:
                    assert a == b
            for name in kw0:
                a, b = kw0[name], kw1[name]
                if isinstance(a, launch.TmaOperand):
                    assert (a.shape, a.strides, a.block_shape, a.layout) == (b.shape, b.strides, b.block_shape,
                                                                             b.layout)
                else:
                    assert a == b
    if k_dtype == torch.bfloat16:  # (the first backward general, the recipe's two keyed; then three unkeyed)
        assert [key is None for key in dk_keys] == [True, False, False, True, True, True]
        assert all(key[1] == "dk" and key[0][0] == "backward" for key in dk_keys if key is not None)
    for dk1, dk0 in zip(*(runs[on][1] for on in (True, False))):
        assert (dk1 is None) == (dk0 is None) == (needs == "u")
        assert dk1 is None or (dk1.dtype == dk0.dtype and torch.equal(dk1, dk0))
    _clear()

