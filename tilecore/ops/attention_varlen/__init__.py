"""``attention_varlen``: attention over packed variable-length batches (flash-attn's varlen layout),
forward and backward.

* ``op``: the public function, checks, custom ops (``tilecore::attention_varlen_forward`` /
  ``_backward``), autograd, the work tables and the launches of every path;
* ``configs``: the Gluon kernels' measured switches and blocks;
* ``kernels_tl``: the portable ``tl`` kernels (forward, backward's delta, dK/dV and dQ, the work table);
  ``work``: the work table's one-launch (ranked) form;
* ``gluon_forward``, ``gluon_backward``: Hopper's kernels, the fixed-length Gluon kernels'
  (tilecore.ops.attention) steps over a device-built work table of (sequence, tile, head);
* ``reference``: the per-sequence float64 / float32 reference (also the CPU path).
"""
from tilecore.ops.attention_varlen.op import attention_varlen
from tilecore.ops.attention_varlen.reference import varlen_reference

__all__ = ["attention_varlen", "varlen_reference"]
