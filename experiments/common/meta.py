"""Where and when a probe ran, for the JSON it writes: the GPU, versions, the source digest of the
tilecore that ran (tilecore.env.source_digest) and the UTC date.

    from experiments.common.meta import meta      (with the repository root on sys.path)
"""
import time


def meta() -> dict:
    import torch
    import triton

    from tilecore import env

    p = torch.cuda.get_device_properties(0)
    return {"gpu": p.name, "sms": p.multi_processor_count, "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "source": env.source_digest(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
