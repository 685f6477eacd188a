"""Hardware counters of emitted kernels under Nsight Compute (ncu): where each kernel's issue slots go.

The question per kernel: do its warps wait for instructions (instruction fetch, i-cache misses:
stall reasons no_instruction and branch_resolving) or for data (long_scoreboard, lg_throttle, ...)?
Our full kernels are straight-line code (16 bytes a SASS instruction, tens of KB to MBs a kernel)
that each block walks once, so the hypothesis is instruction supply. Read off each kernel: warp
instructions executed (and per warp, against the static SASS count), issue-slot utilisation,
achieved occupancy, the stall reasons in cycles per issued instruction and as shares of all
stalls, and the SM's instruction caches (ICC hit rate, GCC instruction misses).

    # on the GPU machine, first: are the metric names below known to this ncu for this chip?
    python -m benchmarks.kernel_counters list-metrics [--chip gh100]
    # the process ncu profiles (no torch): one kernel of a bundle, launched R times
    python -m benchmarks.kernel_counters launch BUNDLE ID [--n N] [--repeats 3]
    # ncu over the chosen kernels: OUT/counters.parquet (rows id, metric, unit, value) and a table
    python -m benchmarks.kernel_counters profile BUNDLE OUT [--ids ID ...] [--set SET] [--limit K]
                                                       [--collect metrics|sections] [--timeout-s 300]
    # the table again, anywhere
    python -m benchmarks.kernel_counters report OUT [--bundle BUNDLE]

A bundle is the device program's (benchmarks.bundle): launches.parquet (id, set, model, layer, m, k, n,
kernel, package, instructions, ...) and a kernel package per kernel; a launch runs a row's kernel as
its KernelSpec says, at the row's count (N or a batch), on random input of its dtype.

Metric names: Nsight Compute's Kernel Profiling Guide (Warp Stall Reasons, Metrics Reference) and
the rule scripts that ship with ncu (CPIStall, IssueSlotUtilization) use the names below; all were
seen in H100 (sm_90) reports of Nsight Compute 2025.x. `list-metrics` checks them on the machine
itself. Where ncu cannot read counters (gVisor machines: "LibraryNotLoaded"), CUPTI's profiler
host API (cupti-python >= 13.3) reads the same metric names in-process; that is not built here.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = Path(__file__).resolve()

# --- the metrics ---------------------------------------------------------------------------------

# Stall reasons as ncu's WarpStateStats section and CPIStall rule name them: each
# smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio is the average number of warps
# in that state per cycle an instruction issued, i.e. cycles a warp spends in it between two of its
# instructions; over all reasons (with `selected`, = 1 for the issue itself) they sum to the warp's
# cycles per issued instruction. The PC-sampling family spells one of them differently
# (smsp__pcsamp_warps_issue_stalled_no_instructions, with an s): not used here.
STALL_REASONS = (
    "no_instruction",  # waiting to be selected to fetch an instruction, or on an instruction cache miss
    "branch_resolving",  # waiting for a branch (our CALL/RET into tile functions) target and the PC update
    "long_scoreboard",  # waiting on an L1TEX operation: global loads of B
    "lg_throttle",  # the local/global (LSU) instruction queue is full
    "short_scoreboard",  # waiting on an MIO operation (shared memory, special math)
    "mio_throttle",  # the MIO queue is full
    "imc_miss",  # immediate constant cache miss (kernel parameters, constants the compiler put in a bank)
    "wait",  # a fixed-latency dependency (the compiler's stall counts)
    "math_pipe_throttle",  # the FMA (or other math) pipe is busy
    "tex_throttle",
    "dispatch_stall",
    "barrier",
    "membar",
    "drain",  # waiting for stores to drain at EXIT
    "sleeping",
    "misc",
    "not_selected",  # eligible, but another warp issued: the scheduler had a choice
    "selected",  # issued: 1 by definition, not a stall
)
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"

# Waiting for instructions vs waiting for operands: the two sums the table reports.
FETCH_STALLS = ("no_instruction", "branch_resolving")
DATA_STALLS = ("long_scoreboard", "lg_throttle", "short_scoreboard", "mio_throttle", "imc_miss")

INST_EXECUTED = "smsp__inst_executed.sum"  # warp instructions executed, whole launch
ISSUE_ACTIVE = "smsp__issue_active.avg.pct_of_peak_sustained_active"  # issue-slot utilisation, % of active cycles
WARP_CPI = "smsp__average_warp_latency_per_inst_issued.ratio"  # cycles between two issues of one warp
ACHIEVED_OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
THEORETICAL_OCCUPANCY = "sm__maximum_warps_per_active_cycle_pct"
GRID_SIZE, BLOCK_SIZE = "launch__grid_size", "launch__block_size"
ICC_HIT_RATE = "sm__icc_request_hit_rate.pct"  # the SM's L0/L1 instruction cache
GCC_INSTRUCTION_REQUESTS = "gcc__cache_requests_type_instruction.sum"  # ICC misses sent to the GPC cache (L1.5)
GCC_INSTRUCTION_MISSES = "gcc__cache_requests_type_instruction_lookup_miss.sum"  # ... that went on to L2

ISSUE_METRICS = (
    INST_EXECUTED,
    ISSUE_ACTIVE,
    WARP_CPI,
    "smsp__warps_eligible.avg.per_cycle_active",  # warps ready to issue per scheduler cycle
    "smsp__warps_active.avg.per_cycle_active",
    "smsp__inst_executed_op_branch.sum",  # BRA, CALL, RET ... executed
    "smsp__cycles_active.avg",
    "sm__cycles_elapsed.avg",
    "gpu__time_duration.sum",
)
OCCUPANCY_METRICS = (
    ACHIEVED_OCCUPANCY,
    THEORETICAL_OCCUPANCY,
    GRID_SIZE,
    BLOCK_SIZE,
    "launch__registers_per_thread",
    "launch__waves_per_multiprocessor",
)
STALL_METRICS = tuple(STALL_METRIC.format(r) for r in STALL_REASONS)
# Instruction caches: not in any section, so asked for by name in both collect modes. The ICC
# counts are in cycles (requests per cycle summed), the GCC ones in requests: never divide one by
# the other.
ICACHE_METRICS = (
    ICC_HIT_RATE,
    "sm__icc_requests.sum",
    "sm__icc_requests_lookup_hit.sum",
    "sm__icc_requests_lookup_miss.sum",
    GCC_INSTRUCTION_REQUESTS,
    GCC_INSTRUCTION_MISSES,
    "smsp__imc_request_hit_rate.pct",  # the immediate constant cache, beside imc_miss stalls
)
# Where B's loads go: the L1 and L2 hit rates, and L1, L2 and DRAM throughput as a share of their peak
# (the MemoryWorkloadAnalysis and SpeedOfLight sections' names): is a kernel waiting on loads because
# a memory level is busy, or with the memory idle, because too few warps keep loads in flight?
L2_THROUGHPUT = "lts__throughput.avg.pct_of_peak_sustained_elapsed"
L1_THROUGHPUT = "l1tex__throughput.avg.pct_of_peak_sustained_active"
DRAM_THROUGHPUT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
L1_HIT_RATE = "l1tex__t_sector_hit_rate.pct"
L2_HIT_RATE = "lts__t_sector_hit_rate.pct"
MEMORY_METRICS = (L1_THROUGHPUT, L2_THROUGHPUT, DRAM_THROUGHPUT, L1_HIT_RATE, L2_HIT_RATE,
                  "lts__t_sectors_srcunit_tex_op_read.sum")  # L2 sectors L1 read: B's traffic through L2
DEFAULT_METRICS = ISSUE_METRICS + OCCUPANCY_METRICS + STALL_METRICS + ICACHE_METRICS + MEMORY_METRICS
# The sections alternative: every name inside them is one this ncu knows, so nothing can fail for
# a misspelt metric; their metric names are the ones above (read with --page raw).
DEFAULT_SECTIONS = ("LaunchStats", "Occupancy", "SchedulerStats", "WarpStateStats", "InstructionStats",
                    "SpeedOfLight", "MemoryWorkloadAnalysis")

# launch__* and device__* are launch attributes: ncu --query-metrics does not list them.
UNLISTED_PREFIXES = ("launch__", "device__", "profiler__")

NCU_MISSING = ("ncu not found: put Nsight Compute's ncu on PATH or pass --ncu PATH "
               "(the GPU image has it; on a gVisor machine it cannot read counters)")
CUPTI_NOTE = ("ncu could read no counters here; CUPTI's profiler host API (cupti-python >= 13.3) reads the "
              "same metric names in-process, but this script does not implement it")
UNREADABLE_MARKERS = ("LibraryNotLoaded", "ERR_NVGPUCTRPERM", "Failed to initialize the profiler")


@dataclass(frozen=True)
class ProfileOptions:
    """Defaults: collect="metrics", repeats=3, launch_skip=1, launch_count=1, clock_control="none",
    cache_control="all", timeout_s=300, n=None (the layer's N).

    repeats/launch_skip/launch_count: the launch process runs the kernel `repeats` times and ncu
    profiles the second launch only, so module loading and the first touch of B and of the code
    are not what is counted. clock_control "none": the device notes say ncu ran there with it
    (and to leave the clocks alone). cache_control "all": ncu flushes the caches before each
    replay pass, as our timer flushes L2 before each timed launch, so every pass starts as cold
    as a timed launch does. timeout_s: one kernel's ncu run, replay passes included."""

    collect: str = "metrics"  # "metrics": --metrics METRICS; "sections": --section SECTIONS plus the i-cache metrics
    metrics: tuple[str, ...] = DEFAULT_METRICS
    sections: tuple[str, ...] = DEFAULT_SECTIONS
    repeats: int = 3
    launch_skip: int = 1
    launch_count: int = 1
    clock_control: str = "none"
    cache_control: str = "all"
    timeout_s: float = 300.0
    n: int | None = None

    def problem(self) -> str:
        """One line saying what is wrong with these options, or ""."""
        if self.collect not in ("metrics", "sections"):
            return f"--collect must be metrics or sections, not {self.collect!r}"
        if self.launch_skip < 0 or self.launch_count < 1 or self.launch_skip + self.launch_count > self.repeats:
            return (f"ncu would wait for launch {self.launch_skip + self.launch_count} of {self.repeats}: "
                    f"--repeats must be at least launch_skip + launch_count")
        return ""


# --- bundles -------------------------------------------------------------------------------------


def kernel_rows(bundle: Path) -> list[dict]:
    from benchmarks.bundle import bundle_rows

    return bundle_rows(bundle)


def chosen_rows(rows: list[dict], ids: Sequence[str] = (), kernel_set: str | None = None,
                limit: int | None = None) -> tuple[list[dict], list[str]]:
    """The rows to profile (ids in the order given, else the bundle's order) and the ids asked
    for that the bundle does not hold."""
    by_id = {str(r["id"]): r for r in rows}
    missing = [i for i in ids if i not in by_id]
    picked = [by_id[i] for i in ids if i in by_id] if ids else list(rows)
    if kernel_set:  # benchmarks.sets' sets: ab, micro, headline, ...
        picked = [r for r in picked if str(r.get("set")) == kernel_set]
    return (picked[:limit] if limit else picked), missing


# --- the launch process ncu profiles ---------------------------------------------------------------


def launch(bundle: Path, kernel_id: str, n: int | None = None, repeats: int = 3, seed: int = 0) -> int:
    """Launch one kernel of the bundle `repeats` times on random input (as its spec says, at the row's
    count, or N columns) and synchronise. Returns the exit status; says nothing on stdout (ncu prints
    its CSV there)."""
    import numpy as np

    from benchmarks.bundle import matrix_of_row, package_of
    from lospmm.kernel.cuda import CudaKernel, DeviceBuffer, _ck

    if not (Path(bundle) / "launches.parquet").is_file():
        print(f"{kernel_id}: {bundle} holds no launches.parquet", file=sys.stderr)
        return 2
    rows, missing = chosen_rows(kernel_rows(bundle), [kernel_id])
    if missing:
        print(f"{kernel_id}: not in {bundle}/launches.parquet", file=sys.stderr)
        return 2
    row = rows[0]
    buffers = []
    try:
        from cuda.bindings import driver

        spec = package_of(bundle, row).spec
        # an N:M kernel's compressed A goes into its module's globals (from the bundle's A)
        data = spec.module_data(matrix_of_row(bundle, row)) if spec.module_symbols else None
        kernel = CudaKernel(spec, package_of(bundle, row).cubin(), data)
        count = spec.launch_count(int(n or row["count"]))
        buffers = [DeviceBuffer.of(spec.number.sample(spec.input_shape(count), seed)), DeviceBuffer(spec.element_bytes * int(np.prod(spec.output_shape(count))))]
        threads = int(row["n1"]) if spec.n1_at_launch else None
        if row.get("cluster_of"):
            buffers.append(DeviceBuffer.of(np.asarray(row["cluster_of"], np.int32)))
        extra = [("ptr", b.ptr) for b in buffers[2:]]
        for _ in range(repeats):
            kernel.launch(buffers[0].ptr, buffers[1].ptr, count, 0, threads, extra, int(row.get("smem_bytes") or 0))
        _ck(driver.cuCtxSynchronize(), f"{row['kernel']} ({kernel_id})")
    except Exception as e:  # a CUDA error, no driver, a bad cubin: one line for ncu's log, and exit 1
        print(f"{kernel_id}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr)
        return 1
    finally:
        for buf in buffers:
            buf.close()
    print(f"{kernel_id}: {row['kernel']} launched {repeats}x, grid {spec.grid(count, threads)}, count {count}",
          file=sys.stderr)
    return 0


# --- ncu: finding it, the command line, running it -------------------------------------------------


def find_ncu(explicit: str | None = None) -> str | None:
    """`explicit` if given (and present), else ncu on PATH, else the newest of the usual installs."""
    if explicit:
        return explicit if (shutil.which(explicit) or Path(explicit).is_file()) else None
    found = shutil.which("ncu")
    if found:
        return found
    patterns = ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda*/bin/ncu", "/usr/local/cuda*/nsight-compute*/ncu")
    candidates = sorted((p for pat in patterns for p in Path("/").glob(pat.lstrip("/")) if p.is_file()), reverse=True)
    return str(candidates[0]) if candidates else None


def ncu_command(ncu: str, bundle: Path, row: dict, options: ProfileOptions = ProfileOptions(),
                metrics: Sequence[str] | None = None, python: str = sys.executable) -> list[str]:
    """The ncu command line that profiles launch `launch_skip` (counting from 0) of this row's
    kernel, and only that kernel: the filter is the cubin's entry symbol, matched exactly on the
    mangled name (our entries are extern "C", so mangled is the symbol itself)."""
    metrics = list(options.metrics if metrics is None else metrics)
    cmd = [ncu, "--csv", "--print-units", "base",
           # details: one row per metric ("Metric Name", "Metric Unit", "Metric Value"); raw: every
           # collected metric under its own name (a section's details rows carry display names)
           "--page", "details" if options.collect == "metrics" else "raw",
           "--kernel-name-base", "mangled", "--kernel-name", str(row["kernel"]),
           "--launch-skip", str(options.launch_skip), "--launch-count", str(options.launch_count),
           "--clock-control", options.clock_control, "--cache-control", options.cache_control]
    if options.collect == "sections":
        for s in options.sections:
            cmd += ["--section", s]
        metrics = [m for m in metrics if m in ICACHE_METRICS]
    if metrics:
        cmd += ["--metrics", ",".join(metrics)]
    # as a module from the checkout's root (run_command's cwd): lospmm and this package import from there
    cmd += [python, "-m", "benchmarks.kernel_counters", "launch", str(Path(bundle).resolve()), str(row["id"]),
            "--repeats", str(options.repeats)]
    if options.n:
        cmd += ["--n", str(options.n)]
    return cmd


@dataclass(frozen=True)
class Ran:
    """What one command did: its exit status (None: stopped at the time limit) and its output."""

    rc: int | None
    stdout: str
    stderr: str


def run_command(cmd: Sequence[str], timeout_s: float) -> Ran:
    """Run `cmd` in its own process group, so that at the time limit ncu and the launch process it
    started both end (killing ncu alone would leave the launch process running)."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=ROOT)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return Ran(proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return Ran(None, out or "", err or "")


def one_line(ran: Ran, limit: int = 300) -> str:
    """A failed run's reason in one line: ncu's last ==ERROR== line, else its last ==WARNING== line
    ("No kernels were profiled"), else the last line of stderr (the launch process's), else the
    exit status."""
    lines = [ln.strip() for ln in (ran.stdout + "\n" + ran.stderr).splitlines() if ln.strip()]
    err_lines = [ln.strip() for ln in ran.stderr.splitlines() if ln.strip()]
    for tag in ("==ERROR==", "==WARNING=="):
        tagged = [ln for ln in lines if ln.startswith(tag)]
        if tagged:
            return tagged[-1][:limit]
    return (err_lines[-1] if err_lines else f"exit status {ran.rc}")[:limit]


_UNKNOWN_METRIC = re.compile(r"Failed to find metric\s+(?:regex:)?\^?([A-Za-z0-9_]+)")


def unknown_metrics(output: str, requested: Sequence[str]) -> list[str]:
    """The requested metrics ncu said it does not know ("==ERROR== Failed to find metric
    regex:^name\\.(sum|...)$": it names the base, the part before the first dot)."""
    bases = set(_UNKNOWN_METRIC.findall(output))
    return [m for m in requested if m.split(".")[0] in bases]


# --- ncu's CSV ------------------------------------------------------------------------------------


def numeric(text: str) -> float:
    """A metric value as a number: thousands separators ("1,234,567") dropped; NaN for text that
    is not one ("n/a", "(256, 1, 1)")."""
    try:
        return float(text.replace(",", "").strip())
    except (ValueError, AttributeError):
        return math.nan


def _launch_id(text: str) -> int:
    value = numeric(text)
    return -1 if math.isnan(value) else int(value)


def _is_metric_column(name: str) -> bool:
    return "__" in name  # ncu's metric names are unit__counter...; the identity columns have none


def parse_ncu_csv(text: str) -> list[dict]:
    """Rows {launch, kernel, metric, unit, value, text} from `ncu --csv` output in either layout:
    --page details, one row per metric ("ID", ..., "Kernel Name", ..., "Metric Name", "Metric
    Unit", "Metric Value", and rule columns after a section); or --page raw, one row per launch,
    one column per metric, the units on the row below the header. ncu's own lines (==PROF==,
    ==WARNING==) and whatever the program printed before the table are skipped."""
    # ncu's own lines can come anywhere in its output, the table's too
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("==")]
    header_at = None
    for i, line in enumerate(lines):
        if '"Kernel Name"' in line or "Kernel Name" in line.split(","):
            fields = next(csv.reader([line]))
            if "ID" in fields and "Kernel Name" in fields:
                header_at = i
                break
    if header_at is None:
        return []
    table = list(csv.reader(io.StringIO("\n".join(lines[header_at:]))))
    header, body = table[0], table[1:]
    col = {name: j for j, name in enumerate(header)}
    rows = []
    if "Metric Name" in col:
        for rec in body:
            if len(rec) < len(header) or not rec[col["Metric Name"]]:
                continue  # a rule's row (its Rule columns filled, no metric)
            rows.append({"launch": _launch_id(rec[col["ID"]]), "kernel": rec[col["Kernel Name"]],
                         "metric": rec[col["Metric Name"]], "unit": rec[col["Metric Unit"]],
                         "value": numeric(rec[col["Metric Value"]]), "text": rec[col["Metric Value"]]})
        return rows
    units = {}
    if body and len(body[0]) == len(header) and not body[0][col["ID"]].strip():
        units, body = dict(zip(header, body[0])), body[1:]
    for rec in body:
        if len(rec) < len(header):
            continue
        for j, name in enumerate(header):
            if _is_metric_column(name):
                rows.append({"launch": _launch_id(rec[col["ID"]]), "kernel": rec[col["Kernel Name"]],
                             "metric": name, "unit": units.get(name, ""), "value": numeric(rec[j]), "text": rec[j]})
    return rows


# --- profiling ------------------------------------------------------------------------------------

ROW_KEYS = ("id", "kernel", "launch", "metric", "unit", "value", "text", "status", "message")


def _row(kernel_id: str, kernel: str, status: str, message: str = "", **kw) -> dict:
    base = {"id": kernel_id, "kernel": kernel, "launch": -1, "metric": "", "unit": "", "value": math.nan, "text": ""}
    return base | kw | {"status": status, "message": message}


@dataclass
class Profiler:
    """Runs ncu kernel after kernel. A metric ncu does not know is dropped (a `skipped` row says
    so) and the kernel tried again without it, and later kernels are not asked for it again."""

    ncu: str
    bundle: Path
    options: ProfileOptions = ProfileOptions()
    run: Callable[[Sequence[str], float], Ran] = run_command
    unknown: set[str] = field(default_factory=set)
    max_attempts: int = 8
    commands: list[str] = field(default_factory=list)

    def profile(self, row: dict) -> list[dict]:
        from lospmm.status import Status

        kid, kernel = str(row["id"]), str(row["kernel"])
        out = []
        for _ in range(self.max_attempts):  # ncu may name one unknown metric a run: each try drops at least one
            metrics = [m for m in self.options.metrics if m not in self.unknown]
            cmd = ncu_command(self.ncu, self.bundle, row, self.options, metrics)
            self.commands.append(" ".join(cmd))
            ran = self.run(cmd, self.options.timeout_s)
            dropped = unknown_metrics(ran.stdout + ran.stderr, metrics)
            if ran.rc is None or not dropped:
                break
            self.unknown.update(dropped)
            out += [_row(kid, kernel, Status.SKIPPED, "not a metric this ncu knows for this chip", metric=m)
                    for m in dropped]
        else:
            return out + [_row(kid, kernel, Status.ERROR, f"ncu refused metrics {self.max_attempts} times in a row")]
        if ran.rc is None:
            return out + [_row(kid, kernel, Status.ERROR, f"ncu stopped after {self.options.timeout_s:g} s")]
        parsed = parse_ncu_csv(ran.stdout)
        if ran.rc != 0 and not parsed:
            return out + [_row(kid, kernel, Status.ERROR, one_line(ran))]
        if not parsed:
            return out + [_row(kid, kernel, Status.ERROR, f"ncu profiled no launch of {kernel}: {one_line(ran)}")]
        return out + [_row(kid, kernel, Status.OK, **{k: p[k] for k in ("launch", "metric", "unit", "value", "text")})
                      for p in parsed]


def profile(args) -> None:
    ncu = find_ncu(args.ncu)
    if ncu is None:
        print(NCU_MISSING)
        raise SystemExit(2)
    options = ProfileOptions(collect=args.collect, repeats=args.repeats, timeout_s=args.timeout_s, n=args.n,
                             cache_control=args.cache_control)
    if options.problem():
        print(options.problem())
        raise SystemExit(2)
    bundle, out = Path(args.bundle), Path(args.out)
    if not (bundle / "launches.parquet").is_file():
        print(f"{bundle}: no launches.parquet (a bundle of benchmarks.bundle holds launches.parquet and its kernels' "
              f"packages)")
        raise SystemExit(2)
    rows, missing = chosen_rows(kernel_rows(bundle), args.ids or (), args.set, args.limit)
    from lospmm.status import Status

    profiler = Profiler(ncu, bundle, options)
    counters = [_row(i, "", Status.ERROR, f"not in {bundle}/launches.parquet") for i in missing]
    for i, row in enumerate(rows):
        try:
            got = profiler.profile(row)
        except Exception as e:  # ncu not executable, the output not text ...: this kernel's row, not the end
            got = [_row(str(row["id"]), str(row["kernel"]), Status.ERROR, f"{type(e).__name__}: {e}"[:300])]
        counters += got
        status = next((r["status"] for r in got if r["status"] != Status.SKIPPED), Status.ERROR)
        message = next((r["message"] for r in got if r["status"] == Status.ERROR), "")
        print(f"[{i + 1}/{len(rows)}] {row['id']} {row['kernel']}: {status} {message}".rstrip(), flush=True)
    write_counters(counters, out)
    (out / "ncu-commands.txt").write_text("\n".join(profiler.commands) + "\n")
    print_summary(summary_rows(counters, rows), f"{out}/counters.parquet: {len(counters)} rows")
    failures = [r["message"] for r in counters if r["status"] == Status.ERROR]
    if failures and not any(r["status"] == Status.OK for r in counters) and all(
            any(mark in f for mark in UNREADABLE_MARKERS) for f in failures):
        print(CUPTI_NOTE)


def write_counters(rows: list[dict], out: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    columns = {k: [r[k] for r in rows] for k in ROW_KEYS}
    types = {"launch": pa.int64(), "value": pa.float64()}
    table = pa.table({k: pa.array([str(v) for v in vs] if k not in types else vs, type=types.get(k, pa.string()))
                      for k, vs in columns.items()})
    pq.write_table(table, out / "counters.parquet")
    return out / "counters.parquet"


# --- the table ------------------------------------------------------------------------------------


def summary_rows(counters: list[dict], kernels: list[dict] = ()) -> list[dict]:
    """One row per kernel: instructions executed (and per warp, against the static SASS count when
    the bundle's row is given), issue-slot utilisation, occupancy, cycles per issued instruction,
    the shares of all stall cycles spent waiting for instructions (fetch) and for operands
    (data), the top stall reasons (cycles per issued instruction, share), and the i-caches."""
    from lospmm.status import Status

    static = {str(k["id"]): k.get("instructions") for k in kernels}
    ids = list(dict.fromkeys(r["id"] for r in counters))
    out = []
    for kid in ids:
        mine = [r for r in counters if r["id"] == kid]
        values = {}
        for r in mine:
            if r["status"] == Status.OK:
                values.setdefault(r["metric"], r["value"])  # the first launch profiled
        errors = [r["message"] for r in mine if r["status"] == Status.ERROR]
        if errors or not values:
            out.append({"id": kid, "status": str(Status.ERROR), "message": errors[0] if errors else "no counters"})
            continue
        get = lambda name: values.get(name, math.nan)  # noqa: E731
        stalls = {r: get(STALL_METRIC.format(r)) for r in STALL_REASONS if r != "selected"}
        known = {r: v for r, v in stalls.items() if not math.isnan(v)}
        total = sum(known.values())
        share = lambda names: (100 * sum(known.get(n, 0.0) for n in names) / total) if total else math.nan  # noqa: E731
        warps = get(GRID_SIZE) * math.ceil(get(BLOCK_SIZE) / 32) if not math.isnan(get(BLOCK_SIZE)) else math.nan
        top = sorted(known.items(), key=lambda kv: -kv[1])[:4]
        gcc = get(GCC_INSTRUCTION_REQUESTS)
        out.append({
            "id": kid, "status": str(Status.OK),
            "inst_executed": get(INST_EXECUTED),
            "inst_per_warp": get(INST_EXECUTED) / warps if warps else math.nan,
            "sass_instructions": static.get(kid),
            "issue_active_pct": get(ISSUE_ACTIVE),
            "occupancy_pct": get(ACHIEVED_OCCUPANCY),
            "theoretical_occupancy_pct": get(THEORETICAL_OCCUPANCY),
            "cycles_per_issue": get(WARP_CPI),
            "fetch_stall_pct": share(FETCH_STALLS),
            "data_stall_pct": share(DATA_STALLS),
            "top_stalls": ", ".join(f"{r} {v:.2f} ({100 * v / total:.0f}%)" for r, v in top) if total else "",
            "top_stall": f"{top[0][0]} {100 * top[0][1] / total:.0f}%" if total and top else "",
            "icc_hit_pct": get(ICC_HIT_RATE),
            "gcc_instruction_miss_pct": 100 * get(GCC_INSTRUCTION_MISSES) / gcc if gcc else math.nan,
            "l1_pct": get(L1_THROUGHPUT), "l2_pct": get(L2_THROUGHPUT), "dram_pct": get(DRAM_THROUGHPUT),
            "l1_hit_pct": get(L1_HIT_RATE), "l2_hit_pct": get(L2_HIT_RATE),
            "message": "",
        })
    return out


# (summary key, table header, format): counts whole, percentages and ratios short
SUMMARY_COLUMNS = (
    ("id", "id", "{}"), ("status", "status", "{}"),
    ("inst_executed", "warp inst", "{:,.0f}"), ("inst_per_warp", "inst/warp", "{:,.0f}"),
    ("sass_instructions", "SASS", "{:,}"), ("issue_active_pct", "issue %", "{:.1f}"),
    ("occupancy_pct", "occ %", "{:.1f}"), ("theoretical_occupancy_pct", "theor %", "{:.1f}"),
    ("cycles_per_issue", "CPI", "{:.2f}"), ("fetch_stall_pct", "fetch %", "{:.0f}"), ("data_stall_pct", "data %", "{:.0f}"),
    ("icc_hit_pct", "ICC hit %", "{:.1f}"), ("gcc_instruction_miss_pct", "GCC miss %", "{:.1f}"),
    ("l1_pct", "L1 %", "{:.1f}"), ("l2_pct", "L2 %", "{:.1f}"), ("dram_pct", "DRAM %", "{:.1f}"),
    ("l1_hit_pct", "L1 hit %", "{:.1f}"), ("l2_hit_pct", "L2 hit %", "{:.1f}"),
    ("top_stalls", "top stalls: cycles/issue (share)", "{}"), ("top_stall", "top stall (share)", "{}"),
    ("message", "message", "{}"),
)


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def print_summary(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title + "\nstalls in cycles per issued instruction (share of all stall cycles); fetch = "
              + "+".join(FETCH_STALLS) + ", data = " + "+".join(DATA_STALLS))
    for key, header, _ in SUMMARY_COLUMNS:
        t.add_column(header, no_wrap=key not in ("top_stalls", "message"),
                     justify="left" if key in ("id", "status", "top_stalls", "message") else "right")
    for r in rows:
        t.add_row(*[_cell(r.get(key), fmt) for key, _, fmt in SUMMARY_COLUMNS])
    Console(width=240).print(t)


def report(args) -> None:
    import pyarrow.parquet as pq

    path = Path(args.out) / "counters.parquet"
    if not path.is_file():
        print(f"{path}: not found (profile writes it)")
        raise SystemExit(2)
    counters = pq.read_table(path).to_pylist()
    kernels = kernel_rows(Path(args.bundle)) if args.bundle else []
    print_summary(summary_rows(counters, kernels), str(path))


# --- checking the names on the machine --------------------------------------------------------------


def listed_metric_names(query_output: str) -> set[str]:
    """The base metric names in `ncu --query-metrics` output (the first word of each table row)."""
    return {m.group(1) for m in re.finditer(r"^\s*([a-z0-9]+__[A-Za-z0-9_]+)", query_output, flags=re.M)}


def metric_check(query_output: str, metrics: Sequence[str] = DEFAULT_METRICS) -> list[tuple[str, str]]:
    """(metric, "listed" | "NOT LISTED" | "launch attribute (not listed by --query-metrics)")."""
    listed = listed_metric_names(query_output)
    return [(m, "launch attribute (not listed by --query-metrics)" if m.startswith(UNLISTED_PREFIXES)
             else "listed" if m.split(".")[0] in listed else "NOT LISTED") for m in metrics]


LIST_PATTERN = re.compile(r"stall|icc|gcc__cache_requests_type_instruction|inst_executed|issue_active|warps_active|"
                          r"warps_eligible|imc_", flags=re.I)


def list_metrics(args) -> None:
    ncu = find_ncu(args.ncu)
    if ncu is None:
        print(NCU_MISSING)
        raise SystemExit(2)
    cmd = [ncu, "--query-metrics", "--query-metrics-mode", "base"] + (["--chip", args.chip] if args.chip else [])
    print("$ " + " ".join(cmd), flush=True)
    ran = run_command(cmd, 120)
    if ran.rc != 0:
        print(f"ncu --query-metrics failed: {one_line(ran)}")
        raise SystemExit(1)
    for line in ran.stdout.splitlines():
        if LIST_PATTERN.search(line):
            print(line.rstrip())
    print("\nthe metrics `profile` asks for:")
    for m, verdict in metric_check(ran.stdout):
        print(f"  {verdict:12s} {m}")
    listed = set(re.findall(r"^\s*(\w+)", run_command([ncu, "--list-sections"], 60).stdout, flags=re.M))
    print("\nsections (`--collect sections`): "
          + ", ".join(f"{s} {'listed' if s in listed else 'NOT LISTED'}" for s in DEFAULT_SECTIONS))


# --- the command line -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("launch", help="launch one kernel of a bundle R times (the process ncu profiles)")
    p.add_argument("bundle")
    p.add_argument("id")
    p.add_argument("--n", type=int, default=None, help="output columns; default the layer's N")
    p.add_argument("--repeats", type=int, default=ProfileOptions.repeats)
    p.set_defaults(fn=lambda a: sys.exit(launch(Path(a.bundle), a.id, a.n, a.repeats)))
    p = sub.add_parser("profile", help="ncu over the chosen kernels: OUT/counters.parquet and a table")
    p.add_argument("bundle")
    p.add_argument("out")
    p.add_argument("--ids", nargs="*", default=None, help="kernel ids; default every row (after --set, --limit)")
    p.add_argument("--set", default=None, help="only rows of this set (benchmarks.sets': ab, micro, headline, ...)")
    p.add_argument("--limit", type=int, default=None, help="at most this many kernels")
    p.add_argument("--n", type=int, default=None, help="output columns for every kernel; default each layer's N")
    p.add_argument("--repeats", type=int, default=ProfileOptions.repeats,
                   help="launches per process; ncu profiles the second")
    p.add_argument("--collect", choices=("metrics", "sections"), default=ProfileOptions.collect,
                   help="metrics: the named metrics (--page details); sections: " + ", ".join(DEFAULT_SECTIONS)
                   + " plus the i-cache metrics (--page raw)")
    p.add_argument("--cache-control", choices=("all", "none"), default=ProfileOptions.cache_control,
                   help="all: caches flushed before each replay pass (cold, as our timer)")
    p.add_argument("--timeout-s", type=float, default=ProfileOptions.timeout_s, help="per kernel")
    p.add_argument("--ncu", default=None, help="the ncu executable; default ncu on PATH")
    p.set_defaults(fn=profile)
    p = sub.add_parser("report", help="the table again from OUT/counters.parquet")
    p.add_argument("out")
    p.add_argument("--bundle", default=None, help="the bundle, for the static SASS counts")
    p.set_defaults(fn=report)
    p = sub.add_parser("list-metrics", help="which of our metric names this ncu lists for the chip")
    p.add_argument("--chip", default="gh100", help="ncu's chip name (gh100: H100 and H200); '' for the GPU here")
    p.add_argument("--ncu", default=None)
    p.set_defaults(fn=list_metrics)
    args = ap.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()
