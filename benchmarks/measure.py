"""The one way a bundle's kernels are checked and timed on a device, and the libraries beside them.

Every kernel is checked by lospmm.kernel.check (its number format's metric and tolerance) at N in
CHECK_COUNTS and the layer's own N (a conv kernel: its batches), on the backend given; then timed
at the layer's N. Times come from one method, `graph_timed` (lospmm.kernel.cuda): launches captured
in a CUDA graph between event-record nodes, each after an L2 flush, so the host is out of the
figure, for ours and the libraries alike; a measurement whose repeats spread more than its bound is
measured again and flagged if it still does (lospmm.kernel.timing.settled). A library that cannot be
captured in a graph is timed by events around a busy-waited launch instead, and its row says so.

A run is resumable: each measured launch is appended to `<out>/<name>.progress.jsonl` as it
finishes, and a run started again skips what it holds (a cut-off command loses at most the launch
it was on). The tables are written from it: kernel-speed-<name>.parquet (a row per launch),
checks-<name>.parquet (a row per check), and half-precision-<name>.parquet for half kernels.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.bundle import bundle_rows, matrix_of_row, package_of
from lospmm.kernel.arrays import torch_dtype

# What tells a set's kernels apart besides the design (a reorder kernel's row order, an N:M kernel's
# pruning, a conv case's epilogue): the reports group by them.
PLAN_COLUMNS = ("order", "prune", "epilogue", "nm")
CHECK_COUNTS = (1, 31, 32, 4096)  # N every GEMM kernel is checked at besides its layer's (lospmm.kernel.check.check_counts)
ROW_COLUMNS = ("id", "kernel", "set", "role", "variant", "model", "layer", "m", "k", "n", "nnz", "sparsity", "batch", "design",
               "dtype", "form", "m1", "n1", "rank", "count", "prefetch", "smem_bytes", "registers", "spill_bytes",
               "instructions", "instructions_per_fma", "tile_code_bytes_mean", "chosen_by", "estimate_us",
               "estimate_timer", "tile_loads", "tile_fmas", "zero_blocks", "staged_chunks", "staged_counts",
               "chunk_loads", "chunk_fmas",
               *PLAN_COLUMNS)


@dataclass(frozen=True)
class Deadline:
    """A step's end: `left()` seconds remain; `over()` once it has passed."""

    end: float

    @classmethod
    def after(cls, seconds: float) -> "Deadline":
        return cls(time.monotonic() + seconds)

    def left(self) -> float:
        return self.end - time.monotonic()

    def over(self) -> bool:
        return self.left() <= 0


@dataclass(frozen=True)
class RunOptions:
    """Defaults: backend="cuda" ("host": the host emulation checks, nothing is timed — how the run is
    tested without a GPU); launches=20 per graph and repeats=3 graphs; max_spread=0.05 for ours and
    library_spread=0.10 for the libraries (issue 24's bounds); baselines: cuBLAS SGEMM (TF32 off), TF32
    and FP16 on every GEMM shape (BF16 beside a bf16 kernel, cuDNN beside a conv kernel), plus
    cuSPARSE ("cusparse": torch's CSR SpMM) where asked; check_counts: the N every kernel is checked
    at besides its layer's."""

    backend: str = "cuda"
    launches: int = 20
    repeats: int = 3
    max_spread: float = 0.05
    library_spread: float = 0.10
    baselines: tuple[str, ...] = ("sgemm", "tf32", "fp16")
    check_counts: tuple[int, ...] = CHECK_COUNTS


def progress(out: Path, name: str) -> list[dict]:
    """What a run of `name` has measured so far (its progress file), in order."""
    path = Path(out) / f"{name}.progress.jsonl"
    if not path.exists():
        return []
    done = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            done.append(json.loads(line))
        except ValueError:  # a line cut off mid-write by a killed command: measured again
            continue
    return done


def measured_key(row: dict) -> tuple:
    """What makes a launch measured: its id and its kernel's name (which hashes the kernel's text),
    so a step run again on a bundle of changed kernels measures them again under the same ids."""
    return row["id"], row.get("kernel")


def latest(done: list[dict]) -> list[dict]:
    """Each launch's last measurement, in the order of their first (a kernel changed and measured
    again replaces its earlier row in the tables; the progress file keeps both)."""
    last = {}
    for d in done:  # a dict keeps a key where it was first set, whatever it is set to later
        last[d["row"]["id"]] = d
    return list(last.values())


class ContextLost(RuntimeError):
    """A kernel faulted and took this process's CUDA context with it: its row is recorded as its
    failure, and the launches after it need a fresh process (benchmarks.device starts one)."""

    def __init__(self, error: str, at: str):
        super().__init__(f"the CUDA context was lost ({error}); {at} and the launches after it need a fresh process")
        self.error, self.at = error, at


def lost_context(options: "RunOptions", probe: bool = False) -> str:
    """The sticky CUDA error that lost this process's context ("" while whole; always "" on the host)."""
    if options.backend != "cuda":
        return ""
    from lospmm.kernel.cuda import context_lost

    return context_lost(probe)


def run_bundle(bundle: Path, out: Path, name: str, deadline: Deadline | None = None,
               options: RunOptions = RunOptions(), say=print) -> dict[str, Path]:
    """Check and time every launch of `bundle` not yet in the progress of `name` under `out`, until
    the deadline; then write the tables from all of it. Returns the tables written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    done = progress(out, name)
    # a launch whose kernel did not compile then, and does in this bundle, is measured now
    finished = {measured_key(d["row"]): d["row"].get("status") for d in done}
    baselines = {_shape_key(d["row"]): {k: v for k, v in d["row"].items() if _is_baseline(k)} for d in done
                 if d["row"].get("set") != "micro"}
    rows = bundle_rows(bundle)
    todo = [r for r in rows if measured_key(r) not in finished
            or (finished[measured_key(r)] == "not compiled" and r.get("status") == "ok")]
    say(f"{name}: {len(rows)} launches, {len(rows) - len(todo)} measured before, {len(todo)} to go")
    path = out / f"{name}.progress.jsonl"
    if path.exists() and path.stat().st_size:
        with open(path, "rb+") as f:
            f.seek(-1, 2)
            if f.read(1) != b"\n":  # a line cut off by a killed command: the next one starts on its own line
                f.write(b"\n")
    with open(path, "a", encoding="utf-8") as log:
        for i, row in enumerate(todo):
            if deadline is not None and deadline.over():
                say(f"{name}: stopped at the time budget with {len(todo) - i} launches left (run again to go on)")
                break
            t0 = time.perf_counter()
            lost_before = lost_context(options)
            if lost_before:  # nothing launched here would say anything: the rest needs a fresh process
                raise ContextLost(lost_before, row["id"])
            result, checks = measured_launch(bundle, row, options, baselines)
            result["seconds"] = time.perf_counter() - t0
            lost = result["status"] == "error" and lost_context(options, probe=True)
            if lost:  # this kernel's fault (a launch syncs before it returns): its row, and no more here
                result["message"] = f"{result['message']} (the CUDA context was lost: {lost})"[:500]
            log.write(json.dumps({"row": result, "checks": checks}, default=_jsonable) + "\n")
            log.flush()
            say(f"[{i + 1}/{len(todo)}] {row['id']}: {result['status']}"
                + (f", {result['ours_us']:.2f} us (spread {result['spread']:.1%})" if _finite(result.get("ours_us")) else "")
                + (f", sgemm {result['sgemm_us']:.2f} us" if _finite(result.get("sgemm_us")) else ""))
    return write_tables(out, name)


def write_tables(out: Path, name: str) -> dict[str, Path]:
    """The tables of a run from its progress file (kernel-speed, checks, half-precision)."""
    import pyarrow.parquet as pq

    from benchmarks.analysis import half_rows, rows_table

    done = latest(progress(out, name))
    tables = {"kernel-speed": [d["row"] for d in done], "checks": [c for d in done for c in d["checks"]]}
    tables["half-precision"] = half_rows(tables["kernel-speed"])
    written = {}
    for kind, rows in tables.items():
        if rows:
            path = Path(out) / f"{kind}-{name}.parquet"
            pq.write_table(rows_table(rows), path)
            written[kind] = path
    return written


CHECK_WORK = 2e10  # multiply-adds of one check's reference product at most (about 20 s of scipy)


def measured_launch(bundle: Path, row: dict, options: RunOptions, baselines: dict) -> tuple[dict, list[dict]]:
    """One launch row: its kernel checked (a full kernel) and timed, and the libraries on its shape
    (measured once per shape, kept in `baselines`). A failure is the row's status, never raised."""
    from lospmm.kernel.check import check_counts, checked

    result = {k: row.get(k) for k in ROW_COLUMNS}
    number = _number(row["design"])
    if number.is_half:  # on every half row, a failed one too: the half table must show its failures
        result |= {"dtype": number.dtype, "accumulate": number.label}
    if row["status"] != "ok":
        return result | {"status": "not compiled", "ours_us": math.inf, "message": row.get("message", "")}, []
    checks = []
    try:
        package = package_of(bundle, row)
        a = matrix_of_row(bundle, row) if row["role"] == "full" else None
        kernel = package.on(options.backend, matrix=a)  # an N:M kernel's compressed A is filled from it
        extra = {"cluster_of": np.asarray(row["cluster_of"], np.int32)} if row.get("cluster_of") else None
        threads = row["n1"] if package.spec.n1_at_launch else None
        if row["role"] == "full":
            counts = check_counts(package.spec, row["count"], options.check_counts)
            # the reference is scipy's product in float64 on one core: past CHECK_WORK multiply-adds (an
            # NM-SpMM shape at 4096 tokens) the check runs at the smaller N only, and says so
            counts = [c for c in counts if c * a.nnz <= CHECK_WORK] or counts[:1]
            results = [checked(_at(kernel, threads), a, count, seed=count) for count in counts]
            checks = [{"id": row["id"], **c.facts()} for c in results]
            result["max_rel_error"] = max(results, key=lambda c: c.count).error  # at its own N, or the largest checked
            failed = [c for c in results if not c.ok]
            if failed:
                return result | {"status": "failed check", "ours_us": math.inf, "message": failed[0].message}, checks
            if number.is_half and options.backend == "cuda":
                result["cublas_max_rel_error"] = cublas_half_error(a, row["n"], number.dtype, row["n"])
        if options.backend != "cuda":
            return result | {"status": "checked", "ours_us": math.nan, "message": "the host backend times nothing"}, checks
        timed = time_ours(kernel, row["count"], options, threads, extra, int(row.get("smem_bytes") or 0))
        result |= {"status": "ok", "ours_us": timed.us, "spread": timed.spread, "spread_flag": timed.flagged}
    except Exception as e:  # a failed load or launch is this row's, not the end of the run
        return result | {"status": "error", "ours_us": math.inf, "message": f"{type(e).__name__}: {e}"[:300]}, checks
    if row["role"] == "full" and row.get("set") != "micro":
        key = _shape_key(row)
        if key not in baselines:
            baselines[key] = library_times(row, package.spec, options)
        result |= baselines[key]
    return result, checks


class _at:
    """A kernel run at a block size given at launch (a kernel reading N1 at launch), for the check."""

    def __init__(self, kernel, threads):
        self.kernel, self.spec, self.threads = kernel, kernel.spec, threads

    def run(self, x):
        return self.kernel.run(x, self.threads)


def _number(label: str):
    from lospmm.kernel.design import design_named

    return design_named(label).number


def _shape_key(row: dict) -> tuple:
    return row["model"], row["m"], row["k"], row["n"], row.get("form", "gemm"), str(row.get("dtype") or "fp32")


def _is_baseline(key: str) -> bool:
    return key.endswith(("_us", "_spread", "_spread_flag", "_method", "_message")) and not key.startswith(
        ("ours", "estimate"))


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON")


# --- timing on the device: ours and the libraries, one method ----------------------------------------------


def time_ours(kernel, count: int, options: RunOptions, threads: int | None = None, extra=None, smem_bytes: int = 0):
    """Our kernel (a lospmm.kernel.cuda.CudaKernel) over `count` (N or a batch) on random inputs in its
    dtype, by graph_timed, settled within options.max_spread."""
    import torch

    from lospmm.kernel.cuda import graph_timed
    from lospmm.kernel.timing import settled

    spec = kernel.spec
    launched = spec.launch_count(count)
    element = torch_dtype(spec.dtype)
    x = torch.randn(spec.input_shape(launched), device="cuda", dtype=element)
    y = torch.empty(spec.output_shape(launched), device="cuda", dtype=element)
    arrays = [torch.as_tensor(a, device="cuda") for a in (extra or {}).values()]
    args = [("ptr", a.data_ptr()) for a in arrays]

    def launch():
        kernel.launch(x.data_ptr(), y.data_ptr(), launched, torch.cuda.current_stream().cuda_stream, threads, args,
                      smem_bytes)

    return settled(lambda: graph_timed(launch, options.launches, options.repeats)[:2], options.max_spread)


def library_times(row: dict, spec, options: RunOptions) -> dict:
    """The libraries on the row's shape, each `<name>_us`, `<name>_spread`, `<name>_spread_flag` (and
    `<name>_method` when not graph-timed, `<name>_message` when it failed): cuBLAS SGEMM with TF32 off,
    TF32 and FP16 (options.baselines), BF16 beside a bf16 kernel, cuDNN's dense convolution in the
    kernel's dtype beside a conv kernel, cuSPARSE through torch's CSR SpMM and cuSPARSELt 2:4 (fp16, and fp32 as TF32)
    through torch's semi-structured tensors where asked."""
    names = list(options.baselines) + (["bf16"] if spec.dtype == "bf16" else []) + (["cudnn"] if spec.conv else [])
    out = {}
    for name in dict.fromkeys(names):
        try:
            t, method = time_library(name, row, spec, options)
            out |= {f"{name}_us": t.us, f"{name}_spread": t.spread, f"{name}_spread_flag": t.flagged}
            if method != "graph":
                out[f"{name}_method"] = method
        except Exception as e:  # one failing library is a NaN and its message, not a lost row
            out |= {f"{name}_us": math.nan, f"{name}_spread": math.nan, f"{name}_message": f"{type(e).__name__}: {e}"[:300]}
    return out


def time_library(name: str, row: dict, spec, options: RunOptions):
    """(SettledTime, "graph" | "events") of one library on the row's shape."""
    import torch

    from lospmm.kernel.cuda import CudaTimerOptions, graph_timed, torch_timed
    from lospmm.kernel.timing import settled

    m, k, n = row["m"], row["k"], row["n"]
    torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
    torch.backends.cudnn.allow_tf32 = False
    try:
        if name in ("sgemm", "tf32", "fp16", "bf16"):
            dtype = {"sgemm": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]
            a, b = torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype)
            c = torch.empty(m, n, device="cuda", dtype=dtype)
            fn = lambda: torch.matmul(a, b, out=c)  # noqa: E731
        elif name == "cudnn":  # in the kernel's dtype (TF32 off in fp32)
            g = spec.conv
            element = torch_dtype(spec.dtype)
            w = torch.randn(spec.m, g.cin, g.kh, g.kw, device="cuda", dtype=element)
            x = torch.randn(row["count"], g.cin, g.h, g.w, device="cuda", dtype=element)
            fn = lambda: torch.nn.functional.conv2d(x, w, None, g.stride, g.pad, g.dilation)  # noqa: E731
        elif name == "cusparse":  # torch's CSR × dense goes through cusparseSpMM
            dense = torch.randn(m, k, device="cuda")
            dense[torch.rand(m, k, device="cuda") < row["sparsity"]] = 0
            csr, b = dense.to_sparse_csr(), torch.randn(k, n, device="cuda")
            fn = lambda: csr @ b  # noqa: E731
        elif name in ("cusparselt_fp16", "cusparselt_tf32"):  # 2:4 on sparse tensor cores, through torch
            from torch.sparse import SparseSemiStructuredTensor, to_sparse_semi_structured

            SparseSemiStructuredTensor._FORCE_CUTLASS = False  # cuSPARSELt, not CUTLASS
            dtype = torch.float16 if name == "cusparselt_fp16" else torch.float32
            dense = torch.randn(m, k, device="cuda", dtype=dtype)
            dense.view(m, k // 4, 4)[:, :, 2:] = 0  # 2:4 along K (K a multiple of 4, else the view fails: NaN)
            sparse, b = to_sparse_semi_structured(dense), torch.randn(k, n, device="cuda", dtype=dtype)
            fn = lambda: torch.mm(sparse, b)  # noqa: E731
        else:
            raise ValueError(f"no library {name!r}")
        try:
            return settled(lambda: graph_timed(fn, options.launches, options.repeats)[:2], options.library_spread), "graph"
        except RuntimeError:  # not capturable in a graph: events around a busy-waited launch
            events = CudaTimerOptions(repeats=options.launches)
            return settled(lambda: (torch_timed(fn, events), float("nan")), options.library_spread, attempts=1), "events"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def cublas_half_error(a, n: int, dtype: str, seed: int) -> float:
    """cuBLAS's normalised error in `dtype` (the tensor-core GEMM through torch) on the data a half
    kernel's check at this N uses (the same rounded A, the same B: the check's seed), against the
    float64 product: the accuracy bar's other side (issue 23: ours within 2× of it)."""
    import torch

    from lospmm.kernel.check import error_bound, normalised_error, random_b_bits
    from lospmm.kernel.numbers import NumberFormat, from_dtype_bits

    kind = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    b = from_dtype_bits(random_b_bits(a.shape[1], n, dtype, seed), dtype)
    with torch.no_grad():
        c = torch.matmul(torch.tensor(a.toarray(), device="cuda").to(kind), torch.tensor(b, device="cuda").to(kind))
    c64 = c.double().cpu().numpy()
    if not np.isfinite(c64).all():
        return math.inf
    return normalised_error(c64, a, b, error_bound(a, NumberFormat.half(dtype))[1])
