"""Session 16: where the time of the in-kernel dQ conversion's launches goes (torch profiler, kernel
times by name), D = 128 without a mask, N = 4096: the shipped config against dq_convert modes."""
import sys
sys.path.insert(0, ".")
sys.path.insert(0, "scripts/device")
import torch  # noqa: E402
from attention_knobs import backward_case  # noqa: E402
from tilecore.ops.attention import kernels  # noqa: E402

run, cudnn, fl, grads = backward_case(4096, 128, False)
shipped = dict(kernels.GLUON_BACKWARD[128, False])
for mode in ["pass", "kernel-nohelper-nocount", "kernel", "kernel-lastpass"]:
    cfg = dict(shipped, dq_convert=mode)
    for _ in range(3):
        run(gluon=cfg)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            run(gluon=cfg)
        torch.cuda.synchronize()
    print(f"== {mode}")
    for ev in prof.key_averages():
        if ev.device_time_total > 0:
            print(f"  {ev.key[:70]:70s} n={ev.count:3d} avg={ev.device_time_total / ev.count / 1000:.3f} ms")
