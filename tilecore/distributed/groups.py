"""Process groups: resolving ``group=``, and the small metadata gather every call checks its inputs
with, waited on for a bounded time so that a rank that never arrives gives an error, not a hang.

The gather runs on the CPU through gloo (the group itself where it has a gloo backend, else a gloo
group of the same ranks made once), so the host never waits on the GPU's queue to check sizes.
"""
from __future__ import annotations

import inspect
import threading
import time

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 120.0
META_LEN = 32  # ints per rank in a metadata gather (fixed: ranks with different inputs still match)

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
           torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128)
_DEVICES = ("cpu", "cuda")

_metadata_groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
_metadata_lock = threading.Lock()


def resolve(group, what: str) -> dist.ProcessGroup:
    """``group`` (None: the default group; a ProcessGroup; or its name) as a ProcessGroup this process
    belongs to, or a clear error."""
    if not dist.is_available():
        raise RuntimeError(f"{what}: this torch build has no torch.distributed")
    if not dist.is_initialized():
        raise RuntimeError(f"{what}: torch.distributed is not initialized: call "
                           "torch.distributed.init_process_group first (torchrun sets up its environment), "
                           "then pass group= (default: the whole world)")
    if group is None:
        group = dist.group.WORLD
    elif isinstance(group, str):
        from torch.distributed.distributed_c10d import _resolve_process_group
        group = _resolve_process_group(group)
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{what}: group must be None, a torch.distributed ProcessGroup or its name; got "
                        f"{type(group).__name__}")
    if dist.get_rank(group) < 0:
        raise ValueError(f"{what}: this process (global rank {dist.get_rank()}) is not a member of the group "
                         f"(ranks {dist.get_process_group_ranks(group)})")
    return group


def metadata_group(group: dist.ProcessGroup) -> dist.ProcessGroup:
    """A group with a gloo backend and ``group``'s ranks: ``group`` itself where it has one (gloo, or
    "cpu:gloo,cuda:nccl"), else a gloo group of its ranks, made at the first call (by its members
    only) and kept."""
    if "gloo" in str(dist.get_backend(group)):
        return group
    ranks = tuple(dist.get_process_group_ranks(group))
    with _metadata_lock:
        if ranks not in _metadata_groups:
            _metadata_groups[ranks] = dist.new_group(list(ranks), backend="gloo", use_local_synchronization=True,
                                                     group_desc="tilecore_metadata")
        return _metadata_groups[ranks]


SPIN_S = 2e-3  # seconds a wait yields in a loop before it naps


def wait(work, timeout: float, what: str, doing: str, began: float | None = None) -> None:
    """Wait for ``work`` at most ``timeout`` seconds (polling: gloo's and NCCL's wait() would block
    until the group's own timeout, tens of minutes), then raise TimeoutError saying what was waited
    for. ``began``: when the wait's clock started (time.monotonic(); default: now)."""
    began = time.monotonic() if began is None else began
    deadline = began + timeout
    delay = 5e-5
    while not work.is_completed():
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"{what}: waited {timeout:g} s for every rank of the group to {doing}; not all did. "
                               f"Every rank must call {what} with the same group (did one rank fail, or take "
                               "another path?); raise timeout= if ranks may be that far apart")
        if now - began < SPIN_S:
            # the first SPIN_S only yield: a gather on the host's loopback takes ~50-300 us, and a nap,
            # however short it asks, lasts >= ~60 us (timer slack), so naps overshot it (notes/distributed,
            # decision log: the public forward's 0.9 ms over ring_forward's)
            time.sleep(0)
            continue
        time.sleep(delay)
        delay = min(2 * delay, 1e-3)
    work.wait()  # raises the collective's own error, if it had one


class PendingGather:
    """A metadata gather in flight (start_gather_ints): ``result()`` waits for it (at most ``timeout``
    seconds from its start, as ``wait`` does) once and returns every rank's values; the host may queue
    work that needs no other rank's metadata meanwhile (the ring's step 0)."""

    def __init__(self, work, rows, timeout: float, what: str):
        self.work, self.rows, self.timeout, self.what = work, rows, timeout, what
        self.began = time.monotonic()
        self._result = None

    def result(self) -> list[list[int]]:
        if self._result is None:
            wait(self.work, self.timeout, self.what, "check its inputs' sizes", began=self.began)
            self._result = [r[1:1 + int(r[0])].tolist() for r in self.rows]
        return self._result


def start_gather_ints(values: list[int], group: dist.ProcessGroup, timeout: float, what: str) -> PendingGather:
    """Start gathering every rank's ``values`` (ints, at most META_LEN, the same count on every rank)
    on the CPU (gloo: its own thread); ``result()`` waits for them, in rank order."""
    if len(values) > META_LEN:
        raise ValueError(f"{what}: at most {META_LEN - 8}-dimensional tensors are taken")
    row = torch.zeros(META_LEN + 1, dtype=torch.int64)
    row[0] = len(values)
    row[1:1 + len(values)] = torch.tensor(values, dtype=torch.int64)
    meta_group = metadata_group(group)
    rows = [torch.empty_like(row) for _ in range(dist.get_world_size(group))]
    work = dist.all_gather(rows, row, group=meta_group, async_op=True)
    return PendingGather(work, rows, timeout, what)


def gather_ints(values: list[int], group: dist.ProcessGroup, timeout: float, what: str) -> list[list[int]]:
    """Every rank's ``values`` (ints, at most META_LEN, the same count on every rank), in rank order,
    gathered on the CPU within ``timeout`` seconds."""
    return start_gather_ints(values, group, timeout, what).result()


def dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) + 1 if dtype in _DTYPES else 0


def dtype_name(code: int) -> str:
    return str(_DTYPES[code - 1]).removeprefix("torch.") if 0 < code <= len(_DTYPES) else "another dtype"


def device_code(device: torch.device) -> int:
    return _DEVICES.index(device.type) if device.type in _DEVICES else len(_DEVICES)


def device_name(code: int) -> str:
    return _DEVICES[code] if 0 <= code < len(_DEVICES) else "another device"


def describe_meta(row: list[int]) -> str:
    """zigzag_unshard's metadata row as words."""
    dim, ndim, dtype, device = row[:4]
    shape = ["N" if s == -1 else str(s) for s in row[4:4 + ndim]]
    return f"dim {dim} of a ({', '.join(shape)}) {dtype_name(dtype)} tensor on {device_name(device)}"


_transfer_groups: dict[tuple[tuple[int, ...], int], dist.ProcessGroup] = {}
MAX_TRANSFER_CTAS = 32  # NCCL's channels (one CTA each) a kernel may use at most


def transfer_group(group: dist.ProcessGroup, max_ctas: int) -> dist.ProcessGroup:
    """An NCCL group of ``group``'s ranks (in its order) whose kernels use at most ``max_ctas`` CTAs
    (ncclConfig_t's maxCTAs, as Megatron caps its overlapped communication), on a high-priority
    stream: NCCL's transfers then fit in the SMs an sm_margin leaves beside the attention. Made at
    the first call by the group's members (every rank of the ring calls with the same margin: the
    metadata gather checks it) and kept; ``group`` itself where this torch has no
    ProcessGroupNCCL.Options (then NCCL picks its CTAs)."""
    options_type = getattr(dist, "ProcessGroupNCCL", None)
    if options_type is None or not hasattr(options_type, "Options"):
        return group
    ctas = max(1, min(int(max_ctas), MAX_TRANSFER_CTAS))
    ranks = tuple(dist.get_process_group_ranks(group))
    in_order = {}  # the new group's ranks in ``group``'s order (the ring's direction and zigzag slices)
    if "sort_ranks" in inspect.signature(dist.new_group).parameters:
        in_order = dict(sort_ranks=False)
    elif list(ranks) != sorted(ranks):
        return group
    key = (ranks, ctas)
    with _metadata_lock:
        if key not in _transfer_groups:
            options = options_type.Options()
            options.config.min_ctas = 1
            options.config.max_ctas = ctas
            options.is_high_priority_stream = True
            _transfer_groups[key] = dist.new_group(list(ranks), backend="nccl", pg_options=options,
                                                   use_local_synchronization=True,
                                                   group_desc=f"tilecore_ring_{ctas}_ctas", **in_order)
        return _transfer_groups[key]
