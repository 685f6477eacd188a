"""What timing a kernel means, for every timer: a `Timing` row, the `LaunchUnderTest` a timer is
handed, the `Timer` protocol the flow's time and emit stages call (the `estimate` model,
lospmm.kernel.estimate, and the `cuda` timer, lospmm.kernel.cuda), and how measured times are
settled against their noise. Its figures say which timer made them; a model's are estimates and
never become speedups."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

import numpy as np

from lospmm.devices import Device
from lospmm.kernel.design import BASELINE, KernelDesign
from lospmm.status import Status


@dataclass(frozen=True)
class Timing:
    """One timed (or estimated) launch. `timer` says which: "estimate", "cuda", ..."""

    timer: str
    time_us: float
    status: Status = Status.OK
    message: str = ""
    compute_us: float = float("nan")
    memory_us: float = float("nan")
    latency_us: float = float("nan")
    active_blocks: int = 0
    repeats: int = 0
    fetch_us: float = float("nan")


@dataclass(frozen=True)
class LaunchUnderTest:
    """Everything a timer may need to time one launch of a proxy (`clusters` set, launched at `n1`
    threads with `smem_bytes` of Eq. 6 shared memory) or of a full kernel over `n` columns. The
    estimate reads the work (`tiles` or `clusters`, registers, spills, the design); a timer that runs
    binaries reads the compiled kernel: its `spec` and `cubin` (its design is the spec's)."""

    tiles: object  # reorder.Tiles of the candidate's M1 (None for a proxy: its clusters say what it runs)
    m: int
    k: int
    n: int
    n1: int
    registers: int
    spill_bytes: int = 0
    smem_bytes: int = 0
    clusters: object | None = None  # cluster.ProxyClusters for a proxy
    spec: object | None = None  # kernel.spec.KernelSpec of the compiled kernel
    cubin: bytes | None = None
    design: KernelDesign = BASELINE
    module_data: Mapping | None = field(default=None, compare=False, hash=False)  # spec.module_data(A), if any
    matrix: object | None = field(default=None, compare=False, hash=False)  # the layer's A (a staged estimate's unions)
    conv: bool = False  # an implicit-im2col conv kernel's launch (its V lanes each load their own pixel's input)

    def __post_init__(self):
        if self.spec is not None:
            object.__setattr__(self, "design", self.spec.design)
            object.__setattr__(self, "conv", self.spec.form == "conv")


class Timer(Protocol):
    """Times proxies and full kernels. `name` goes into every row it times ("estimate" or "cuda");
    `measures` is False for a model: its figures are estimates and never become speedups;
    `runs_binary`: it launches compiled kernels (then a launch needs its spec and cubin)."""

    name: str
    device: Device  # the table entry the search sized its candidates for
    measures: bool
    runs_binary: bool

    def time(self, launch: LaunchUnderTest) -> Timing: ...

    def dense(self, m: int, k: int, n: int, dtype: str = "fp32") -> Timing:
        """The dense library GEMM of the layer's shape in `dtype` (fp32: SGEMM, TF32 off)."""
        ...

    def checked(self, spec, cubin: bytes, matrix, count: int):  # at every path: kernel.check.checked_paths
        """The kernel's check (kernel.check.CheckResult) where this timer runs it; None: it runs nothing."""
        ...


# --- measured times and their noise (issue 24) -----------------------------------------------------


@dataclass(frozen=True)
class SettledTime:
    """A measured time with its noise: `us` the median of the kept measurement, `spread` its
    repeats' (max − min) / median, `attempts` how many measurements were made, `flagged` when even
    the last one spread more than the bound (a figure to quote with care, never averaged in)."""

    us: float
    spread: float
    attempts: int
    flagged: bool


def settled(measure: Callable[[], tuple[float, float]], bound: float = 0.10, attempts: int = 2) -> SettledTime:
    """`measure()` -> (median µs, spread over ≥ 3 repeats) until the spread is within `bound`, at
    most `attempts` times. The last measurement is kept whole: a noisy one is re-measured, not
    averaged with the next, and one still noisy after the last attempt is flagged."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    for attempt in range(1, attempts + 1):
        us, spread = measure()
        if np.isfinite(spread) and spread <= bound:
            return SettledTime(us, spread, attempt, False)
    return SettledTime(us, spread, attempts, True)
