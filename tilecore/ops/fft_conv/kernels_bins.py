"""A complex64 spectrum cast to the order-3 kernel's scaled float16 bins in one pass (RFFT 4: launch.scaled_half_bins;
reference.scaled_half_bins is the same function in torch: the float pairs' |x|, a max, a division and a cast, five
passes over the spectrum's bytes a call, 3x this kernel's time), and laid out as its chunks read them (KFULL:
laid_half_bins_kernel, a program a half row). The cast, one program a channel: the row's largest |re|, |im| (1 where
it is 0 or the row holds a NaN, as torch.where(amax > 0, amax, 1) gives: amax propagates NaN), then every float over
it, rounded to nearest (div_rn: the same bits as torch's division), to float16. The row is read twice (the second
time from L2), a bin's pair at a time (8-byte loads, 4-byte stores: a row starts 8-byte aligned)."""
import triton
import triton.language as tl


@triton.jit
def _row_scale(row, bins, BLOCK: tl.constexpr):
    """A row's largest |x| over its ``bins`` (re, im) float pairs, 1 where that is 0 or the row holds a NaN."""
    pair = tl.arange(0, 2)[None, :]
    offs = tl.arange(0, BLOCK)[:, None]
    top = tl.zeros([BLOCK, 2], tl.float32)
    nan = tl.zeros([BLOCK, 2], tl.int32)
    for start in range(0, bins, BLOCK):
        b = start + offs
        x = tl.abs(tl.load(row + 2 * b + pair, mask=b < bins, other=0.0))
        nan = tl.maximum(nan, (x != x).to(tl.int32))
        top = tl.maximum(top, x)
    m = tl.max(tl.max(top, 1), 0)
    s = tl.where(m > 0, m, 1.0)
    return tl.where(tl.max(tl.max(nan, 1), 0) > 0, 1.0, s)


@triton.jit
def scaled_half_bins_kernel(X, Y, S, bins, stride_h, BLOCK: tl.constexpr):
    """X: a channel's ``bins`` (re, im) float pairs at X + 2 h stride_h (stride_h: the complex rows' stride); Y (H,
    bins, 2) float16 = X / S[h]; S (H,) float32 = the row's largest |x| (1 where that is 0 or the row holds a NaN)."""
    h = tl.program_id(0).to(tl.int64)
    row = X + h * (2 * stride_h)
    out = Y + h * (2 * bins)
    pair = tl.arange(0, 2)[None, :]
    offs = tl.arange(0, BLOCK)[:, None]
    s = _row_scale(row, bins, BLOCK)
    tl.store(S + h, s)
    for start in range(0, bins, BLOCK):
        b = start + offs
        x = tl.load(row + 2 * b + pair, mask=b < bins, other=0.0)
        tl.store(out + 2 * b + pair, tl.math.div_rn(x, s).to(tl.float16), mask=b < bins)


@triton.jit
def laid_half_bins_kernel(X, Y, S, stride_h, SCALE: tl.constexpr):
    """KFULL (N = 8192, L = 16384): a channel's spectrum laid out as the order-3 kernel's chunks read it
    (launch.laid_half_bins): position p holds bin f, past L / 2 the conjugate of bin L - f (0 - im: the bits the kernel's
    own conjugation gives). p and f are one 14-bit index with its fields permuted (f = w + 4 j + 16 t + 128 q1 + 256 q0
    + 512 lc + 2048 cg, p = q0 + 2 q1 + 4 lc + 16 t + 128 cg + 1024 w + 4096 j: gluon_order3._laid_bins' view), so a
    program reads a half of the row in f's order (half 0: bins 0 .. 8191; half 1: bin N, then bins 8191 .. 1
    conjugated) by coalesced loads, permutes it in registers (a reshape and a permute: the compiler's layout conversion
    through shared memory) and writes sixteen 2 KiB runs of p. The mirror makes each half hold all but one of the row's
    bins, so the scale (SCALE: the largest |re|, |im| as _row_scale's, S[h] written) takes one more bin, not a second
    read of the row. (A gather in p's order by an index table, a program a row, was slower: notes/fft_conv.) Program (h, half); X: a channel's (re, im) pairs at X + 2 h stride_h, float32 (SCALE: scaled
    as scaled_half_bins_kernel) or float16 (as they are); Y (H, L, 2) float16."""
    h = tl.program_id(0).to(tl.int64)
    half = tl.program_id(1)
    row = X + h * (2 * stride_h)
    i = tl.arange(0, 8192)[:, None]
    pair = tl.arange(0, 2)[None, :]
    x = tl.load(row + 2 * tl.where(half == 0, i, 8192 - i) + pair)
    if SCALE:
        rest = tl.load(row + 2 * (8192 - 8192 * half) + tl.arange(0, 2))  # the bin this half lacks (N or 0)
        bad = tl.maximum(tl.max(tl.max((x != x).to(tl.int32), 1), 0), tl.max((rest != rest).to(tl.int32), 0))
        m = tl.maximum(tl.max(tl.max(tl.abs(x), 1), 0), tl.max(tl.abs(rest), 0))
        s = tl.where(bad > 0, 1.0, tl.where(m > 0, m, 1.0))
        if half == 0:
            tl.store(S + h, s)
        x = tl.math.div_rn(x, s).to(tl.float16)
    x = tl.where((half == 1) & (i > 0) & (pair == 1), 0.0 - x, x)
    re, im = tl.split(x)
    bits = (re.to(tl.uint16, bitcast=True).to(tl.uint32)
            | (im.to(tl.uint16, bitcast=True).to(tl.uint32) << 16)).to(tl.int32, bitcast=True)
    # f's fields (cg % 4, lc, q0, q1, t, j, w) as axes, to p's order (j, w, cg % 4, t, lc, q1, q0)
    bits = tl.reshape(tl.permute(tl.reshape(bits, [4, 4, 2, 2, 8, 4, 4]), (5, 6, 0, 4, 1, 3, 2)), [16, 512])
    out = Y.to(tl.pointer_type(tl.int32)) + h * 16384 + half * 512
    tl.store(out + tl.arange(0, 16)[:, None] * 1024 + tl.arange(0, 512)[None, :], bits)
