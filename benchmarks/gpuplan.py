"""The plan for a lent GPU (issue 14), split so that device time is spent measuring.

- Preparation, on any machine (`benchmarks/gpu_plan.py prepare`): bundles under `.gpu/`
  (git-ignored), xz-compressed to travel: the emitted kernels of a run (kernel.json, cubin, the
  pruned A as CSR), and *launch lists*: a sample of layers' proxies and top-K full kernels, plus
  A/B variants, compiled here for the target arch. Every launch carries the `estimate` timer's
  figure and the work that figure is computed from, so the model can be refitted to measurements.
- On the GPU (`benchmarks/gpu_plan.py run OUT`): the steps below, each writing Parquet and a table
  to OUT and stopping at its share of a time budget (a stopped step says how far it got).
- Analysis, anywhere (pure functions here): speedups and geometric means, Table 4, Spearman's
  correlations, the A/B comparisons.

Nothing here runs at import; only the `run_*` functions need a device.
"""

from __future__ import annotations

import json
import lzma
import shutil
import tarfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from lospmm.stages.codegen import LaunchLayout
from lospmm.sparse_file import read_matrix, write_matrix  # noqa: F401  (gpuplan.read_matrix: the bundles' A)

BUNDLE_DIR = ".gpu"
CHECK_NS = (1, 31, 32, 4096)


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


# --- bundles: written here, unpacked on the device ---------------------------------------------


def packed(directory: Path, archive: Path) -> Path:
    """`directory` as an xz tarball (cubins of straight-line code shrink ~13×), written atomically."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_suffix(archive.suffix + ".tmp")
    with lzma.open(tmp, "wb", preset=6) as raw, tarfile.open(fileobj=raw, mode="w") as tar:
        tar.add(directory, arcname=directory.name)
    tmp.replace(archive)
    return archive


def unpacked(bundle_dir: Path, into: Path) -> list[Path]:
    """Every `*.tar.xz` of `bundle_dir` extracted under `into`; the top-level folders made."""
    into.mkdir(parents=True, exist_ok=True)
    out = []
    for archive in sorted(Path(bundle_dir).glob("*.tar.xz")):
        with tarfile.open(archive, "r:xz") as tar:
            tar.extractall(into, filter="data")
            out.extend(sorted({into / Path(n).parts[0] for n in tar.getnames()}))
    return out


def emitted_run(artifacts: Path, model: str, sparsity: float, run_id: str | None = None):
    """(run record, {stage: artifact path}) of the latest completed run (or `run_id`) that emitted
    (model, sparsity), or None."""
    from lospmm.flows.storage.runs import artifacts_of, run_records

    records = [r for r in run_records(artifacts) if r.get("status") == "completed"
               and (run_id is None or r["run_id"].startswith(run_id))]
    for record in reversed(records):
        paths = {e["stage"]: e["path"] for e in artifacts_of(record, model=model, sparsity=sparsity)}
        if "emit" in paths and "prune" in paths:
            return record, paths
    return None


def emitted_bundle(artifacts: Path, model: str, sparsity: float, out: Path, run_id: str | None = None,
                   min_nnz: int = 0, max_kernels: int = 0) -> Path | None:
    """The emitted kernels of (model, sparsity) with at least `min_nnz` nonzeros, from the latest
    completed run that has them (or `run_id`), each checked against its manifest, copied with its
    pruned A, into `out/<name>/` (the first `max_kernels` of them when set). Returns the folder, or None when no run emitted them."""
    from lospmm.flows.storage.store import manifest_problem, write_manifest
    from lospmm.flows.execution.taskio import RunContext
    from lospmm.flows.catalog.pruned import matrices

    found = emitted_run(artifacts, model, sparsity, run_id)
    if found is None:
        return None
    record, paths = found
    name = f"{model}-s{sparsity:g}" + (f"-nnz{min_nnz}" if min_nnz else "")
    dest = out / name
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    ctx = RunContext(str(artifacts))  # reads each artifact only if it matches its checksum
    pruned = matrices(ctx, {"path": paths["prune"]})
    rows = []
    for i, r in enumerate(ctx.read({"path": paths["emit"]}).to_pylist()):
        if r["status"] not in ("ok", "fallback") or not r["kernel_dir"]:
            continue
        a = pruned[r["layer"]]
        if a.nnz < min_nnz or (max_kernels and len(rows) >= max_kernels):
            continue
        src = artifacts / r["kernel_dir"]
        problem = manifest_problem(src, required=("kernel.cubin", "kernel.json"))
        if problem:
            raise ValueError(f"{model} {r['layer']}: {problem}")
        d = dest / f"{i:03d}"
        d.mkdir()
        for f in ("kernel.json", "kernel.cubin"):
            shutil.copyfile(src / f, d / f)
        write_matrix(d / "a.parquet", a)
        write_manifest(d, ("kernel.cubin", "kernel.json"))  # the copy's own: the loader trusts nothing unlisted
        rows.append({k: r[k] for k in ("model", "layer", "op", "m", "n", "k", "sparsity", "status", "m1", "n1",
                                       "kernel", "timer", "full_time_us", "registers", "spill_bytes")}
                    | {"dir": d.name, "nnz": int(a.nnz), "run_id": record["run_id"]})
    (dest / "index.json").write_text(json.dumps(rows, indent=1))
    return dest


def emitted_work(facts: dict, a: sp.csr_matrix) -> dict:
    """The estimate's work of an emitted kernel, from its kernel.json (row order, tile pointers,
    empty rows, registers) and its A: per-tile distinct columns and nonzeros, as a launch row's
    fields (`launch_work` makes the KernelWork for any N)."""
    order, ptr = np.asarray(facts["row_order"]), np.asarray(facts["tile_ptr"])
    loads, fmas = [], []
    for t in range(len(ptr) - 1):
        rows = a[order[ptr[t]:ptr[t + 1]]]
        loads.append(len(np.unique(rows.indices)))
        fmas.append(rows.nnz)
    compile_facts = facts.get("compile", {})
    return {"m1": facts["m1"], "n1": facts["n1"], "registers": compile_facts.get("registers", 0),
            "spill_bytes": compile_facts.get("thread_spill_bytes", 0), "smem_bytes": 0, "prefetch": 1,
            "zero_blocks": -(-len(facts["empty_rows"]) // facts["m1"]) if facts["empty_rows"] else 0,
            "tile_loads": loads, "tile_fmas": fmas}


def conv_geometry_of(facts: dict):
    """The ConvGeometry of an implicit-im2col kernel from its kernel.json, or None for a GEMM kernel."""
    from lospmm.stages.codegen import ConvGeometry

    c = facts.get("conv")
    return ConvGeometry(**{k: c[k] for k in ("cin", "h", "w", "kh", "kw", "stride", "pad", "dilation")}) if c else None


def emitted_rows(folder: Path) -> list[dict]:
    """An unpacked emitted bundle's rows (each with `path`, its kernel folder)."""
    rows = json.loads((folder / "index.json").read_text())
    return [r | {"path": str(folder / r["dir"])} for r in rows]


# --- launch lists: a sample's proxies and full kernels, and A/B variants -------------------------


@dataclass(frozen=True)
class SampleParams:
    """Defaults: 3 layers per model at sparsity 0.9 with at most 60k nonzeros (their full kernels
    compile in seconds), the ranker's top-10, and A/B variants on the largest sampled layer of each
    model: ptxas -O3 against the flow's -O1, and prefetch depths 0, 2, 4, 8 against 1. every_kept
    (issue 24's Table 4): besides, every kept candidate's full kernel, from one cubin per kept M1
    that reads N1 at launch (CodegenParams.n1_at_launch), launched at each of its kept N1."""

    sparsity: float = 0.9
    per_model: int = 3
    max_nnz: int = 60_000
    top_k: int = 10
    gpu: str = "h100"
    arch: str = "sm_90"
    ptxas_levels: tuple[int, ...] = (3,)
    prefetch: tuple[int, ...] = (0, 2, 4, 8)
    models: tuple[str, ...] = ("bert-base", "resnet50", "mobilenetv2", "shufflenetv2")
    every_kept: bool = False  # Table 4's best over every kept candidate: one full kernel per kept M1, N1 at launch


def sampled_shapes(shapes, params: SampleParams) -> list:
    """Per model, `per_model` distinct GEMM shapes spread evenly over the sizes that fit max_nnz."""
    out = []
    for model in params.models:
        seen, fit = set(), []
        for s in shapes:
            key = (s.m, s.k, s.n)
            if s.model == model and s.ok and key not in seen and s.m * s.k * (1 - params.sparsity) <= params.max_nnz:
                seen.add(key)
                fit.append(s)
        fit.sort(key=lambda s: (s.m * s.k, s.n))
        if fit:
            picks = np.unique(np.linspace(0, len(fit) - 1, min(params.per_model, len(fit))).round().astype(int))
            out.extend(fit[i] for i in picks)
    return out


@dataclass(frozen=True)
class LaunchJob:
    """One kernel to compile here and launch there: its launch-list row (no arrays), source,
    options, and arrays (launch arguments of a proxy; every row's estimate work)."""

    id: str
    row: dict
    source: object  # codegen.KernelSource
    options: object  # compile.CompileOptions
    arrays: dict = field(default_factory=dict)
    also_at: tuple[tuple[int, int], ...] = ()  # a kernel reading N1 at launch: (N1, its rank) it is also launched at


def _job(tag: str, base: dict, role: str, variant: str, m1: int, n1: int, rank: int, source, options, search,
         smem_bytes: int = 0, prefetch: int = 1) -> LaunchJob:
    from lospmm.stages.timing import full_kernel_work, proxy_work

    if role == "proxy":
        cl = search.clusters[m1]
        work = proxy_work(cl, base["m"], base["k"], base["n"], n1, 0, smem_bytes)
        arrays = {"cluster_of": np.asarray(cl.cluster_of, np.int32)}
    else:
        work = full_kernel_work(search.tiles[m1], base["m"], base["k"], base["n"], n1, 0)
        arrays = {}
    arrays |= {"tile_loads": np.asarray(work.tile_loads, np.int64), "tile_fmas": np.asarray(work.tile_fmas, np.int64)}
    suffix = f"-{variant}" if variant else ""
    row = base | {"role": role, "variant": variant, "m1": m1, "n1": n1, "rank": rank, "smem_bytes": int(smem_bytes),
                  "grid_x": int(source.layout.row_blocks), "launch": json.dumps(source.layout.facts()),
                  "prefetch": prefetch, "zero_blocks": int(work.zero_blocks), "kernel": source.name}
    return LaunchJob(f"{tag}-{role[0]}{m1}x{n1}{suffix}", row, source, options, arrays)


def layer_jobs(shape, params: SampleParams, booster, device, variants: bool) -> list[LaunchJob]:
    """A sampled layer's proxies and top-K full kernels (variant ""), the best-ranked kept
    candidate of the other kind where the top-K holds only M1 = 1 or none ("outside-top-k"), and,
    with `variants`, the A/B variants of the top-ranked candidate's full kernel."""
    from lospmm.stages.codegen import CodegenParams, full_kernel_source
    from lospmm.stages.compile import kernel_options
    from lospmm.stages.prune import pruned_layer
    from lospmm.stages.rank import RankParams
    from lospmm.stages.search import SearchParams, layer_search, proxy_sources

    a = pruned_layer(shape, params.sparsity).matrix
    search = layer_search(a, shape.n, params.sparsity, device, booster,
                          SearchParams(rank=RankParams(top_k=params.top_k)))
    ranks = {(r.candidate.m1, r.candidate.n1): r.rank for r in search.ranked}
    base = {"model": shape.model, "layer": shape.layer, "m": shape.m, "k": shape.k, "n": shape.n,
            "sparsity": params.sparsity, "nnz": int(a.nnz)}
    tag = f"{shape.model}-{shape.layer}".replace("/", "_")
    jobs = []
    proxies = proxy_sources(search, shape.m, shape.k)
    for (m1, n1), launch in search.launches.items():
        jobs.append(_job(tag, base, "proxy", "", m1, n1, ranks[(m1, n1)], proxies[m1], kernel_options(params.arch, m1),
                         search, smem_bytes=launch.smem_bytes))

    def full(c, variant="", prefetch=1, level=1):
        src = full_kernel_source(a, search.tiles[c.m1], c.n1, CodegenParams(prefetch=prefetch))
        return _job(tag, base, "full", variant, c.m1, c.n1, ranks[(c.m1, c.n1)], src,
                    kernel_options(params.arch, c.m1, ptxas_level=level), search, prefetch=prefetch)

    jobs += [full(c) for c in search.chosen]
    # "does M1 = 1 really win where the estimate says so" needs both kinds measured on every layer
    kinds = {c.m1 == 1 for c in search.chosen}
    for want_one in (True, False):
        other = [r for r in search.ranked if (r.candidate.m1 == 1) == want_one]
        if want_one not in kinds and other:
            jobs.append(full(min(other, key=lambda r: r.rank).candidate, "outside-top-k"))
    if params.every_kept:  # one cubin per kept M1, launched at each of its kept N1 (variant every-kept)
        for m1 in sorted({c.m1 for c in search.kept}):
            n1s = sorted(c.n1 for c in search.kept if c.m1 == m1)
            src = full_kernel_source(a, search.tiles[m1], n1s[0], CodegenParams(n1_at_launch=True))
            job = _job(tag, base, "full", "every-kept", m1, n1s[0], ranks.get((m1, n1s[0]), -1), src,
                       kernel_options(params.arch, m1), search)
            jobs.append(replace(job, also_at=tuple((n1, ranks.get((m1, n1), -1)) for n1 in n1s[1:])))
    if variants and search.chosen:
        top = min((r for r in search.ranked if r.chosen), key=lambda r: r.rank).candidate
        jobs += [full(top, f"ptxas-O{level}", level=level) for level in params.ptxas_levels]
        jobs += [full(top, f"prefetch-{depth}", prefetch=depth) for depth in params.prefetch]
    return jobs


def compiled_job(job: LaunchJob):
    """(job id, compile.Compiled): run in a worker process."""
    from lospmm.stages.compile import compiled_kernel

    return job.id, compiled_kernel(job.source, job.options)


def sample_bundle(params: SampleParams, out: Path, workers: int = 2, say=print) -> Path:
    """The launch list of `sampled_shapes` compiled into `out/sample-<sparsity>/`: one cubin and one
    npz per launch, and launches.parquet (compile status, registers, spills, the estimate)."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing

    import pyarrow as pa
    import pyarrow.parquet as pq

    from lospmm.flows.storage.ranker_store import load_ranker
    from lospmm.stages.devices import device_named
    from lospmm.stages.extract import zoo_shapes
    from lospmm.stages.status import Status

    device = device_named(params.gpu)
    booster, _ = load_ranker()
    shapes = [s for model in params.models for s in zoo_shapes(model)]
    picked = sampled_shapes(shapes, params)
    largest = {s.model: s for s in picked}  # sampled_shapes lists each model's shapes smallest first
    jobs = []
    for s in picked:
        jobs += layer_jobs(s, params, booster, device, variants=largest[s.model] is s)
    say(f"{len(picked)} layers, {len(jobs)} kernels to compile for {params.arch}")
    dest = out / f"sample-{params.sparsity:g}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    by_id = {j.id: j for j in jobs}
    if len(by_id) != len(jobs):
        raise ValueError("launch ids collide")
    rows = []
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        for done, (job_id, c) in enumerate(pool.map(compiled_job, jobs, chunksize=1), 1):
            job = by_id[job_id]
            row = job.row | {"id": job_id, "cubin": job_id, "compile_status": str(c.status), "compile_log": c.log[-400:] if c.status != Status.OK else "",
                             "compile_seconds": c.seconds, "registers": c.registers,
                             "spill_bytes": c.thread_spill_bytes}
            if c.status == Status.OK:
                (dest / f"{job_id}.cubin").write_bytes(c.cubin)
            np.savez(dest / f"{job_id}.npz", **job.arrays)
            row["estimate_us"] = estimate_of(row, job.arrays, device).time_us if c.status == Status.OK else float("inf")
            rows.append(row)
            for n1, rank in job.also_at:  # the same cubin (and work arrays) at another N1
                other = row | {"id": f"{job_id}-n{n1}", "n1": n1, "cubin": job_id, "rank": rank}
                other["estimate_us"] = estimate_of(other, job.arrays, device).time_us if c.status == Status.OK \
                    else float("inf")
                rows.append(other)
            if done % 20 == 0 or done == len(jobs):
                say(f"compiled {done}/{len(jobs)}")
    pq.write_table(pa.Table.from_pylist(rows), dest / "launches.parquet")
    return dest


def launch_work(row: dict, arrays: dict | None = None):
    """The estimate's KernelWork of a launch-list row (arrays: the row's own columns by default)."""
    from lospmm.stages.timing import KernelWork

    arrays = row if arrays is None else arrays
    return KernelWork(row["m"], row["k"], row["n"], row["m1"], row["n1"], np.asarray(arrays["tile_loads"], np.int64),
                      np.asarray(arrays["tile_fmas"], np.int64), row["registers"], row["spill_bytes"],
                      row["smem_bytes"], row["zero_blocks"], row["prefetch"])


def within_layer_spearman(rows: list[dict], key: str) -> float:
    """Mean over layers of Spearman's correlation between `key` and the measured time: how well
    `key` ranks one layer's candidates, which is what the search asks of it."""
    values = []
    for layer in sorted({(r["model"], r["layer"]) for r in rows}):
        mine = [r for r in rows if (r["model"], r["layer"]) == layer]
        s = spearman([r[key] for r in mine], [r["measured_us"] for r in mine])
        if np.isfinite(s):
            values.append(s)
    return float(np.mean(values)) if values else float("nan")


def calibration_rows(sets: dict[str, list[dict]], device, params, calibrated_device, calibrated_params) -> list[dict]:
    """Per named set of measured launches and role: Spearman (pooled and within layer), the median
    |log(estimate / measured)|, and Table 4's loss of the estimate's choice, before and after."""
    from lospmm.stages.timing import estimated_timing

    out = []
    for name, rows in sets.items():
        rows = [dict(r) for r in rows if r["variant"] == "" and np.isfinite(r["measured_us"])]
        for r in rows:
            w = launch_work(r)
            r["before_us"] = estimated_timing(w, device, params).time_us
            r["after_us"] = estimated_timing(w, calibrated_device, calibrated_params).time_us
        for role in ("proxy", "full"):
            mine = [r for r in rows if r["role"] == role]
            if not mine:
                continue
            m = np.array([r["measured_us"] for r in mine])
            row = {"set": name, "role": role, "launches": len(mine)}
            for when in ("before", "after"):
                e = np.array([r[f"{when}_us"] for r in mine])
                row |= {f"spearman_{when}": spearman(e, m), f"within_layer_{when}": within_layer_spearman(mine, f"{when}_us"),
                        f"median_log_error_{when}": float(np.median(np.abs(np.log(e / m))))}
            out.append(row)
        for when in ("before", "after"):  # only a launch list has candidates to choose among
            losses = [x["estimate_loss"] for x in table4_rows([r | {"estimate_us": r[f"{when}_us"]} for r in rows])]
            if out and out[-1]["set"] == name and np.isfinite(losses).any():
                out[-1][f"estimate_choice_loss_{when}"] = float(np.nanmean(losses))
    return out


def estimate_of(row: dict, arrays: dict, device, params=None):
    """The estimate timer's figure for a launch-list row, from the work arrays stored with it."""
    from lospmm.stages.timing import EstimateParams, estimated_timing

    return estimated_timing(launch_work(row, arrays), device, params or EstimateParams())


# --- analysis (pure) ---------------------------------------------------------------------------


def geomean(values) -> float:
    v = np.asarray([x for x in values if np.isfinite(x) and x > 0], np.float64)
    return float(np.exp(np.log(v).mean())) if len(v) else float("nan")


def spearman(x, y) -> float:
    """Spearman's rank correlation of the finite pairs (nan with fewer than 3)."""
    from scipy.stats import spearmanr

    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        return float("nan")
    return float(spearmanr(x[ok], y[ok]).statistic)


def table4_rows(measured: list[dict]) -> list[dict]:
    """Per sampled layer: the tile the measured proxies choose (the emit stage's rule), its full
    kernel's time against the best full kernel measured among the top-K, and the same for the
    estimate's choice. Only the flow's own variant ("") counts; outside-top-k rows are excluded."""
    from lospmm.stages.search import choice
    from lospmm.stages.status import Status
    from lospmm.stages.timing import Timing

    out = []
    layers = sorted({(r["model"], r["layer"]) for r in measured})
    for model, layer in layers:
        rows = [r for r in measured if (r["model"], r["layer"]) == (model, layer) and r["variant"] == ""]
        full = {(r["m1"], r["n1"]): r for r in rows if r["role"] == "full"}
        proxy = {(r["m1"], r["n1"]): r for r in rows if r["role"] == "proxy"}
        full_t = {key: r["measured_us"] for key, r in full.items() if np.isfinite(r["measured_us"])}
        if not full_t or not proxy:
            continue
        measured_choice = choice({key: Timing("cuda", r["measured_us"], Status.OK if np.isfinite(r["measured_us"]) else Status.ERROR)
                                  for key, r in proxy.items()}, measured=True,
                                 registers={key: r.get("registers") for key, r in proxy.items()})
        estimate_choice = choice({key: Timing("estimate", r["estimate_us"]) for key, r in proxy.items()})
        best_key = min(full_t, key=full_t.get)
        best = full_t[best_key]
        row = {"model": model, "layer": layer, "m": rows[0]["m"], "k": rows[0]["k"], "n": rows[0]["n"],
               "candidates": len(full_t), "best_tile": f"{best_key[0]}×{best_key[1]}", "best_us": best,
               "proxy_tile": "", "proxy_us": float("nan"), "proxy_loss": float("nan"),
               "estimate_tile": "", "estimate_us": float("nan"), "estimate_loss": float("nan"),
               "spearman_proxy_full": spearman([proxy[k]["measured_us"] for k in full_t if k in proxy],
                                               [full_t[k] for k in full_t if k in proxy])}
        for prefix, key in (("proxy", measured_choice), ("estimate", estimate_choice)):
            if key is not None and key in full_t:
                row |= {f"{prefix}_tile": f"{key[0]}×{key[1]}", f"{prefix}_us": full_t[key],
                        f"{prefix}_loss": full_t[key] / best - 1}
        out.append(row)
    return out


def speedup_summary(rows: list[dict]) -> list[dict]:
    """Geometric means of each baseline's time over ours, per model and over all."""
    baselines = [c[:-3] for c in ("cublas_fp32_us", "cublas_tf32_us", "cublas_fp16_us", "cusparse_csr_us",
                                  "torch_csr_us")]
    out = []
    for sparsity in sorted({r["sparsity"] for r in rows}):
        for model in [*sorted({r["model"] for r in rows}), "all"]:
            mine = [r for r in rows if model in ("all", r["model"]) and r["sparsity"] == sparsity
                    and np.isfinite(r["ours_us"])]
            if mine:
                out.append({"model": model, "sparsity": sparsity, "kernels": len(mine)}
                           | {f"vs_{b}": geomean([r[f"{b}_us"] / r["ours_us"] for r in mine]) for b in baselines})
    return out


def ab_rows(measured: list[dict]) -> list[dict]:
    """Each A/B variant's time against the flow's own kernel of the same layer and tile, and, per
    layer, the best measured M1 = 1 full kernel against the best other one."""
    out = []
    for r in measured:
        if r["variant"].startswith(("ptxas-", "prefetch-")):
            base = [b for b in measured if b["variant"] == "" and b["role"] == "full"
                    and (b["model"], b["layer"], b["m1"], b["n1"]) == (r["model"], r["layer"], r["m1"], r["n1"])]
            if base:
                out.append({"model": r["model"], "layer": r["layer"], "tile": f"{r['m1']}×{r['n1']}",
                            "a_b": f"{r['variant']} vs ptxas-O1 prefetch-1", "a_us": r["measured_us"],
                            "b_us": base[0]["measured_us"], "a_over_b": r["measured_us"] / base[0]["measured_us"],
                            "a_spill_bytes": r["spill_bytes"], "b_spill_bytes": base[0]["spill_bytes"]})
    for model, layer in sorted({(r["model"], r["layer"]) for r in measured}):
        fulls = [r for r in measured if (r["model"], r["layer"]) == (model, layer) and r["role"] == "full"
                 and r["variant"] in ("", "outside-top-k") and np.isfinite(r["measured_us"])]
        one = [r for r in fulls if r["m1"] == 1]
        rest = [r for r in fulls if r["m1"] != 1]
        if one and rest:
            a, b = min(one, key=lambda r: r["measured_us"]), min(rest, key=lambda r: r["measured_us"])
            est_a, est_b = min(one, key=lambda r: r["estimate_us"]), min(rest, key=lambda r: r["estimate_us"])
            out.append({"model": model, "layer": layer, "tile": f"{a['m1']}×{a['n1']} vs {b['m1']}×{b['n1']}",
                        "a_b": "best M1=1 vs best M1>1", "a_us": a["measured_us"], "b_us": b["measured_us"],
                        "a_over_b": a["measured_us"] / b["measured_us"],
                        "estimate_a_over_b": est_a["estimate_us"] / est_b["estimate_us"],
                        "a_spill_bytes": a["spill_bytes"], "b_spill_bytes": b["spill_bytes"]})
    return out


# --- on the device -------------------------------------------------------------------------------


def env_facts() -> dict:
    """The device, driver and the libraries the plan measures with."""
    import importlib.metadata as md
    import platform
    import subprocess

    from cuda.bindings import driver

    from lospmm.runtime import _ck, device_facts

    facts = device_facts() | {"driver_api": _ck(driver.cuDriverGetVersion(), "cuDriverGetVersion"),
                              "python": platform.python_version()}
    try:
        facts["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,"
                                              "clocks.max.mem,power.limit", "--format=csv,noheader"],
                                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        facts["nvidia_smi"] = f"unavailable: {e}"
    for pkg in ("torch", "cupy-cuda13x", "cupy-cuda12x", "cuda-bindings", "nvidia-cuda-nvrtc", "nvidia-nvjitlink",
                "numpy", "scipy", "lightgbm", "prefect"):
        try:
            facts[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return facts


def device_check_rows(rows: list[dict], ns=CHECK_NS, deadline: Deadline | None = None) -> list[dict]:
    """Each emitted kernel run on the device against scipy (float64) for every N of `ns` and the
    layer's own N, B fresh random, C poisoned with NaN; an implicit-im2col conv kernel against a
    reference convolution at batches 1, 3 and the layer's (N = batch·h_out·w_out). A launch failure
    is a row."""
    from lospmm.runtime import check_conv_kernel, check_full_kernel

    out = []
    for r in rows:
        if deadline is not None and deadline.over():
            break
        facts = json.loads((Path(r["path"]) / "kernel.json").read_text())
        cubin = (Path(r["path"]) / "kernel.cubin").read_bytes()
        a = read_matrix(Path(r["path"]) / "a.parquet")
        g, layout = conv_geometry_of(facts), LaunchLayout.of_facts(facts)
        if g is None:
            cases = [(n, lambda n=n: check_full_kernel(cubin, facts["kernel"], layout, a, n=n, seed=n))
                     for n in sorted({*ns, r["n"]})]
        else:
            batches = sorted({1, 3, max(1, r["n"] // (g.h_out * g.w_out))})
            cases = [(g.n(b), lambda b=b: check_conv_kernel(cubin, facts["kernel"], layout, a, g, batch=b, seed=b))
                     for b in batches]
        for n, check in cases:
            t0 = time.perf_counter()
            try:
                err, status, message = check(), "ok", ""
                if not err <= 1e-5:
                    status, message = "wrong", f"max relative error {err:.2e}"
            except Exception as e:  # a failed launch is a row, not the end of the plan
                err, status, message = float("inf"), "error", f"{type(e).__name__}: {e}"[:300]
            out.append({"model": r["model"], "layer": r["layer"], "m": r["m"], "k": r["k"], "nnz": r["nnz"],
                        "m1": r["m1"], "n1": r["n1"], "n": n, "layer_n": r["n"], "max_rel_error": err,
                        "form": "gemm" if g is None else "implicit-conv", "status": status, "message": message,
                        "seconds": time.perf_counter() - t0})
    return out


def loader_rows(rows: list[dict], n: int = 257) -> list[dict]:
    """The loader on torch and on CuPy arrays: both C against scipy, and against each other."""
    from lospmm.loader import load_kernel

    from lospmm.hostemu import reference_conv2d

    out = []
    for r in rows:
        a = read_matrix(Path(r["path"]) / "a.parquet")
        g = conv_geometry_of(json.loads((Path(r["path"]) / "kernel.json").read_text()))
        if g is None:  # C = A·B on a K×N B
            b = np.random.default_rng(7).standard_normal((r["k"], n)).astype(np.float32)
            ref = a @ b.astype(np.float64)
        else:  # Y = conv(X) on a batch of 2 NCHW images
            b = np.random.default_rng(7).standard_normal((2, g.cin, g.h, g.w)).astype(np.float32)
            ref = reference_conv2d(b, a.toarray().reshape(r["m"], g.cin, g.kh, g.kw), g)
        got, problems = {}, []
        try:
            spmm = load_kernel(r["path"])
        except Exception as e:
            problems.append(f"load_kernel: {type(e).__name__}: {e}")
            spmm = None

        def on_torch():
            import torch

            return spmm(torch.from_numpy(b).cuda()).cpu().numpy()

        def on_cupy():
            import cupy

            return cupy.asnumpy(spmm(cupy.asarray(b)))

        for lib, fn in (("torch", on_torch), ("cupy", on_cupy)):
            try:
                if spmm is not None:
                    got[lib] = fn()
            except Exception as e:  # one library missing or failing is a row, not the end of the plan
                problems.append(f"{lib}: {type(e).__name__}: {e}"[:300])
        row = {"model": r["model"], "layer": r["layer"], "n": n, "libraries": ",".join(got),
               "problems": "; ".join(problems)}
        for lib, c in got.items():
            row[f"{lib}_max_rel_error"] = float(np.abs(c - ref).max() / max(np.abs(ref).max(), 1e-30))
        if len(got) == 2:
            row["torch_vs_cupy_max_abs"] = float(np.abs(got["torch"] - got["cupy"]).max())
        out.append(row)
    return out


def speedup_rows(rows: list[dict], deadline: Deadline | None = None, repeats: int = 20) -> list[dict]:
    """Ours (the emitted kernel at the layer's N) against cuBLAS SGEMM with TF32 off (the paper's
    baseline), with TF32, in fp16 on tensor cores, cuSPARSE CSR (CuPy) and torch CSR: median µs
    of `repeats` launches, L2 flushed before each, per distinct (model, M, K, N)."""
    import torch

    from lospmm.runtime import CudaTimerOptions, time_conv_kernel_cubin, time_full_kernel_cubin, torch_timed

    opts = CudaTimerOptions(repeats=repeats)
    out, seen = [], set()
    for r in rows:
        key = (r["model"], r["sparsity"], r["m"], r["k"], r["n"])
        if key in seen:
            continue
        if deadline is not None and deadline.over():
            break
        seen.add(key)
        facts = json.loads((Path(r["path"]) / "kernel.json").read_text())
        a = read_matrix(Path(r["path"]) / "a.parquet")
        cubin, g = (Path(r["path"]) / "kernel.cubin").read_bytes(), conv_geometry_of(facts)
        layout = LaunchLayout.of_facts(facts)
        if g is None:
            ours = time_full_kernel_cubin(cubin, facts["kernel"], layout, r["m"], r["k"], r["n"], opts)
        else:  # the conv kernel reads X itself; the GEMM baselines below are on the im2col shape
            ours = time_conv_kernel_cubin(cubin, facts["kernel"], layout, r["m"], g, r["n"] // (g.h_out * g.w_out), opts)
        row = {"model": r["model"], "layer": r["layer"], "m": r["m"], "k": r["k"], "n": r["n"], "nnz": r["nnz"],
               "sparsity": r["sparsity"], "tile": f"{r['m1']}×{r['n1']}", "ours_us": ours.time_us,
               "form": "gemm" if g is None else "implicit-conv",
               "ours_status": str(ours.status), "ours_message": ours.message,
               # the flow's own figure for this kernel, from whichever timer the run used
               "estimate_us": r["full_time_us"], "flow_timer": r.get("timer", "")}
        row |= emitted_work(facts, a)  # so that the estimate can be refitted to these measurements too
        dense = torch.from_numpy(a.toarray()).cuda()
        b = torch.randn(r["k"], r["n"], device="cuda")
        problems = []

        def baseline(name, make_fn):  # one failing library is a NaN and a message, not a lost table
            try:
                row[f"{name}_us"] = torch_timed(make_fn(), opts)
            except Exception as e:
                row[f"{name}_us"] = float("nan")
                problems.append(f"{name}: {type(e).__name__}: {e}"[:200])

        for name, tf32, dtype in (("cublas_fp32", False, torch.float32), ("cublas_tf32", True, torch.float32),
                                  ("cublas_fp16", False, torch.float16)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            da, db = dense.to(dtype), b.to(dtype)
            baseline(name, lambda: (lambda: torch.matmul(da, db)))
        torch.backends.cuda.matmul.allow_tf32 = False
        baseline("torch_csr", lambda: (lambda csr=dense.to_sparse_csr(): csr @ b))
        if g is not None:  # the dense convolution itself, cuDNN FP32 (TF32 off), on the same batch

            def cudnn():
                torch.backends.cudnn.allow_tf32 = False
                w = dense.reshape(r["m"], g.cin, g.kh, g.kw)
                x = torch.randn(r["n"] // (g.h_out * g.w_out), g.cin, g.h, g.w, device="cuda")
                return lambda: torch.nn.functional.conv2d(x, w, None, g.stride, g.pad, g.dilation)

            baseline("cudnn_fp32", cudnn)

        def cusparse():
            import cupy
            import cupyx.scipy.sparse as cps

            ca, cb = cps.csr_matrix(a.astype(np.float32)), cupy.asarray(b.cpu().numpy())
            cupy.cuda.Device().synchronize()
            return lambda: ca @ cb  # CuPy and torch both on the legacy default stream

        baseline("cusparse_csr", cusparse)
        row["baseline_problems"] = "; ".join(problems)
        out.append(row)
    return out


def measured_launches(folder: Path, deadline: Deadline | None = None, repeats: int = 20) -> list[dict]:
    """Every launch of an unpacked sample, timed like the `cuda` timer times (median of `repeats`,
    L2 flushed); a launch past the deadline, or one that fails, is a row with measured_us = inf."""
    import pyarrow.parquet as pq

    from lospmm.runtime import CudaTimerOptions, time_full_kernel_cubin, time_proxy_cubin

    opts = CudaTimerOptions(repeats=repeats)
    out = []
    for r in pq.read_table(folder / "launches.parquet").to_pylist():
        r = r | {"measured_us": float("inf"), "measure_status": "not run", "measure_message": ""}
        file_id = r.get("cubin") or r["id"]  # rows launching one cubin at several N1 share its files
        with np.load(folder / f"{file_id}.npz") as npz:
            arrays = dict(npz)
        if r["compile_status"] != "ok":
            r["measure_status"] = "not compiled"
        elif r["role"] == "proxy" and not r.get("launch"):  # its proxy takes a tile_rows table proxies no longer get
            r["measure_status"] = "bundle from before the launch layout: prepare it again"
        elif deadline is not None and deadline.over():
            r["measure_status"] = "stopped at the time budget"
        else:
            cubin = (folder / f"{file_id}.cubin").read_bytes()
            layout = (LaunchLayout(**json.loads(r["launch"])) if r.get("launch")
                      else LaunchLayout(r["grid_x"], r["n1"]))  # a full kernel of a bundle from before
            if r["role"] == "full" and layout.threads == 0:  # a full kernel reading N1 at launch
                layout = replace(layout, threads=r["n1"])
            if r["role"] == "proxy":
                t = time_proxy_cubin(cubin, r["kernel"], layout, r["m"], r["k"], r["n"], r["n1"], arrays["cluster_of"],
                                     r["smem_bytes"], opts)
            else:
                t = time_full_kernel_cubin(cubin, r["kernel"], layout, r["m"], r["k"], r["n"], opts)
            r |= {"measured_us": t.time_us, "measure_status": str(t.status), "measure_message": t.message}
        # the estimate's work travels with the measurement, so a fit needs nothing but this table
        r |= {"tile_loads": arrays["tile_loads"].tolist(), "tile_fmas": arrays["tile_fmas"].tolist()}
        out.append(r)
    return out


def speedup_launch_rows(rows: list[dict]) -> list[dict]:
    """Speedup rows as launch rows (role full, the flow's own variant): measurements of emitted
    kernels at the layer's N, for calibrating the estimate beside the sample's launches."""
    return [r | {"role": "full", "variant": "", "measured_us": r["ours_us"]} for r in rows
            if "tile_loads" in r and np.isfinite(r["ours_us"])]


# --- implicit-im2col conv kernels (issue 13) on the device ---------------------------------------

CONV_CASES = (  # (label, Cout, geometry fields, bias, relu): padding borders, stride 2, a 7×7 first layer
    ("7x7 stride 2 pad 3 (ResNet-50 conv1), bias+ReLU", 64, dict(cin=3, h=224, w=224, kh=7, kw=7, stride=2, pad=3), True, True),
    ("3x3 stride 1 pad 1 (ResNet-50 layer1)", 64, dict(cin=64, h=56, w=56, kh=3, kw=3, stride=1, pad=1), False, False),
    ("3x3 stride 2 pad 1 (ResNet-50 layer2.0)", 128, dict(cin=128, h=56, w=56, kh=3, kw=3, stride=2, pad=1), False, True),
    ("3x3 dilation 2 pad 2", 32, dict(cin=32, h=28, w=28, kh=3, kw=3, stride=1, pad=2, dilation=2), True, False),
    ("1x1 (ResNet-50 layer1 conv3)", 256, dict(cin=64, h=56, w=56, kh=1, kw=1), False, True),
)


def conv_bundle(out: Path, sparsity: float = 0.9, m1: int = 2, n1: int = 256, arch: str = "sm_90") -> Path:
    """CONV_CASES compiled here: each case's conv kernel and the GEMM kernel of the same A and tile
    (what the search emits for the im2col GEMM), A as Parquet, and case.json."""
    from lospmm.stages.codegen import ConvGeometry, Epilogue, conv_kernel_source, full_kernel_source
    from lospmm.stages.compile import compiled_kernel, kernel_options
    from lospmm.stages.prune import random_pruned
    from lospmm.stages.reorder import reordered_tiles

    dest = out / f"conv-s{sparsity:g}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    cases = []
    for i, (label, cout, fields, bias, relu) in enumerate(CONV_CASES):
        g = ConvGeometry(**fields)
        rng = np.random.default_rng(i)
        a = random_pruned(cout, g.k, sparsity, rng)
        b = tuple(float(v) for v in rng.standard_normal(cout).astype(np.float32)) if bias else ()
        tiles = reordered_tiles(a, m1)
        case = {"label": label, "geometry": fields, "bias": list(b), "relu": relu, "m": cout, "k": g.k,
                "nnz": int(a.nnz), "m1": m1, "n1": n1}
        for kind, src in (("conv", conv_kernel_source(a, tiles, n1, g, Epilogue(b, "relu" if relu else ""))),
                          ("gemm", full_kernel_source(a, tiles, n1))):
            c = compiled_kernel(src, kernel_options(arch, m1))
            if c.status != "ok":
                raise RuntimeError(f"conv case {label!r}: the {kind} kernel did not compile: {c.log[-300:]}")
            (dest / f"{i}-{kind}.cubin").write_bytes(c.cubin)
            case[kind] = {"kernel": src.name, "launch": src.layout.facts(), "status": str(c.status), "registers": c.registers,
                          "spill_bytes": c.thread_spill_bytes, "compile_seconds": c.seconds}
        write_matrix(dest / f"{i}-a.parquet", a)
        cases.append(case)
    (dest / "cases.json").write_text(json.dumps(cases, indent=1))
    return dest


def conv_rows(folder: Path, batches=(1, 3), timed_batch: int = 4, repeats: int = 20) -> list[dict]:
    """Each conv case on the device: its conv kernel against the reference convolution for every
    batch of `batches`, then at `timed_batch` the conv kernel, the GEMM kernel on the im2col matrix
    (im2col itself not timed) and cuDNN's dense FP32 convolution (torch, TF32 off), median µs."""
    from lospmm.runtime import (CudaTimerOptions, check_conv_kernel, time_conv_kernel_cubin, time_full_kernel_cubin,
                                torch_timed)
    from lospmm.stages.codegen import ConvGeometry, Epilogue

    import torch  # noqa: F401  (before anything loads NVRTC: see runtime.SPIN_PTX)

    opts = CudaTimerOptions(repeats=repeats)
    out = []
    for i, case in enumerate(json.loads((folder / "cases.json").read_text())):
        g = ConvGeometry(**case["geometry"])
        a = read_matrix(folder / f"{i}-a.parquet")
        conv, gemm = case["conv"], case["gemm"]
        row = {"case": case["label"], "m": case["m"], "k": case["k"], "nnz": case["nnz"], "tile": f"{case['m1']}×{case['n1']}",
               "conv_registers": conv["registers"], "gemm_registers": gemm["registers"],
               "conv_spill_bytes": conv["spill_bytes"], "gemm_spill_bytes": gemm["spill_bytes"]}
        try:
            cubin = (folder / f"{i}-conv.cubin").read_bytes()
            conv_layout, gemm_layout = (LaunchLayout(**k["launch"]) if "launch" in k else LaunchLayout(k["grid_x"], case["n1"])
                                        for k in (conv, gemm))  # cases.json from before: the baseline's layout
            epilogue = Epilogue(tuple(case["bias"]), "relu" if case["relu"] else "")
            errors = [check_conv_kernel(cubin, conv["kernel"], conv_layout, a, g, epilogue, batch=b, seed=b)
                      for b in batches]
            row["max_rel_error"] = max(errors)
            row["status"] = "ok" if row["max_rel_error"] <= 1e-5 else "wrong"
            row["conv_us"] = time_conv_kernel_cubin(cubin, conv["kernel"], conv_layout, case["m"], g,
                                                    timed_batch, opts).time_us
            row["gemm_us"] = time_full_kernel_cubin((folder / f"{i}-gemm.cubin").read_bytes(), gemm["kernel"],
                                                    gemm_layout, case["m"], case["k"], g.n(timed_batch), opts).time_us
            torch.backends.cudnn.allow_tf32 = False
            x = torch.randn(timed_batch, g.cin, g.h, g.w, device="cuda")
            w = torch.from_numpy(a.toarray().reshape(case["m"], g.cin, g.kh, g.kw)).cuda()
            bias = torch.tensor(case["bias"], device="cuda") if case["bias"] else None

            def dense():
                y = torch.nn.functional.conv2d(x, w, bias, g.stride, g.pad, g.dilation)
                return torch.relu(y) if case["relu"] else y

            row["cudnn_fp32_us"] = torch_timed(dense, opts)
        except Exception as e:  # a failed launch is a row
            row |= {"status": "error", "message": f"{type(e).__name__}: {e}"[:300]}
        out.append(row)
    return out
