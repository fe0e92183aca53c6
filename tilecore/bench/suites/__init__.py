"""Every benchmark suite, by the name ``tilecore bench <name>`` takes (the harness runs them and
imports none of them)."""
from tilecore.bench.suites import attention, attention_decode, attention_fp8, attention_gqa, copy, gemm, hadamard

SUITES = {s.name: s for s in (copy.SUITE, hadamard.SUITE, hadamard.LATENCY, gemm.SUITE, attention.SUITE,
                              attention_gqa.SUITE, attention_decode.SUITE, attention_fp8.SUITE)}
