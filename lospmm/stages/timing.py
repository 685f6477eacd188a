"""Stage 9, time: the `estimate` timer, an analytic model of one launch (no GPU needed).

Its figures are ESTIMATES and every row that carries one says `timer = "estimate"` (or
"estimate:<calibration>" when a device's calibration is used). The `cuda`
timer (measured, on a GPU) lives in `lospmm.runtime`; both fill the same `Timing`.

The model, per launch of a full kernel or proxy with tile (M1, N1) over N columns:
- Work per thread of A_tile t: loads_t B loads (its non-empty columns, or NNC_p for a proxy),
  fmas_t multiply-adds, M1 stores. Instructions per warp: fmas_t + (1 + addr)·loads_t + 2·M1 +
  overhead (addr = integer instructions per load, 2 as read from the SASS).
- Occupancy: resident blocks per SM from registers (allocated per warp in 256s), threads, the
  block limit and shared memory (a proxy's Eq. 6 padding counts).
- Compute: all warps' instructions over the SMs' issue rate (4 warp-instructions per cycle) and
  FFMA rate (FP32 lanes / 32 per cycle), whichever binds.
- Memory: DRAM bytes (B and C once, plus spills) over DRAM bandwidth, and L2 bytes (every block's
  B column reads, C stores, spills, and its instruction stream at 16 B per instruction: these
  kernels are straight-line code) over L2 bandwidth.
- Latency: each warp waits `mem_latency / (1 + prefetch)` per load; resident warps overlap.
- Time = launch overhead + max(compute, memory, latency, longest single block).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from lospmm.stages.codegen import BASELINE, KernelDesign, LaunchLayout
from lospmm.stages.devices import Device
from lospmm.stages.occupancy import resident_blocks
from lospmm.stages.status import Status


@dataclass(frozen=True)
class EstimateParams:
    """Defaults: launch_us=3.0, addr_instr_per_load=2, block_overhead_instr=24, call_instr=6
    (a tile is a function: the call, its argument moves and the EXIT that ends it, measured in
    SASS by benchmarks/sass_efficiency.py), store_instr=2, sass_bytes_per_instr=16, issue_per_sm_cycle=4."""

    launch_us: float = 3.0
    addr_instr_per_load: int = 2
    block_overhead_instr: int = 24
    call_instr: int = 6
    store_instr: int = 2
    sass_bytes_per_instr: int = 16
    issue_per_sm_cycle: int = 4


@dataclass(frozen=True)
class KernelWork:
    """What one launch does, per A_tile (block row): per-thread loads and multiply-adds."""

    m: int
    k: int
    n: int
    m1: int
    n1: int
    tile_loads: np.ndarray
    tile_fmas: np.ndarray
    registers: int
    spill_bytes: int = 0  # per thread, stores + loads
    smem_bytes: int = 0  # dynamic, per block
    zero_blocks: int = 0  # full kernel: blocks that zero empty rows
    prefetch: int = 1


@dataclass(frozen=True)
class Timing:
    """One timed (or estimated) launch. `timer` says which: "estimate" or "cuda"."""

    timer: str
    time_us: float
    status: Status = Status.OK
    message: str = ""
    compute_us: float = float("nan")
    memory_us: float = float("nan")
    latency_us: float = float("nan")
    active_blocks: int = 0
    repeats: int = 0


def full_kernel_work(tiles, m: int, k: int, n: int, n1: int, registers: int, spill_bytes: int = 0,
                     prefetch: int = 1) -> KernelWork:
    """The full Alg. 2 kernel of `tiles` (a reorder.Tiles)."""
    zero = -(-len(tiles.empty_rows) // max(tiles.m1, 1)) if len(tiles.empty_rows) else 0
    return KernelWork(m, k, n, tiles.m1, n1, np.asarray(tiles.tile_nnc, np.int64), np.asarray(tiles.tile_nnz, np.int64),
                      registers, spill_bytes, 0, zero, prefetch)


def proxy_work(clusters, m: int, k: int, n: int, n1: int, registers: int, smem_bytes: int, spill_bytes: int = 0,
               prefetch: int = 1) -> KernelWork:
    """The M1 proxy (a cluster.ProxyClusters) launched for candidate (M1, N1)."""
    loads = np.asarray(clusters.nnc_p, np.int64)[clusters.cluster_of]
    fmas = loads * np.asarray(clusters.cpl, np.int64)[clusters.cluster_of]
    return KernelWork(m, k, n, clusters.m1, n1, loads, fmas, registers, spill_bytes, smem_bytes, 0, prefetch)


def estimated_timing(work: KernelWork, device: Device, params: EstimateParams = EstimateParams()) -> Timing:
    """The analytic estimate of one launch (see the module docstring); Status.ERROR if it cannot run."""
    if work.n < 1 or work.n1 < 1 or work.n1 > device.max_threads_per_block:
        return Timing("estimate", float("inf"), Status.ERROR, f"cannot launch N={work.n} with N1={work.n1}")
    if work.registers > device.max_regs_per_thread:
        return Timing("estimate", float("inf"), Status.ERROR, f"{work.registers} registers > {device.max_regs_per_thread}")
    atb = resident_blocks(work.registers, work.n1, work.smem_bytes, device)
    if atb < 1:
        return Timing("estimate", float("inf"), Status.ERROR, "no block fits on an SM")
    ws = device.warp_size
    grid_y = -(-work.n // work.n1)
    full_y, rem = divmod(work.n, work.n1)
    # warps of all column blocks of one block row (the last column block may be partial)
    warps_per_row = full_y * -(-work.n1 // ws) + (-(-rem // ws) if rem else 0)
    threads_per_row = work.n
    loads = work.tile_loads.astype(np.float64)
    fmas = work.tile_fmas.astype(np.float64)
    instr = (fmas + (1 + params.addr_instr_per_load) * loads + params.store_instr * work.m1
             + params.block_overhead_instr + params.call_instr)
    spill_instr = work.spill_bytes / 4.0
    instr = instr + spill_instr
    zero_instr = params.store_instr * work.m1 + params.block_overhead_instr
    total_warp_instr = warps_per_row * (instr.sum() + work.zero_blocks * zero_instr)
    total_warp_ffma = warps_per_row * fmas.sum()
    sm_cycles_issue = total_warp_instr / (device.sms * params.issue_per_sm_cycle)
    sm_cycles_ffma = total_warp_ffma / (device.sms * device.fp32_lanes_per_sm / ws)
    clock_hz = device.clock_ghz * 1e9
    compute_s = max(sm_cycles_issue, sm_cycles_ffma) / clock_hz

    rows_written = work.m  # every row of C is written once (tiles or zero blocks)
    dram = 4.0 * (work.k * work.n + rows_written * work.n) + threads_per_row * work.spill_bytes * len(loads)
    l2 = (4.0 * threads_per_row * (loads.sum() + work.m1 * (len(loads) + work.zero_blocks))
          + threads_per_row * work.spill_bytes * len(loads)
          + params.sass_bytes_per_instr * grid_y * (instr.sum() + work.zero_blocks * zero_instr))
    memory_s = max(dram / (device.dram_gbps * 1e9), l2 / (device.l2_gbps * 1e9))

    wait = device.mem_latency_cycles / (1 + work.prefetch)
    resident_warps = device.sms * atb * -(-work.n1 // ws)
    latency_s = warps_per_row * loads.sum() * wait / resident_warps / clock_hz
    longest_s = (loads.max(initial=0) * wait + instr.max(initial=0)) / clock_hz
    body = max(compute_s, memory_s, latency_s, longest_s)
    return Timing("estimate", params.launch_us + body * 1e6, Status.OK, "", compute_s * 1e6, memory_s * 1e6,
                  latency_s * 1e6, atb, 0)


def untimed_reason(launch: dict, compiled: dict | None, has_clusters: bool) -> str:
    """Why a chosen candidate's proxy cannot be timed ("" if it can): its launch failed upstream,
    or its proxy did not compile (or has no clusters)."""
    if launch["status"] != Status.OK:
        return launch["message"]
    if compiled is None or compiled["status"] != Status.OK or not has_clusters:
        return "its proxy did not compile"
    return ""


# --- timers: one interface, chosen once per run ------------------------------------------------


@dataclass(frozen=True)
class LaunchUnderTest:
    """Everything a timer may need to time one launch of a proxy (`clusters` set) or of a full
    kernel (`clusters` None). `cubin` is only read by timers that run it (`Timer.runs_binary`)."""

    tiles: object  # reorder.Tiles of the candidate's M1
    m: int
    k: int
    n: int
    n1: int
    registers: int
    spill_bytes: int = 0
    smem_bytes: int = 0
    clusters: object | None = None  # cluster.ProxyClusters for a proxy
    kernel: str = ""  # the symbol in the cubin
    layout: LaunchLayout | None = None  # how it is launched (KernelSource.layout); None: the baseline's
    cubin: bytes | None = None
    conv: object | None = None  # codegen.ConvGeometry of an implicit-im2col conv kernel (N = batch·h_out·w_out)
    design: KernelDesign = BASELINE

    @property
    def launch_layout(self) -> LaunchLayout:
        """`layout`, or the baseline design's: a proxy's blocks are its tiles' (N1 given at launch),
        a full kernel's its tiles and zeroing blocks, N1 threads each."""
        if self.layout is not None:
            return self.layout
        if self.clusters is not None:
            return LaunchLayout(len(self.clusters.cluster_of), 0)
        zero = -(-len(self.tiles.empty_rows) // max(self.tiles.m1, 1))
        return LaunchLayout(self.tiles.num_tiles + zero, self.n1)


class Timer(Protocol):
    """Times proxies and full kernels. `name` goes into every row it times ("estimate" or "cuda");
    `measures` is False for a model: its figures are estimates and never become speedups."""

    name: str
    device: Device  # the table entry the search sized its candidates for
    measures: bool
    runs_binary: bool

    def time(self, launch: LaunchUnderTest) -> Timing: ...

    def dense(self, m: int, k: int, n: int) -> Timing: ...

    def device_error(self, launch: LaunchUnderTest, matrix, n: int) -> float | None:
        """Max relative error of a full kernel run where this timer runs it; None: it runs nothing."""
        ...


@dataclass(frozen=True)
class EstimateTimer:
    """The analytic model above, on the built-in device table: no GPU needed, estimates only."""

    device: Device
    params: EstimateParams = field(default_factory=EstimateParams)
    name: str = "estimate"
    measures: bool = False
    runs_binary: bool = False

    def time(self, launch: LaunchUnderTest) -> Timing:
        if launch.clusters is not None:
            work = proxy_work(launch.clusters, launch.m, launch.k, launch.n, launch.n1, launch.registers,
                              launch.smem_bytes, launch.spill_bytes)
        else:
            work = full_kernel_work(launch.tiles, launch.m, launch.k, launch.n, launch.n1, launch.registers,
                                    launch.spill_bytes)
        return estimated_timing(work, self.device, self.params)

    def dense(self, m: int, k: int, n: int) -> Timing:
        # no dense baseline from a model: a speedup is only ever a ratio of two measurements
        return Timing(self.name, float("nan"), Status.SKIPPED, "the estimate timer has no dense baseline")

    def device_error(self, launch: LaunchUnderTest, matrix, n: int) -> None:
        return None  # nothing runs: the emitted kernel is checked on the host instead


# --- calibration: the estimate's throughput parameters fitted to measurements ------------------

CALIBRATED_PARAMS = ("launch_us", "addr_instr_per_load", "block_overhead_instr", "sass_bytes_per_instr",
                     "issue_per_sm_cycle")
CALIBRATED_DEVICE = ("dram_gbps", "l2_gbps", "mem_latency_cycles")


def _with(device: Device, params: EstimateParams, x: np.ndarray) -> tuple[Device, EstimateParams]:
    from dataclasses import replace

    values = np.exp(x)
    p = replace(params, **dict(zip(CALIBRATED_PARAMS, values[:len(CALIBRATED_PARAMS)])))
    d = replace(device, **dict(zip(CALIBRATED_DEVICE, values[len(CALIBRATED_PARAMS):])))
    return d, p


def calibrated_estimate(works: list[KernelWork], measured_us, device: Device,
                        params: EstimateParams = EstimateParams(), max_factor: float = 20.0,
                        starts: int = 8) -> tuple[Device, EstimateParams]:
    """The device's and the model's throughput parameters (CALIBRATED_DEVICE, CALIBRATED_PARAMS)
    that minimise the squared log error of the estimate against `measured_us`, each kept within
    `max_factor` of its starting value. The model is a max of terms, flat where another term
    binds, so the fit (scipy's least_squares over log-parameters, finite differences) starts from
    the given values and from `starts - 1` seeded points around them, and keeps the best."""
    from scipy.optimize import least_squares

    measured = np.asarray(measured_us, np.float64)
    keep = np.isfinite(measured) & (measured > 0)
    works = [w for w, k in zip(works, keep) if k]
    target = np.log(measured[keep])
    x0 = np.log([*(float(getattr(params, f)) for f in CALIBRATED_PARAMS),
                 *(float(getattr(device, f)) for f in CALIBRATED_DEVICE)])

    def residuals(x):
        d, p = _with(device, params, x)
        est = np.array([estimated_timing(w, d, p).time_us for w in works])
        return np.where(np.isfinite(est), np.log(np.maximum(est, 1e-9)), 20.0) - target

    lo, hi = x0 - np.log(max_factor), x0 + np.log(max_factor)
    rng = np.random.default_rng(0)
    best = None
    for i in range(max(starts, 1)):
        start = x0 if i == 0 else np.clip(x0 + rng.uniform(-1, 1, len(x0)) * np.log(max_factor) / 2, lo, hi)
        fit = least_squares(residuals, start, bounds=(lo, hi), diff_step=1e-2, max_nfev=200)
        if best is None or fit.cost < best.cost:
            best = fit
    return _with(device, params, best.x)


@dataclass(frozen=True)
class Calibration:
    """The estimate's parameters fitted to one GPU's measured launches: effective values, some far
    from the datasheet (sass_bytes_per_instr near 320: fetching straight-line code costs far more
    than its bytes over L2 bandwidth, most in M1 = 1 kernels, whose code is largest)."""

    label: str  # in the timer's name ("estimate:<label>"), so every row it times says which model
    measured_on: str
    how: str
    params: tuple[tuple[str, float], ...]  # CALIBRATED_PARAMS
    device: tuple[tuple[str, float], ...]  # CALIBRATED_DEVICE


CALIBRATIONS: dict[str, Calibration] = {
    "h100": Calibration(
        "h100-2026-11-22",
        "NVIDIA H100 80GB HBM3, driver 580.159.04, 2026-11-22",
        "benchmarks/gpu_plan.py calibrate on the 266 launches measured at sparsity 0.9 (210 proxies and "
        "full kernels of 11 sampled layers, 56 emitted kernels; benchmarks/results/gpu-h100/c, d); every "
        "launch at 0.7 and 0.95 held out (194 sampled, 112 emitted). sass_bytes_per_instr ended at the "
        "fit's bound (20× the datasheet's 16)",
        (("launch_us", 4.2916), ("addr_instr_per_load", 22.5319), ("block_overhead_instr", 213.2503),
         ("sass_bytes_per_instr", 319.877), ("issue_per_sm_cycle", 5.9432)),
        (("dram_gbps", 2248.7559), ("l2_gbps", 46470.1042), ("mem_latency_cycles", 189.1134)),
    ),
}


def estimate_timer(device: Device, calibrated: bool = True) -> EstimateTimer:
    """The `estimate` timer for `device`: with the device's calibration when it has one (see
    CALIBRATIONS; then named "estimate:<label>"), the datasheet model ("estimate") otherwise or
    when `calibrated` is False."""
    from dataclasses import replace

    calibration = CALIBRATIONS.get(device.name) if calibrated else None
    if calibration is None:
        return EstimateTimer(device)
    return EstimateTimer(replace(device, **dict(calibration.device)), replace(EstimateParams(), **dict(calibration.params)),
                         name=f"estimate:{calibration.label}")
