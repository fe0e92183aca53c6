"""Interpreted launches from several threads at once. Triton's interpreter keeps a launch's state in
module globals (tiles.launch.serialize_interpreter), and stream-K launches wait on flags in a shared
workspace (tiles.schedule.stream_k_buffers): without care, two threads' GEMMs fail or, with a stream-K
tail, spin forever. Run in a subprocess with a timeout, so that a hang fails the test instead of
blocking the run."""
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import os, threading, time
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from tilecore import accuracy
    from tilecore.ops.gemm import configs, launch, plan, reference
    from tilecore.tiles import schedule

    M, N, K = 64, 64, 256  # 4 tiles of 32 x 32 over the interpreter's 3 programs: a stream-K tail
    THREADS, CALLS = 3, 2
    errors, done = [], []
    barrier = threading.Barrier(THREADS)

    def work(i, mode):
        try:
            g = torch.Generator().manual_seed(i)
            a = torch.randn(M, K, dtype=torch.float16, generator=g)
            b = torch.randn(K, N, dtype=torch.float16, generator=g)
            ref = reference.gemm_f64(a, b)
            p = plan.plan(a, b, out_dtype=torch.float32, config=dict(configs.TL_CPU, stream_k=mode))
            assert p.stream_k == (mode == "always")
            barrier.wait()
            for _ in range(CALLS):
                c = torch.full((M, N), float("nan"))
                launch.launch(p, a, b, out=c)
                err = float(accuracy.rel_rms(c, ref))
                assert err < 1e-6, (i, mode, err)
            _, flags = schedule.stream_k_buffers(torch.device("cpu"), 1, 1)
            assert (flags == 0).all(), "a launch left its flags raised"
            done.append((i, mode))
        except BaseException as err:
            errors.append(repr(err))

    for mode in ("always", "off"):
        threads = [threading.Thread(target=work, args=(i, mode), daemon=True) for i in range(THREADS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 150
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        hung = [t.name for t in threads if t.is_alive()]
        if hung:
            print("HUNG", mode, hung, flush=True)
            os._exit(3)
    print("ERRORS", errors) if errors else print("OK", len(done), flush=True)
    os._exit(1 if errors else 0)
""")


def test_interpreted_gemms_from_several_threads_finish_and_agree():
    env = dict(os.environ, TRITON_INTERPRET="1")
    try:
        proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=400, env=env)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"interpreted GEMMs from several threads did not finish: {err}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "OK 6" in proc.stdout
