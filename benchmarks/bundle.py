"""The one bundle format: everything that goes to a GPU, built here (no GPU), carried, and read there.

    <bundle>/
      bundle.json        its name, the set and options it was built from, the hash of its inputs
                         (`inputs`: the set's options and the code that renders and compiles it), the
                         arch, when, and how many kernels and launches
      launches.parquet   one row per launch: the kernel (its package), what it is (sets.Planned's
                         columns), the count it is launched at, N1 at launch, a proxy's cluster map
                         and shared memory, the compile facts and the estimate's work and figure
      kernels/<id>/      one kernel package each (lospmm.kernel.package: kernel.json, kernel.cubin and
                         their manifest; no source, no A: they do not travel)
      a/<matrix>.parquet the A of each layer, once (what the device check runs against)

Built resumably (a package whose manifest holds and whose row.json is there is not built again),
through the compile cache, on `threads` compile threads. Carried as xz archives of at most ~28 MiB
(cubins of straight-line code shrink 5-13×), each a bundle of its own, listed with their SHA-256
in `<name>.parts.json` so that the device program checks what it unpacks (benchmarks.pack).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
import os
import time
from pathlib import Path

import numpy as np

from benchmarks.analysis import rows_table
from lospmm.files import atomic_write, manifest_problem

ROOT = Path(__file__).resolve().parents[1]
# Where prepared bundles live: outside the work tree, so that a later checkout on this machine finds them
# benchmarks.sets' NM-SpMM shapes: a bundle keeps no A for them (too large to carry); it is made again
NM_SPMM_MODEL = "nm-spmm"
HOME = Path(os.environ.get("LOSPMM_BUNDLES") or Path.home() / ".cache" / "lospmm" / "bundles")


def inputs_hash(set_name: str, options: dict) -> str:
    """What a bundle of `set_name` with `options` depends on: the options, and the code that plans,
    renders and compiles it (benchmarks.sets and benchmarks.bundle with every lospmm module they
    import, the includes a kernel's text carries) and the shipped rankers that choose its tiles (their
    versions: a model retrained leaves the code alone). A bundle whose recorded hash differs is stale."""
    from lospmm.flows.storage.ranker_store import SHIPPED, SHIPPED_DESIGNS, SHIPPED_HALF, ranker_metadata
    from lospmm.flows.storage.store import module_closure_hash

    code = [module_closure_hash(m, prefix="lospmm") for m in ("benchmarks.sets", "benchmarks.bundle")]
    rankers = {p.name: ranker_metadata(p).get("version") for p in (SHIPPED, SHIPPED_HALF, SHIPPED_DESIGNS)}
    blob = json.dumps({"set": set_name, "options": options, "code": code, "rankers": rankers}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def bundle_facts(bundle: Path) -> dict:
    """bundle.json, or {} when there is none."""
    try:
        return json.loads((Path(bundle) / "bundle.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def bundle_rows(bundle: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(Path(bundle) / "launches.parquet").to_pylist()


def package_of(bundle: Path, row: dict):
    """The row's kernel package (lospmm.kernel.package), checked against its manifest."""
    from lospmm.kernel.package import read_package

    return read_package(Path(bundle) / "kernels" / row["package"], ("kernel.json", "kernel.cubin"))


def matrix_of_row(bundle: Path, row: dict):
    """The A a launch row's kernel computes with: the bundle's copy, or an NM-SpMM shape's A made again
    from its seed (too large to carry)."""
    from lospmm.sparse_file import read_matrix

    if row.get("model") == NM_SPMM_MODEL:
        from benchmarks.sets import nm_spmm_matrix

        return nm_spmm_matrix(int(row["m"]), int(row["k"]), row["prune"])
    return read_matrix(Path(bundle) / "a" / f"{row['matrix']}.parquet")


def build(name: str, jobs, into: Path = HOME, threads: int = 2, arch: str = "sm_90", cache: Path | None = None,
          set_name: str = "", options: dict | None = None, sass: bool = True, with_source: bool = False,
          say=print, stop_at: float | None = None) -> Path:
    """Compile every job (benchmarks.sets.Job) into the bundle `into/name` and return its folder. A
    kernel that fails to compile is a row with its status; one already built (a previous, cut-off
    build) is kept. launches.parquet and bundle.json are written last: a bundle without bundle.json is
    not finished. `with_source`: the packages keep kernel.cu (what the host backend runs: a bundle
    checked without a GPU). `stop_at` (a time.monotonic() value): no kernel is started after it; the
    kernels built by then are the launch rows of an unfinished bundle (no bundle.json) that can be
    measured, and the next build goes on from them (on the GPU machine a step builds for part of its
    budget and measures what it built, rather than building past the command's limit). `sass`: each
    compiled kernel's SASS facts (sass_facts) in its rows; NvdisasmMissing before anything is built where
    nvdisasm is not there to read them (a bundle without them lacks the A/B table's instruction columns)."""
    import pyarrow.parquet as pq

    from lospmm.devices import device_named
    from lospmm.flows.execution.units import threads as unit_threads
    from lospmm.flows.storage.compile_cache import cached_kernel
    from lospmm.kernel.estimate import estimate_timer
    from lospmm.kernel.package import cleared, write_cubin, write_record
    from lospmm.sparse_file import write_matrix
    from lospmm.stages.compile import kernel_options

    if sass:
        from lospmm.kernel.sass import NvdisasmMissing, nvdisasm

        try:
            nvdisasm()
        except NvdisasmMissing as e:
            raise NvdisasmMissing(f"{name}: {e}; a bundle's rows carry each kernel's SASS facts (instructions "
                                  f"per multiply-add, code bytes)") from None
    dest = Path(into) / name
    # the code this build runs, hashed before it starts: sources edited while it builds (hours, for a
    # large set) must not lend their hash to kernels rendered by the code loaded before; and a build
    # cut off under other code (its packages rendered by that code) starts over
    inputs = inputs_hash(set_name or name, options or {}) if set_name else ""
    building = dest / "building.json"
    if dest.is_dir() and building.is_file() and json.loads(building.read_text()).get("inputs") != inputs:
        say(f"{name}: a build cut off under other code: starting over")
        shutil.rmtree(dest)
    (dest / "kernels").mkdir(parents=True, exist_ok=True)
    (dest / "a").mkdir(exist_ok=True)
    for stale in ("launches.parquet", "bundle.json"):
        (dest / stale).unlink(missing_ok=True)
    building.write_text(json.dumps({"inputs": inputs}))
    cache = Path(cache or HOME / "compile-cache")
    units = unit_threads(threads)
    timer = estimate_timer(device_named({"sm_90": "h100", "sm_80": "a100", "sm_70": "v100", "sm_75": "2080ti"}.get(
        arch, "h100")))
    jobs = list(jobs)
    ids = [j.planned.id for j in jobs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{name}: launch ids collide")
    t_start = time.perf_counter()
    said = threading.Lock()  # one line at a time from the build's threads (a step's log is one file)

    def built(i: int, job) -> list[dict]:
        """One kernel's launch rows: built (a failure is its row), or as a cut-off build left them."""
        p, t0 = job.planned, time.perf_counter()
        pkg = dest / "kernels" / p.id
        done = _built_rows(pkg)
        if done is not None:
            return done
        if stop_at is not None and time.monotonic() >= stop_at:
            return None  # not started: the build's time is up
        row = p.row() | {"package": p.id, "count": p.n if p.role == "proxy" else None}
        try:
            source = job.source()
            if job.matrix is not None and p.model != NM_SPMM_MODEL and not (dest / "a" / f"{p.matrix}.parquet").exists():
                a = job.matrix()
                atomic_write(dest / "a" / f"{p.matrix}.parquet", lambda tmp: write_matrix(tmp, a))
            result, hit = cached_kernel(cache, source, kernel_options(arch, p.m1, p.ptxas_level, source.design,
                                                                      p.extra_registers, source.spec.form == "conv"),
                                        units)
            row |= {"kernel": source.name, "form": source.spec.form, "dtype": source.spec.dtype,
                    "count": source.spec.count(p.n), "launch": json.dumps(source.layout.facts()),
                    "status": str(result["status"]), "message": "" if result["status"] == "ok" else result["log"][-500:],
                    "registers": int(result["registers"]), "spill_bytes": int(result["thread_spill_bytes"]),
                    "compile_seconds": float(result["cost_seconds"]), "tiles": source.num_tiles,
                    "nnz": source.spec.nnz if p.role == "full" else 0}
            cleared(pkg)
            if with_source:
                atomic_write(pkg / "kernel.cu", lambda tmp: Path(tmp).write_text(source.source, encoding="utf-8"))
            if result["status"] == "ok":
                cubin = write_cubin(pkg, cache / result["paths"]["cubin"])
                if sass:
                    row |= sass_facts(cubin, source)
            write_record(pkg, source.spec.located(p.layer, p.sparsity, arch), {"compile": {
                k: result[k] for k in ("status", "registers", "thread_spill_bytes", "cost_seconds", "key")}})
        except Exception as e:  # one kernel's failure is its row
            pkg.mkdir(parents=True, exist_ok=True)
            row |= {"status": "error", "message": f"{type(e).__name__}: {e}"[:500]}
        launched = _launch_rows(row, job, timer)
        atomic_write(pkg / "row.json", lambda tmp: Path(tmp).write_text(json.dumps(launched), encoding="utf-8"))
        with said:
            say(f"[{i + 1}/{len(jobs)}] {p.id}: {row['status']}, {row.get('registers', '?')} registers, "
                f"{row.get('instructions', '?')} instructions, {time.perf_counter() - t0:.1f} s")
        return launched

    # kernels side by side (each its own NVRTC and ptxas; the compile cache is safe across threads), and
    # each kernel's units on the same number of threads: a bundle of many small kernels and one of a few
    # large ones both use the cores (one at a time, the GPU machine's 16 cores built 17-62 s a kernel)
    pool = ThreadPoolExecutor(max(1, threads))
    try:
        launched_rows = list(pool.map(built, range(len(jobs)), jobs))
    except BaseException:  # a full disk, Ctrl-C: the kernels not started are not compiled for nothing
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    rows = [r for launched in launched_rows if launched is not None for r in launched]
    atomic_write(dest / "launches.parquet", lambda tmp: pq.write_table(rows_table(rows), tmp))
    not_started = sum(launched is None for launched in launched_rows)
    if not_started:
        say(f"{name}: the build's time is up: {len(jobs) - not_started} of {len(jobs)} kernels built; the next "
            f"build goes on from them")
        return dest
    facts = {"name": name, "set": set_name or name, "options": options or {},
             "inputs": inputs, "arch": arch,
             "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "build_seconds": round(time.perf_counter() - t_start, 1),
             "kernels": len(jobs), "launches": len(rows), "compiled": sum(r["status"] == "ok" for r in rows),
             "sass": sass_coverage(rows)}
    atomic_write(dest / "bundle.json", lambda tmp: Path(tmp).write_text(json.dumps(facts, indent=1), encoding="utf-8"))
    return dest


def _built_rows(pkg: Path) -> list[dict] | None:
    """The launch rows of a package built before (its row.json, and, for a compiled one, a whole
    package), else None."""
    try:
        rows = json.loads((pkg / "row.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if rows and rows[0].get("status") == "ok" and manifest_problem(pkg, required=("kernel.json", "kernel.cubin")):
        return None
    return rows


def _launch_rows(row: dict, job, timer) -> list[dict]:
    """The launch rows of one built kernel: at its N1, and at each N1 of `also_at` (a kernel reading
    N1 at launch), each with the estimate's figure from its compiled registers and spills."""
    from benchmarks.analysis import launch_work
    from lospmm.kernel.estimate import estimated_timing

    try:
        launch = dict(job.launch) if row["status"] == "ok" else {}
    except Exception:  # its work needs the kernel's A reordered; a kernel that failed to render has none
        launch = {}
    smem_at = launch.pop("smem_at", {})
    out = []
    for n1, rank in ((job.planned.n1, job.planned.rank), *job.planned.also_at):
        r = row | launch | {"id": row["id"] if n1 == job.planned.n1 else f"{row['id']}-n{n1}", "n1": n1, "rank": rank,
                            "smem_bytes": int(smem_at.get(n1, 0)), "prefetch": job.planned.prefetch}
        ok = r["status"] == "ok" and "tile_loads" in r
        if ok:
            r["estimate_us"] = estimated_timing(launch_work(r), timer.device, timer.params).time_us
        elif not (r["status"] == "ok" and "estimate_us" in r):  # an N:M kernel's job gives its own estimate
            r["estimate_us"] = float("inf")
        r["estimate_timer"] = timer.name
        out.append(r)
    return out


def sass_coverage(rows: list[dict]) -> str:
    """Which of a bundle's compiled rows carry their SASS facts: "all", "none", or "partial" (a build cut
    off under one `sass` setting and resumed under the other, or a kernel nvdisasm could not read)."""
    carried = [r.get("instructions") is not None for r in rows if r.get("status") == "ok"]
    return "all" if carried and all(carried) else "partial" if any(carried) else "none"


def sass_facts(cubin: bytes, source) -> dict:
    """The SASS statistics of a kernel (nvdisasm): instructions in all, per useful multiply-add
    (nnz × columns per thread), FFMA and LDG counts, and code bytes per tile function (16 bytes an
    instruction): the mean and the largest. {} when nvdisasm is missing."""
    from lospmm.kernel.sass import BYTES_PER_INSTRUCTION, NvdisasmMissing, function_sizes, sass_counts

    try:
        counts = sass_counts(cubin, source.name)
        sizes = [size for name, size in function_sizes(cubin).items() if name.startswith(("tile_", "proxy_"))]
    except (NvdisasmMissing, OSError):
        return {}
    useful = max(source.spec.nnz, 1) * source.layout.columns_per_thread
    size = BYTES_PER_INSTRUCTION
    return {"instructions": counts["total"], "instructions_per_fma": counts["total"] / useful,
            "ffma": counts["FFMA"], "hfma2": counts["HFMA2"], "ldg": counts["LDG"],
            "spill_instructions": counts["LDL"] + counts["STL"], "code_bytes": size * counts["total"],
            # a streamed kernel has no tile functions: its one loop is all its code
            "tile_code_bytes_mean": size * float(np.mean(sizes)) if sizes else float(size * counts["total"]),
            "tile_code_bytes_max": size * int(max(sizes)) if sizes else size * counts["total"]}


# --- carrying ---------------------------------------------------------------------------------------------
