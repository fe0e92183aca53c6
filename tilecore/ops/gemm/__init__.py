"""GEMM: ``gemm`` (bf16, fp16) and ``gemm_fp8`` (e4m3 with scales), built from tilecore.tiles.

* ``op``: public functions, checks, torch.library custom ops (with fake implementations), autograd;
* ``gluon_kernels``: the Hopper kernel (TMA ring, warp specialization, wgmma, TMA-store epilogue);
* ``kernels``: the same GEMM on the ``tl`` twin of the template (interpreter, older GPUs);
* ``plan``: which kernel serves which operands, with which configuration (``configs``: the measured
  tables) and grid; ``launch``: one launch of a plan; ``reference``: PyTorch references.
"""
from tilecore.ops.gemm.op import gemm, gemm_fp8

__all__ = ["gemm", "gemm_fp8", "tour_cases"]


def tour_cases(device):
    from tilecore.ops.gemm.tour import cases

    return cases(device)
