"""The last consumer's Q double buffer (session 43): the template's TileOperand LAST_BUFFERS (each consumer's buffers,
where they start, the producer's load order; the shipped D128 kernels compiled: test_q_reg.py)."""
from tilecore.tiles.gluon import pipeline
from tilecore.tiles.gluon.pipeline import TileOperand


def _ints(xs):
    return [int(getattr(x, "value", x)) for x in xs]


def test_last_consumer_buffers_and_load_order():
    one = TileOperand(None, BUFFERS=1, LAST_BUFFERS=2)
    assert _ints(pipeline._buffers(one, c, 3) for c in range(3)) == [1, 1, 2]
    assert _ints(pipeline._first_slot(one, c, 3) for c in range(4)) == [0, 1, 2, 4]  # 4 buffers and barrier pairs
    assert _ints(pipeline._load_order(one, i, 3) for i in range(3)) == [2, 0, 1]  # the double-buffered first


def test_default_is_unchanged():
    """Without LAST_BUFFERS every consumer has BUFFERS, one after another, loaded in order (every other kernel)."""
    for buffers in (1, 2):
        op = TileOperand(None, BUFFERS=buffers)
        assert _ints(pipeline._buffers(op, c, 3) for c in range(3)) == [buffers] * 3
        assert _ints(pipeline._first_slot(op, c, 3) for c in range(4)) == [0, buffers, 2 * buffers, 3 * buffers]
        assert _ints(pipeline._load_order(op, i, 3) for i in range(3)) == [0, 1, 2]
