"""Stream-K in Gluon (the twins of ``tiles.schedule.publish_partial``/``add_partials``): a tile split
along K over several programs leaves float32 partials in a workspace, each raised by a flag, and the
tile's last program adds them before its epilogue."""
from triton.experimental import gluon

from tilecore.tiles.gluon.compat import gl
from tilecore.tiles.gluon.ops import join_n, split_n
from tilecore.tiles.schedule import FINAL, PARTIAL

PARTIAL_COLUMNS: gl.constexpr = gl.constexpr(32)  # columns of a partial moved at once (64-bit addresses: registers)


@gluon.jit
def _partial_ptrs(x, base, ROW: gl.constexpr, col0: gl.constexpr):
    """Addresses of a [m, n] register tile's elements in a row-major float32 partial of rows of
    ``ROW`` elements, from column ``col0`` (in the tile's layout)."""
    layout: gl.constexpr = x.type.layout
    rows = gl.arange(0, x.shape[0], layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, x.shape[1], layout=gl.SliceLayout(0, layout))
    return base + (gl.expand_dims(rows, 1) * ROW + gl.expand_dims(cols, 0) + col0)


@gluon.jit
def _store_partial(x, base, ROW: gl.constexpr, col0: gl.constexpr):
    if x.shape[1] <= PARTIAL_COLUMNS:
        gl.store(_partial_ptrs(x, base, ROW, col0), x)
    else:
        lo, hi = split_n(x)
        _store_partial(lo, base, ROW, col0)
        _store_partial(hi, base, ROW, col0 + x.shape[1] // 2)


@gluon.jit
def _add_partial(x, base, ROW: gl.constexpr, col0: gl.constexpr):
    if x.shape[1] <= PARTIAL_COLUMNS:
        return x + gl.load(_partial_ptrs(x, base, ROW, col0), cache_modifier=".cg")
    else:
        lo, hi = split_n(x)
        lo = _add_partial(lo, base, ROW, col0)
        hi = _add_partial(hi, base, ROW, col0 + x.shape[1] // 2)
        return join_n(lo, hi)


@gluon.jit
def publish_partial(acc, workspace, flags, slot):
    """Stream-K (the Gluon twin of ``tiles.schedule.publish_partial``): write a float32 partial
    tile to workspace slot ``slot`` and raise the slot's flag (release)."""
    SLOT: gl.constexpr = acc.shape[0] * acc.shape[1]
    _store_partial(acc, workspace + slot * SLOT, acc.shape[1], 0)
    gl.thread_barrier()  # every thread's part is written before the flag goes up
    gl.atomic_xchg(flags + slot, 1, sem="release", scope="gpu")


@gluon.jit
def add_partials(acc, workspace, flags, first_slot, end_slot, slot_step):
    """Stream-K (the twin of ``tiles.schedule.add_partials``): add the partials of slots
    first_slot, first_slot + slot_step, ... < end_slot, each once its flag is up; then lower them."""
    SLOT: gl.constexpr = acc.shape[0] * acc.shape[1]
    layout: gl.constexpr = acc.type.layout
    for slot in range(first_slot, end_slot, slot_step):
        while gl.atomic_add(flags + slot, 0, sem="acquire", scope="gpu") == 0:
            pass
        # split_n/join_n hand back an equivalent layout: the conversion moves no data
        acc = gl.convert_layout(_add_partial(acc, workspace + slot * SLOT, acc.shape[1], 0), layout)
    gl.thread_barrier()  # every thread has seen every flag before one is lowered
    for slot in range(first_slot, end_slot, slot_step):
        gl.atomic_xchg(flags + slot, 0, sem="relaxed", scope="gpu")
    return acc




@gluon.jit
def fix_up(acc, role, first, workspace, flags, CONSUMERS: gl.constexpr, consumer: gl.constexpr):
    """A stream-K unit's accumulator after its share of the tile (``role`` and ``first`` from
    ``tiles.schedule.stream_k_work``): a PARTIAL share is published to this program's slot (program
    * CONSUMERS + consumer); a FINAL one comes back with the earlier shares (programs ``first`` ..
    this one - 1) added. The caller stores the tile where ``role`` is WHOLE or FINAL."""
    slot = gl.program_id(0) * CONSUMERS + consumer
    if role == PARTIAL:
        publish_partial(acc, workspace, flags, slot)
    elif role == FINAL:
        acc = add_partials(acc, workspace, flags, slot - (gl.program_id(0) - first) * CONSUMERS, slot, CONSUMERS)
    return acc
