"""Every benchmark suite, by the name ``tilecore bench <name>`` takes."""
from tilecore.bench.suites import copy, hadamard

SUITES = {s.name: s for s in (copy.SUITE, hadamard.SUITE, hadamard.LATENCY)}
from tilecore.bench.suites import gemm as _gemm; SUITES[_gemm.SUITE.name] = _gemm.SUITE  # noqa: E402,E702
from tilecore.bench.suites import attention as _attention; SUITES[_attention.SUITE.name] = _attention.SUITE  # noqa: E402,E702
from tilecore.bench.suites import attention_gqa as _gqa; SUITES[_gqa.SUITE.name] = _gqa.SUITE  # noqa: E402,E702
from tilecore.bench.suites import attention_decode as _decode; SUITES[_decode.SUITE.name] = _decode.SUITE  # noqa: E402,E702
