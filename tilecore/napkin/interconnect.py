"""The cross-GPU level: links between the GPUs of one host, each with a bandwidth per direction and a
fixed cost per transfer. A transfer of b bytes to a neighbour takes latency + b / bandwidth; the
sends of a ring (every GPU to the next at once) each have their own direction of a link. NCCL moves
the bytes with a kernel of its own, on ``sms`` SMs: beside a kernel that holds every SM (a
persistent one) it runs only once that kernel is done.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .errors import UnknownGPUError


@dataclass(frozen=True)
class Link:
    """GPU-to-GPU transfers within one host."""
    name: str
    bandwidth: float   # bytes/s one GPU sends to one neighbour (one direction)
    latency: float     # s: the fixed cost of one transfer (a batch of sends: launch and handshake)
    gpus: int          # GPUs a host connects this way
    source: str
    sms: int = 4       # SMs the transfer's kernel (NCCL's P2P channels) occupies: an estimate
    copy_bandwidth: float | None = None  # bytes/s a peer copy by the copy engines moves (no SM); None: bandwidth

    def time(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` to a neighbour (0 for nothing)."""
        return self.latency + nbytes / self.bandwidth if nbytes > 0 else 0.0

    def copy_time(self, nbytes: float) -> float:
        """Seconds for the copy engines to move ``nbytes`` to a neighbour (a peer copy: no kernel)."""
        if nbytes <= 0:
            return 0.0
        return self.latency + nbytes / (self.copy_bandwidth or self.bandwidth)


NVLINK4 = Link(
    "NVLink 4 (H100 SXM, 18 links)", bandwidth=450e9, latency=20e-6, gpus=8,
    source="NVIDIA H100 datasheet: 900 GB/s NVLink per GPU, both directions together; latency an estimate "
           "(NCCL P2P launch and handshake, ~10-30 us)")

# The lent nvidia-h100-x2 (two H100 SXM, NV18): NCCL's batch_isend_irecv moved one rank's K and V of
# B1 H32 N16K D128 bf16 (268 MB) around the ring in 0.92 ms (issue 38, 2026-11-25)
# and the copy engines' peer copy into symmetric memory (tilecore.distributed.copy_engine) 268 MB in
# 0.73-0.77 ms and 537 MB in 1.48-1.55 beside the attention: ~355 GB/s (notes/distributed, "The napkin's
# cross-GPU level")
H100_X2 = dataclasses.replace(
    NVLINK4, name="NVLink 4, measured (lent nvidia-h100-x2)", bandwidth=291e9, copy_bandwidth=355e9,
    source="issue 38: NCCL batch_isend_irecv, 268 MB in 0.92 ms a direction (2026-11-25); copy engines 355 GB/s "
           "(notes/distributed/runs/distributed_gpu_check_ce_run6_session29_h100x2.txt); latency as NVLINK4's")

LINKS = {"nvlink4": NVLINK4, "h100-x2": H100_X2}


def get_link(key) -> Link:
    if isinstance(key, Link):
        return key
    k = str(key).lower()
    if k not in LINKS:
        raise UnknownGPUError(f"unknown link {key!r}; accepted: {', '.join(LINKS)}")
    return LINKS[k]
