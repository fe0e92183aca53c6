"""Where and when a probe ran, for the JSON it writes: the GPU (or "cpu"), versions, the source digest of the
tilecore that ran (tilecore.env.source_digest) and the UTC date. Kept for the probes that import it; the same
function as experiments/common/gpu_script.py's (whose Run writes it into every JSON).

    from experiments.common.meta import meta      (with the repository root on sys.path)
"""
from experiments.common.gpu_script import meta  # noqa: F401
