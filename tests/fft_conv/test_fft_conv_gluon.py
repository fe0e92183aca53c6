"""The one-pass FFT convolution in Gluon (tilecore/ops/fft_conv/gluon_onepass.py). Gluon is not
interpretable, so: the kernel compiles for sm_90a (wgmma, no spill, within shared memory; ASYNC issues
each complex product's wgmmas together), its arithmetic step for step in torch (``emulate``: the same
tables, roundings and signs) matches float64 at the floor, its host launch binds every kernel argument
with the tile-ordered spectrum, and the plan takes it only behind configs.GLUON_ONEPASS on a Hopper.
Its tl twin (kernels_mono.py at the same factors, kfull) is tested in test_fft_conv_mono.py."""
import math

import pytest
import torch

from tilecore import accuracy, dispatch
from tilecore.ops.fft_conv import configs, fft_conv_reference, filter_spectrum, gluon_emulate, gluon_onepass
from tilecore.ops.fft_conv import launch as conv_launch
from tilecore.ops.fft_conv import plan as conv_plan
from tilecore.tiles.launch import TmaOperand
from compiled_run import compiled_json

CODE = """
import json, re
from tilecore.ops.fft_conv.report import gluon_variant
from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources
out = []
for a, b, asynchronous, tma, chunk, rfft, groups, sfu, contig, kpre, yalias, lean, maxnreg in (
        (32, 64, False, False, 0, False, 1, False, False, 0, False, 0, 0),
        (32, 64, True, True, 0, True, 1, False, False, 0, False, 0, 0),
        (32, 64, False, True, 0, 2, 1, True, True, 3, False, 0, 0),
        (32, 64, False, True, 0, 2, 1, True, False, 2, False, 3, 168)):
    name, kernel, args, warps, _ = gluon_variant(a, b, 0, asynchronous, tma, chunk, rfft, groups, 4, sfu, contig, kpre,
                                                 yalias, lean, maxnreg)
    compiled = compile_kernel(kernel, args, num_warps=warps, **({"maxnreg": maxnreg} if maxnreg else {}))
    ptx = compiled.asm["ptx"]
    out.append(dict(name=name, sins=len(re.findall(r"sin\\.approx", ptx)), waits=len(re.findall(r"wgmma\\.wait_group", ptx)),
                    cp_async=len(re.findall(r"cp\\.async\\.ca\\.shared\\.global \\[[^]]*\\], \\[[^]]*\\], 0x8", ptx)),
                    cp_wait=len(re.findall(r"cp\\.async\\.wait_group", ptx)),
                    mmas=len(re.findall(r"wgmma\\.mma_async", ptx)), **vars(resources(compiled)),
                    **has_hopper_instructions(ptx)))
print(json.dumps(out))
"""


def test_compiles_for_hopper_with_wgmma_and_no_spill():
    sync, tma, kept, three = compiled_json(CODE, timeout=600)
    for row in (sync, tma, kept, three):
        assert row["wgmma"] and not row["wgmma_serialized"], row
        assert row["spill_stores"] == 0 and row["spill_loads"] == 0, row
        assert row["shared"] <= 227 * 1024, row
    assert sync["shared"] <= 48 * 1024 and sync["registers"] <= 168, sync  # 3 programs a multiprocessor
    assert tma["registers"] <= 168, tma
    # ASYNC: one wait a complex product (4 of them a pair), not one a wgmma
    assert tma["waits"] < sync["waits"], (tma, sync)
    # TMA: u and y by cp.async.bulk.tensor (the next pair's u on an mbarrier)
    assert not sync["tma"] and tma["tma"] and tma["mbarrier"], tma
    assert tma["shared"] <= 56 * 1024, tma
    assert sync["threads"] == tma["threads"] == 128, (sync, tma)
    # TW_SFU: the twiddles by sin.approx (forward and inverse); read from the table without it (4096's chunked kernel:
    # test_transposed_chunks_compile_with_register_operands)
    assert sync["sins"] == 0 and kept["sins"] > 0, kept
    # KPRE: the spectrum's bins gathered by 64-bit cp.async (a [64, C] int64 tile: 32 x 64 at 1024, 16 a thread) and
    # waited for before the product; none without it; 1024 kept at 2 programs a multiprocessor
    assert kept["cp_async"] == 16 and kept["cp_wait"] >= 1 and kept["registers"] <= 255, kept
    assert sync["cp_async"] == tma["cp_async"] == 0, tma
    # LEAN 3 (one reduction for u's scales and flags, one for the spectrum product's, x read in the wgmma's layout)
    # with KPRE 2 fits ptxas's cap of 168 registers without spill: 3 programs of 128 threads a multiprocessor (x 66
    # KiB of shared memory)
    assert three["registers"] <= 168 and 3 * three["shared"] <= 227 * 1024 and three["cp_async"] == 16, three


TRANSPOSED = """
import json, re
from tilecore.ops.fft_conv.report import gluon_variant
from tilecore.tiles.compile import compile_kernel, resources
name, kernel, args, warps, _ = gluon_variant(128, 64, 0, True, True, 64, 3, 2, 4, True, 2, 0, True, 5)
compiled = compile_kernel(kernel, args, num_warps=warps)
ptx = compiled.asm["ptx"]
print(json.dumps(dict(name=name, mmas=len(re.findall(r"wgmma\\.mma_async", ptx)),
                      register_a=len(re.findall(r"wgmma\\.mma_async[^;]*\\}, \\{", ptx)),
                      stores=len(re.findall(r"st\\.shared", ptx)), **vars(resources(compiled)))))
"""


def test_transposed_chunks_compile_with_register_operands():
    """LEAN 4 (the chunked kernel at 4096 in chunks of 64, each chunk's tile transposed, rows k_a): stages 3 and 3'
    take R and Y as the wgmma's register A operand (half of the walk's products: no staging tile between stage 1 and
    3, 3 and 3'), within shared memory with two walkers, and the spill a few scalars (44 B at 248 worker registers:
    ~8 local accesses a pair)."""
    row = compiled_json(TRANSPOSED, timeout=600)
    # per walk: stage 1 (16, shared-memory operands), 3 and 3' (16 each, register A), the two last products (16)
    assert row["mmas"] == 128 and row["register_a"] == 64, row
    assert row["shared"] <= 227 * 1024 and row["threads"] == 256 and row["registers"] <= 255, row
    assert row["spill_stores"] <= 48 and row["spill_loads"] <= 48, row
    # x^T, D^T and the epilogue's y box only (the chunks of 32 store 218 times: R and Y staged each chunk)
    assert row["stores"] <= 80, row


def _correlation(u64, k64):
    n = u64.shape[-1]
    spectrum = torch.fft.rfft(u64, n=2 * n) * torch.fft.rfft(k64, n=2 * n).conj()
    return torch.fft.irfft(spectrum, n=2 * n)[..., :n]


@pytest.mark.parametrize("n", [1024, 2048])
@pytest.mark.parametrize("dtype, conj, rfft", [(torch.bfloat16, False, False), (torch.bfloat16, True, True),
                                               (torch.float16, False, True), (torch.bfloat16, True, False)])
def test_kernel_arithmetic_matches_float64(n, dtype, conj, rfft):
    a, b = gluon_onepass.factors(n)
    g = torch.Generator().manual_seed(n + conj)
    u = torch.randn(3, 2, n, generator=g).to(dtype)  # an odd batch: the last pair's half absent
    k = (torch.randn(2, n, generator=g) / math.sqrt(n)).to(dtype)
    y = gluon_emulate.emulate(u, filter_spectrum(k, n), conj, a, b, rfft)
    ref = (_correlation if conj else fft_conv_reference)(u.double(), k.double())
    assert torch.isfinite(y).all()
    err = accuracy.error_over_floor(y, ref)
    # bf16 at the pair kernel's 1.04x; fp16 at the float16 products' own ~2.4x
    assert err <= (1.2 if dtype == torch.bfloat16 else 3.5), err


@pytest.mark.parametrize("n, chunk, variants", [(4096, 32, ((False, True), (True, True))), (2048, 16, ((True, False),)),
                                               (4096, 16, ((False, True, True),)),
                                               (4096, 64, ((False, 2, True), (True, 3, True)))])  # (LEAN 4's)
def test_chunked_kernel_arithmetic_matches_float64(n, chunk, variants):
    a, b = 2 * n // 64, 64
    g = torch.Generator().manual_seed(n)
    u = torch.randn(3, 1, n, generator=g).to(torch.bfloat16)
    # a filter whose spectrum peaks away from chunk 0's bins: the running output scale grows
    k = (torch.randn(1, n, generator=g) * torch.cos(torch.arange(n) * 2.9)).to(torch.bfloat16) / math.sqrt(n)
    for conj, rfft, *tw_sfu in variants:  # (conj, the kernel's RFFT[, TW_SFU: the twiddles computed])
        y = gluon_emulate.emulate_chunked(u, filter_spectrum(k, n), conj, a, b, chunk, rfft, *tw_sfu)
        ref = (_correlation if conj else fft_conv_reference)(u.double(), k.double())
        assert torch.isfinite(y).all()
        assert accuracy.error_over_floor(y, ref) <= 1.2


@pytest.mark.parametrize("dtype, conj, bound", [(torch.bfloat16, False, 1.2), (torch.bfloat16, True, 1.2),
                                               (torch.float16, False, 3.5)])
def test_half_spectrum_arithmetic_matches_float64(dtype, conj, bound):
    """RFFT 3 (the spectrum's bins in float16, one 32-bit load a bin) at 4096 in chunks of 32: the emulation, its one
    rounding of K more, against float64 (bf16 at the pair kernel's floor; fp16 at the float16 products' own), and the
    bins it reads are those of RFFT 2 rounded to float16 (the gather, mirror and conjugation unchanged)."""
    n, chunk = 4096, 32
    a, b = 2 * n // 64, 64
    g = torch.Generator().manual_seed(n + 3)
    u = torch.randn(3, 1, n, generator=g).to(dtype)
    k = (torch.randn(1, n, generator=g) * torch.cos(torch.arange(n) * 2.9)).to(dtype) / math.sqrt(n)
    spectrum = filter_spectrum(k, n)
    tile3, tile2 = (gluon_emulate.kernel_spectrum(spectrum, a, b, conj, r) for r in (3, 2))
    assert not torch.equal(tile3, tile2) and torch.equal(tile3, tile2.half().float())
    y = gluon_emulate.emulate_chunked(u, spectrum, conj, a, b, chunk, 3, True)
    ref = (_correlation if conj else fft_conv_reference)(u.double(), k.double())
    assert torch.isfinite(y).all()
    assert accuracy.error_over_floor(y, ref) <= bound


HALF_SPECTRUM = """
import json
from tilecore.ops.fft_conv import configs
from tilecore.ops.fft_conv.report import gluon_options, gluon_variant
from tilecore.tiles.compile import compile_kernel, resources
out = []
for rfft in (2, 3):
    config = list(configs.GLUON_ONEPASS[4096])
    config[6] = rfft
    name, kernel, args, warps, _ = gluon_variant(*config[:2], 0, *config[3:])
    compiled = compile_kernel(kernel, args, num_warps=warps, **gluon_options(tuple(config)))
    ptx = compiled.asm["ptx"]
    out.append(dict(name=name, b64=ptx.count("ld.global.b64"), b32=ptx.count("ld.global.b32"),
                    **vars(resources(compiled))))
print(json.dumps(out))
"""


def test_half_spectrum_compiles_on_the_shipped_4096_tuple():
    """The shipped 4096 tuple with RFFT 3 in place of 2: within shared memory, the spill a few scalars (LEAN 4's: 32 /
    44 B), and the spectrum's 64-bit loads (RFFT 2: one a bin) become 32-bit ones."""
    two, three = compiled_json(HALF_SPECTRUM, timeout=600)
    for row in (two, three):
        assert row["spill_stores"] <= 48 and row["spill_loads"] <= 48 and row["shared"] <= 227 * 1024, row
    assert two["b64"] > 0 and three["b64"] == 0 and three["b32"] >= two["b32"] + two["b64"], (two, three)


@pytest.mark.parametrize("n", [1024, 4096])
def test_computed_twiddles_match_the_table(n):
    """TW_SFU's exact integer reduction of m k_a mod L: its float32 cosine and sine within float32's
    rounding of the float64 table's (the kernel's cos/sin.approx add ~2^-21)."""
    a, b = 2 * n // 64, 64
    ops = conv_launch.mono_operands(a, b, 1, torch.device("cpu"))
    re, im = gluon_emulate.computed_twiddles(a, b)
    assert (re - ops["TFRE"]).abs().max() < 2e-6 and (im - ops["TFIM"]).abs().max() < 2e-6


def test_kernel_arithmetic_keeps_nonfinite_and_scales_in_their_sequence():
    n = 1024
    g = torch.Generator().manual_seed(5)
    u = torch.randn(4, 1, n, generator=g)
    u[1] *= 1e-6  # the pair's halves 10^6 apart
    u[2, 0, 17] = float("nan")  # its partner (u[3]) must stay finite
    u = u.to(torch.bfloat16)
    k = (torch.randn(1, n, generator=g) / math.sqrt(n)).to(torch.bfloat16)
    y = gluon_emulate.emulate(u, filter_spectrum(k, n), False, 32, 64)
    ref = fft_conv_reference(u.double(), k.double())
    assert torch.isnan(y[2]).all()
    for i in (0, 1, 3):
        assert accuracy.error_over_floor(y[i], ref[i]) <= 1.2


class _FakeLaunch:
    """Stands for the Gluon kernel's CachedLaunch: records the grid and the arguments of CachedLaunch.run."""

    def __init__(self):
        self.calls = []
        self.keys = []

    def run(self, key, grid, args, kwargs):
        self.keys.append(key)
        self.calls.append((grid, args, kwargs))


@pytest.mark.parametrize("per_sm, conj, tma, chunk, rfft, groups", [
    (0, False, False, 0, False, 1), (3, True, False, 0, False, 1), (3, False, True, 0, True, 1),
    (1, True, True, 64, False, 1), (1, True, True, 64, True, 1), (1, False, True, 64, False, 2), (2, True, True, 0, True, 8),
    (3, True, True, 0, 2, 1)])  # (rfft 2: the bins read as 64-bit loads)
def test_launch_binds_every_argument_with_the_tile_spectrum(monkeypatch, per_sm, conj, tma, chunk, rfft, groups):
    fake, other = _FakeLaunch(), _FakeLaunch()
    monkeypatch.setattr(conv_launch, "CONV_GLUON_CHUNKED" if chunk else "CONV_GLUON", fake)
    monkeypatch.setattr(conv_launch, "CONV_GLUON" if chunk else "CONV_GLUON_CHUNKED", other)
    monkeypatch.setattr(dispatch, "num_sms", lambda device: 4)
    a = 128 if chunk else 32  # (the chunked kernel: N = 4096 in chunks of 64, transposed)
    B, H, n = 5, 3, 32 * a
    u = torch.randn(B, H, n).to(torch.bfloat16)
    spectrum = filter_spectrum(torch.randn(H, n), n)
    y = torch.empty_like(u)
    warps = 8 if groups == 8 else 4  # (groups 8: the whole-tile kernel at 8 warps)
    groups = 1 if groups == 8 else groups
    chunked = dict(yalias=True, lean=5) if chunk else {}
    conv_launch.launch(conv_plan.gluon_plan(a, 64, per_sm, True, tma, chunk, rfft, groups, warps, **chunked), u,
                       spectrum, y, conj)
    (grid, args, kwargs), = fake.calls
    assert not other.calls
    pairs = H * 3
    assert grid == ((pairs,) if per_sm == 0 else (min(pairs, 4 * per_sm),))
    kernel = gluon_onepass.fft_conv_gluon_chunked_kernel if chunk else gluon_onepass.fft_conv_gluon_onepass_kernel
    names = [p.name for p in kernel.params]
    assert sorted(set(kwargs) - {"num_warps"}) == sorted(names[len(args):])
    bound = dict(zip(names, args)) | kwargs
    assert bound["TMA"] is tma and (bound["u_desc"] is None) is not tma and (bound["y_desc"] is None) is not tma
    if tma:  # (B, H, A/2, B) views of u and y, a pair's box, as TMA operands (the keyed launch's)
        for desc, t in ((bound["u_desc"], u), (bound["y_desc"], y)):
            assert isinstance(desc, TmaOperand) and desc.base is t and list(desc.shape) == [B, H, a // 2, 64] and list(desc.block_shape) == [2, 1, a // 2, 64]
            assert list(desc.strides) == [H * n, n, 64, 1]
    assert bound["U"] is u and bound["Y"] is y and bound["batch"] == B and bound["heads"] == H
    assert bound["A"] == a and bound["B"] == 64 and kwargs["num_warps"] == warps
    if chunk:
        assert bound["CHUNK"] == chunk and bound["WARPGROUPS"] == groups and bound["LEAN"] == 5 and bound["YALIAS"]
    else:
        assert bound["ASYNC"] is True
    assert bound["RFFT"] == rfft and bound["CONJ"] is bool(conj and rfft)
    if rfft:  # the rfft's bins as float32 pairs, conjugated in the kernel
        assert torch.equal(bound["K"], torch.view_as_real(spectrum)) and bound["stride_kh"] == 2 * (n + 1)
    else:
        tile = conv_launch.mono_spectrum(spectrum, a, 64, 1, False, conj)
        assert torch.equal(bound["K"], tile) and bound["stride_kh"] == 2 * 2 * n
    ops = conv_launch.mono_operands(a, 64, 1, u.device)
    assert bound["TFRE"] is ops["TFRE"] and bound["FBIM"] is ops["FBIM"]


def test_keyed_launch_keeps_its_parts_and_passes_the_key(monkeypatch):
    """op.py's launch key: the grid, tables and constexprs made once a key (later calls only wrap u and y
    as TMA operands), the key handed to CachedLaunch.run; without a key nothing is kept."""
    fake = _FakeLaunch()
    monkeypatch.setattr(conv_launch, "CONV_GLUON", fake)
    monkeypatch.setattr(dispatch, "num_sms", lambda device: 4)
    made = []
    parts = conv_launch._gluon_launch_parts
    monkeypatch.setattr(conv_launch, "_gluon_launch_parts", lambda *a: made.append(1) or parts(*a))
    B, H, n = 4, 2, 1024
    spectrum = filter_spectrum(torch.randn(H, n), n)
    plan = conv_plan.gluon_plan(32, 64, 3, True, True, 0, True)
    key = ("test key", B, H, n)
    for _ in range(3):
        u = torch.randn(B, H, n).to(torch.bfloat16)
        y = torch.empty_like(u)
        conv_launch.launch(plan, u, spectrum, y, False, key=key)
        (_, args, kwargs) = fake.calls[-1]
        assert args[0] is u and args[2] is y and kwargs["u_desc"].base is u and kwargs["y_desc"].base is y
    conv_launch.launch(plan, u, spectrum, y, False)
    assert fake.keys == [key, key, key, None] and len(made) == 2  # (once for the key, once unkeyed)
    assert fake.calls[0][0] == fake.calls[-1][0] == (H * B // 2,)  # (fewer pairs than 3 programs x 4 SMs)
    conv_launch._GLUON_LAUNCHES.clear()


def test_plan_takes_the_kernel_only_behind_its_switch_on_hopper(monkeypatch):
    H100 = dispatch.TARGETS["sm_90a"]
    meta = torch.device("meta")
    monkeypatch.setattr(dispatch, "interpreter_enabled", lambda: False)  # (as on the GPU)
    with dispatch.pretend(H100):
        monkeypatch.delitem(configs.GLUON_ONEPASS, 1024, raising=False)
        assert conv_plan.plan(1024, meta, torch.bfloat16).path != "gluon"  # off: no entry
        monkeypatch.setitem(configs.GLUON_ONEPASS, 1024, (32, 64, 3, True))
        got = conv_plan.plan(1024, meta, torch.bfloat16)
        assert got == conv_plan.gluon_plan(32, 64, 3, True)
        assert conv_plan.plan(1024, meta, torch.float32).path != "gluon"  # float32 keeps its kernel
    # never under the interpreter (Gluon cannot be interpreted) nor on CPU
    assert conv_plan.plan(1024, torch.device("cpu"), torch.bfloat16).path != "gluon"


def test_gluon_plan_rejects_what_the_kernel_does_not_take():
    with pytest.raises(ValueError, match="a x 64"):
        conv_plan.gluon_plan(16, 128, 0)
    with pytest.raises(ValueError, match="a x 64"):
        conv_plan.gluon_plan(128, 64, 0)  # 4096 only chunked
    with pytest.raises(ValueError, match="chunk"):
        conv_plan.gluon_plan(128, 64, 0, chunk=48)
    assert conv_plan.gluon_plan(128, 64, 1, tma=True, chunk=64, yalias=True, lean=5).async_mma
    with pytest.raises(ValueError, match="transposed"):  # (chunks of 64 transposed only: the chunks of 32 removed)
        conv_plan.gluon_plan(128, 64, 1, tma=True, chunk=32, yalias=True, lean=5)
    with pytest.raises(ValueError, match="transposed"):  # (lean 4 is the chunked kernel's)
        conv_plan.gluon_plan(32, 64, 1, lean=5)
    with pytest.raises(ValueError, match="warpgroup"):
        conv_plan.gluon_plan(32, 64, 1, warpgroups=2)  # (the whole-tile kernel runs one)
    with pytest.raises(ValueError, match="8 in the whole-tile"):
        conv_plan.gluon_plan(128, 64, 1, chunk=32, warps=8)
    with pytest.raises(ValueError, match="contig"):  # (CONTIG 2: the chunked kernel's two walkers)
        conv_plan.gluon_plan(32, 64, 3, False, True, 0, 2, 1, 4, True, 2)
    with pytest.raises(ValueError, match="contig"):
        conv_plan.gluon_plan(128, 64, 1, True, True, 32, 2, 1, 4, True, 2)
    assert conv_plan.gluon_plan(*configs.GLUON_ONEPASS[4096]).contig == 2
    with pytest.raises(ValueError, match="prefetch"):  # KPRE 2, 3 read a bin as one 64-bit copy: rfft 2
        conv_plan.gluon_plan(32, 64, 2, False, True, 0, True, 1, 4, True, False, 2)
    with pytest.raises(ValueError, match="prefetch"):  # KPRE 3 keeps a channel's tile: whole tile, contiguous walk
        conv_plan.gluon_plan(32, 64, 2, False, True, 0, 2, 1, 4, True, False, 3)
    with pytest.raises(ValueError, match="prefetch"):
        conv_plan.gluon_plan(128, 64, 1, True, True, 32, 2, 2, 4, True, True, 3)
    assert conv_plan.gluon_plan(32, 64, 2, False, True, 0, 2, 1, 4, True, True, 3).kpre == 3
    with pytest.raises(ValueError, match="YALIAS"):  # (the chunked kernel's, with TMA)
        conv_plan.gluon_plan(32, 64, 2, False, True, 0, 2, 1, 4, True, False, 0, True)
    assert conv_plan.gluon_plan(128, 64, 1, True, True, 64, 2, 2, 4, True, False, 0, True, 5).yalias
    assert conv_plan.gluon_plan(32, 64, 2, True, True, 0, True, 1, 8).num_warps == 8
    assert gluon_onepass.factors(1024) == (32, 64) and gluon_onepass.factors(2048) == (64, 64)
    for n, config in configs.GLUON_ONEPASS.items():  # what ships is valid and factors 2N
        assert config[0] * config[1] == 2 * n and conv_plan.gluon_plan(*config).path == "gluon"
    for n, candidates in configs.GLUON_ONEPASS_CANDIDATES.items():
        for config in candidates:
            assert config[0] * config[1] == 2 * n
            conv_plan.gluon_plan(*config)
    assert 4096 in configs.GLUON_ONEPASS_CANDIDATES


def _dk64(u, dy, n, filter_len):
    cross = (torch.fft.rfft(dy.double(), n=2 * n) * torch.fft.rfft(u.double(), n=2 * n).conj()).sum(0)
    return torch.fft.irfft(cross, n=2 * n)[:, :filter_len]


@pytest.mark.parametrize("dtype, n", [(torch.bfloat16, 1024), (torch.float16, 1024), (torch.bfloat16, 2048)])
def test_dk_kernel_arithmetic_matches_float64(dtype, n):
    """The Gluon filter-gradient kernel's arithmetic (gluon_emulate.emulate_dk: each pair's two transforms on the
    forward stages, w Z_dy conj(Z_u) summed, the host's inverse DFT) against float64: an odd batch, a filter shorter
    than N, dy's sequences 10^3 apart (the halves' weights); bf16 at the floor (1.05x), fp16 at the float16 products'
    ~2.4x; a NaN in one sequence makes its channel's dk all NaN and leaves the other's as it was."""
    a = 2 * n // 64
    g = torch.Generator().manual_seed(3)
    u = torch.randn(5, 2, n, generator=g).to(dtype)
    dy = (torch.randn(5, 2, n, generator=g) * 10).to(dtype)
    dy[1] *= 1e-3
    got = gluon_emulate.emulate_dk(u, dy, a, 64, n - 5)
    want = _dk64(u, dy, n, n - 5)
    assert got.shape == (2, n - 5) and torch.isfinite(got).all()
    assert accuracy.error_over_floor(got.to(dtype), want) <= (1.2 if dtype == torch.bfloat16 else 3.0)
    u[3, 1, 100] = float("nan")
    got_nan = gluon_emulate.emulate_dk(u, dy, a, 64, n - 5)
    assert torch.isnan(got_nan[1]).all() and torch.equal(got_nan[0], got[0])


DK_CODE = """
import json, re
from tilecore.ops.fft_conv.report import gluon_dk_variant
from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources
out = []
for a, xsmem in ((32, False), (64, True)):
    name, kernel, args, warps, _ = gluon_dk_variant(a, 64, 8, xsmem)
    compiled = compile_kernel(kernel, args, num_warps=warps)
    ptx = compiled.asm["ptx"]
    out.append(dict(name=name, mmas=len(re.findall(r"wgmma\\.mma_async", ptx)), sins=len(re.findall(r"sin\\.approx", ptx)),
                    **vars(resources(compiled)), **has_hopper_instructions(ptx)))
print(json.dumps(out))
"""


def test_dk_kernel_compiles_for_hopper_with_wgmma_and_no_spill():
    """The Gluon filter-gradient kernel at 1024 (32 x 64, 8 pairs a program): wgmma (not serialized), the twiddles by
    the SFU, no spill, two programs of 128 threads a multiprocessor by registers and shared memory; 2048's XSMEM
    candidate (u's transform and the sum in shared memory) without spill, within shared memory."""
    row, parked = compiled_json(DK_CODE, timeout=600)
    assert row["wgmma"] and not row["wgmma_serialized"] and row["mmas"] >= 16 and row["sins"] > 0, row
    assert row["spill_stores"] == 0 and row["spill_loads"] == 0 and row["threads"] == 128, row
    assert 2 * row["registers"] * 128 <= 65536 and 2 * row["shared"] <= 227 * 1024, row
    assert parked["wgmma"] and parked["spill_stores"] == 0 and parked["shared"] <= 227 * 1024, parked


def test_dk_launch_binds_every_argument(monkeypatch):
    """launch.dk_gluon: one program a (channel, group of LOOP pairs), every kernel argument bound, the partial spectra
    summed and inverted: where each partial holds 1 at f = 0 (the fake kernel's), the sum is ``chunks`` there and its
    inverse DFT chunks / L at every lag."""
    fake = _FakeLaunch()
    monkeypatch.setattr(conv_launch, "DK_GLUON", fake)
    B, H, n = 5, 3, 1024
    u, dy = torch.randn(B, H, n).to(torch.bfloat16), torch.randn(B, H, n).to(torch.bfloat16)
    real_empty = torch.empty

    def empty(*shape, **kwargs):  # the partials the fake kernel "wrote": 1 at (re, k_b 0, k_a 0), else 0
        t = real_empty(*shape, **kwargs).zero_()
        t[:, 0, 0, 0] = 1.0
        return t

    monkeypatch.setattr(torch, "empty", empty)
    dk = conv_launch.dk_gluon((32, 64, 2), u, dy, n - 7)
    monkeypatch.setattr(torch, "empty", real_empty)
    (grid, args, kwargs), = fake.calls
    chunks = 2  # (3 pair groups, 2 a program)
    assert grid == (H * chunks,) and fake.keys == [None]
    names = [p.name for p in gluon_onepass.fft_conv_gluon_dk_kernel.params]
    assert sorted(set(kwargs) - {"num_warps"}) == sorted(names[len(args):]) and kwargs["num_warps"] == 4
    bound = dict(zip(names, args)) | kwargs
    assert bound["U"] is u and bound["DY"] is dy and bound["P"].shape == (H * chunks, 2, 64, 32)
    assert bound["batch"] == B and bound["heads"] == H and bound["A"] == 32 and bound["B"] == 64 and bound["LOOP"] == 2
    assert bound["XSMEM"] is False
    ops = conv_launch.mono_operands(32, 64, 1, u.device)
    assert bound["FARE"] is ops["FARE"] and bound["TFIM"] is ops["TFIM"]
    assert dk.shape == (H, n - 7) and torch.allclose(dk, torch.full_like(dk, chunks / (2 * n)))


def test_dk_plan_takes_the_gluon_kernel_only_behind_its_switch_on_hopper(monkeypatch):
    """plan.dk_gluon_config: configs.DK_GLUON's entry for 16-bit u and filter on a Hopper under a checked triton, not
    interpreted; None otherwise (then dk_config's kernel or torch.fft)."""
    H100 = dispatch.TARGETS["sm_90a"]
    meta = torch.device("meta")
    monkeypatch.setattr(dispatch, "interpreter_enabled", lambda: False)
    with dispatch.pretend(H100):
        monkeypatch.delitem(configs.DK_GLUON, 1024, raising=False)
        assert conv_plan.dk_gluon_config(1024, meta, torch.bfloat16, torch.bfloat16) is None  # off: no entry
        monkeypatch.setitem(configs.DK_GLUON, 1024, (32, 64, 8))
        assert conv_plan.dk_gluon_config(1024, meta, torch.bfloat16, torch.bfloat16) == (32, 64, 8)
        assert conv_plan.dk_gluon_config(1024, meta, torch.bfloat16, torch.float32) is None  # a float32 filter
        assert conv_plan.dk_gluon_config(4096, meta, torch.bfloat16, torch.bfloat16) is None  # (no entry: the tl kernel)
    assert conv_plan.dk_gluon_config(1024, torch.device("cpu"), torch.bfloat16, torch.bfloat16) is None
