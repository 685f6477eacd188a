"""The Prefect flow over stages 1–10: load inputs -> call the stage -> write the
artifact -> return a small manifest.

Each task's cache key is its artifact key (stage, stage code version, parameters, input keys), so
a re-run with nothing changed is all Cached; the flow checks each artifact on disk first and
recomputes one that is missing or fails its checksum. A task also reuses a whole artifact that a
killed run left behind without a Prefect cache record.
"""

from __future__ import annotations

import json
import os
import secrets
from collections import Counter
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.futures import wait

from lospmm.flows import progress, schemas
from lospmm.flows.compile_cache import cached_compile
from lospmm.flows.config import ConfigError, RunConfig, validated, weights_label
from lospmm.flows.kernels import emitted_kernel
from lospmm.flows.ranker_store import load_ranker, ranker_metadata
from lospmm.flows.runs import write_run_record
from lospmm.flows.store import (
    artifact_key,
    artifact_path,
    atomic_write,
    file_sha256,
    read_artifact,
    stage_version,
    valid_sidecar,
    write_artifact,
)
from lospmm.flows.weights import load_tensor, tensor_infos
from lospmm.hostemu import run_on_host
from lospmm.stages.cluster import proxy_clusters
from lospmm.stages.codegen import proxy_kernel_source, proxy_tile_rows
from lospmm.stages.compile import CompileOptions
from lospmm.stages.constrain import ConstrainParams, constrained_candidates, predicted_registers
from lospmm.stages.devices import device_named
from lospmm.stages.extract import ZooParams, sanitized_name, weight_shapes, zoo_shapes
from lospmm.stages.pad import active_blocks_per_sm, proxy_launch
from lospmm.stages.prune import PruneParams, pruned_layer
from lospmm.stages.rank import ranked
from lospmm.stages.reorder import (ReorderParams, TileStats, distinct_m1s, identity_tiles, reordered_tiles,
                                   tile_stats)
from lospmm.stages.timing import estimated_timing, full_kernel_work, proxy_work


_LAYER_FIELDS = ("model", "layer", "op", "m", "n", "k", "repeat")


def _layer_fields(row: dict, *extra: str) -> dict:
    """The columns that identify a layer (plus `extra`), copied from an upstream row."""
    return {f: row[f] for f in _LAYER_FIELDS + extra}


def _cache_key(_context, parameters: dict[str, Any]) -> str:
    return parameters["key"]


_TASK = dict(cache_key_fn=_cache_key, persist_result=True, result_serializer="json")


# --- tasks: thin wrappers that load, call a stage per layer, and write one artifact -------------


@task(name="extract", task_run_name="extract:{label}", **_TASK)
def extract_task(key: str, root: str, label: str, source: dict, force: bool = False) -> dict:
    def compute():
        if source["kind"] == "zoo":
            shapes = zoo_shapes(source["name"], ZooParams(**source["zoo"]))
        else:
            shapes = weight_shapes(label, tensor_infos(source["path"]), source["tokens"])
        return [schemas.shape_row(s, source.get("path") or source["name"], source.get("sha256", "")) for s in shapes]

    return _run_stage("extract", key, root, label, force, compute)


@task(name="prune", task_run_name="prune:{label}", **_TASK)
def prune_task(key: str, root: str, label: str, shapes: dict, sparsity: float, method: str,
               seed: int, weights: str | None = None, force: bool = False) -> dict:
    def compute():
        table = read_artifact(Path(root) / shapes["path"])
        params = PruneParams(method=method, seed=seed)
        rows = []
        for row in table.to_pylist():
            shape = schemas.shape_from_row(row)
            if shape.status == "skipped":
                continue
            t0 = time.perf_counter()
            base = {**_layer_fields(row), "sparsity_requested": sparsity, "method": method}
            try:
                weight = load_tensor(weights, shape.layer) if (weights and shape.ok) else None
                layer = pruned_layer(shape, sparsity, params, weight)
            except Exception as e:  # one bad layer never sinks the others
                rows.append({**base, "nnz": 0, "status": "error", "message": f"{shape.layer}: {type(e).__name__}: {e}",
                             "seconds": time.perf_counter() - t0})
                continue
            a = layer.matrix
            rows.append({
                **base, "sparsity_achieved": layer.sparsity_achieved, "nnz": layer.nnz,
                "status": layer.status, "message": layer.message,
                **({"indptr": a.indptr, "indices": a.indices, "data": a.data} if a is not None else {}),
                "seconds": time.perf_counter() - t0,
            })
        return rows

    return _run_stage("prune", key, root, label, force, compute)


@task(name="reorder", task_run_name="reorder:{label}", **_TASK)
def reorder_task(key: str, root: str, label: str, pruned: dict, m1s: list[int], force: bool = False) -> dict:
    def compute():
        table = read_artifact(Path(root) / pruned["path"])
        params = ReorderParams()
        rows = []
        for i in range(table.num_rows):
            info = {c: table.column(c)[i].as_py() for c in _LAYER_FIELDS + ("nnz", "status", "message",
                                                                             "sparsity_requested")}
            base = {**_layer_fields(info, "nnz"), "sparsity": info["sparsity_requested"]}
            if info["status"] != "ok":
                rows.append({**base, "m1": 0, "status": info["status"], "message": info["message"]})
                continue
            try:
                matrix = schemas.csr_from_row(table, i)
                for m1 in distinct_m1s(matrix, m1s):
                    t0 = time.perf_counter()
                    tiles = reordered_tiles(matrix, m1, params)
                    ident = tile_stats(identity_tiles(matrix, m1))
                    rows.append({
                        **base, "m1": m1, "status": "ok", "message": "",
                        "num_tiles": tiles.num_tiles, "num_empty_rows": len(tiles.empty_rows),
                        "empty_rows": tiles.empty_rows, "rows": tiles.rows, "tile_ptr": tiles.tile_ptr,
                        "tile_nnz": tiles.tile_nnz, "tile_nnc": tiles.tile_nnc,
                        **_prefixed("identity", ident), **_prefixed("reordered", tile_stats(tiles)),
                        "seconds": time.perf_counter() - t0,
                    })
            except Exception as e:
                rows.append({**base, "m1": 0, "status": "error",
                             "message": f"{info['layer']}: {type(e).__name__}: {e}"})
        return rows

    return _run_stage("reorder", key, root, label, force, compute)


@task(name="constrain", task_run_name="constrain:{label}", **_TASK)
def constrain_task(key: str, root: str, label: str, reordered: dict, gpu: str, th_row: float,
                   th_col: float, force: bool = False) -> dict:
    def compute():
        cols = [c for c in schemas.REORDERED.names if c not in schemas.LIST_COLUMNS]
        table = read_artifact(Path(root) / reordered["path"], columns=cols)
        device = device_named(gpu)
        params = ConstrainParams(th_row=th_row, th_col=th_col)
        layers: dict[str, list[dict]] = {}
        for row in table.to_pylist():
            layers.setdefault(row["layer"], []).append(row)
        rows = []
        for layer, group in layers.items():
            first = group[0]
            base = {**_layer_fields(first, "sparsity"), "gpu": device.name, "arch": device.arch}
            if first["status"] == "error":
                rows.append({**base, "kept": False, "removed_by": "error", "status": "error",
                             "message": first["message"]})
                continue
            stats = {
                r["m1"]: TileStats(r["num_tiles"], r["reordered_max_nnc"], r["reordered_mean_nnc"],
                                   r["reordered_nnc_sum"], r["reordered_max_nnz"], r["reordered_cov_nnz"])
                for r in group if r["status"] == "ok"
            }
            if first["status"] == "empty":  # all-zero layer: no tiles, every N1 is removed as empty
                stats = {1: TileStats(0, 0, 0.0, 0, 0, 0.0)}
            try:
                cands = constrained_candidates(first["n"], stats, device, params)
            except Exception as e:
                rows.append({**base, "kept": False, "removed_by": "error", "status": "error",
                             "message": f"{layer}: {type(e).__name__}: {e}"})
                continue
            for c in cands:
                rows.append({**base, **vars(c), "kept": c.kept, "status": first["status"],
                             "message": first["message"]})
        return rows

    return _run_stage("constrain", key, root, label, force, compute)


@task(name="rank", task_run_name="rank:{label}", **_TASK)
def rank_task(key: str, root: str, label: str, candidates: dict, top_k: int, use_rank: bool, ranker: str | None,
              force: bool = False) -> dict:
    def compute():
        booster, meta = load_ranker(ranker) if use_rank else (None, {"version": "none"})
        tag = f"lambdamart:{meta['version']}" if use_rank else "none (every kept candidate)"
        rows = []
        by_layer: dict = {}
        for c in _kept_rows(root, candidates):  # already in (layer, M1, N1) order
            by_layer.setdefault(c["layer"], []).append(c)
        for group in by_layer.values():
            t0 = time.perf_counter()
            if use_rank:
                scores, ranks = ranked(group, booster, top_k)
            else:
                scores, ranks = np.zeros(len(group)), np.arange(1, len(group) + 1, dtype=np.int32)
            seconds = time.perf_counter() - t0
            for c, sc, r in zip(group, scores, ranks):
                rows.append({**c, "score": float(sc), "rank": int(r), "chosen": (not use_rank) or int(r) <= top_k,
                             "ranker": tag, "seconds": seconds})
        return rows

    return _run_stage("rank", key, root, label, force, compute)


@task(name="cluster", task_run_name="cluster:{label}", **_TASK)
def cluster_task(key: str, root: str, label: str, pruned: dict, reordered: dict, candidates: dict, gpu: str,
                 force: bool = False) -> dict:
    def compute():
        device = device_named(gpu)
        matrices = _matrices(root, pruned)
        tiles = _tiles_by_layer(root, reordered)
        rows = []
        for layer, cands in _kept_by_layer(root, candidates).items():
            for m1, group in sorted(cands.items()):
                first = group[0]
                base = _layer_fields(first, "sparsity")
                t0 = time.perf_counter()
                try:
                    t = tiles[layer][m1]
                    atb = max(active_blocks_per_sm(c["block_num"], c["pred_regs"], c["n1"], device) for c in group)
                    cl = proxy_clusters(matrices[layer], t, first["sparsity"], atb)
                    rows.append({**base, "m1": m1, "status": "ok", "message": "", "num_tiles": t.num_tiles,
                                 "max_active_blocks": atb, "num_clusters": cl.num_clusters,
                                 "cluster_of": cl.cluster_of, "medoid": cl.medoid, "centroid_nnc": cl.centroid_nnc,
                                 "centroid_nnz": cl.centroid_nnz, "nnc_p": cl.nnc_p, "cpl": cl.cpl,
                                 "columns": np.concatenate(cl.columns), "seconds": time.perf_counter() - t0})
                except Exception as e:
                    rows.append({**base, "m1": m1, "status": "error",
                                 "message": f"{layer} M1={m1}: {type(e).__name__}: {e}"})
        return rows

    return _run_stage("cluster", key, root, label, force, compute)


@task(name="pad", task_run_name="pad:{label}", **_TASK)
def pad_task(key: str, root: str, label: str, candidates: dict, gpu: str, force: bool = False) -> dict:
    def compute():
        device = device_named(gpu)
        rows = []
        for c in _kept_rows(root, candidates):
            base = {**_layer_fields(c, "sparsity", "m1", "n1"), "gpu": device.name}
            try:
                launch = proxy_launch(c["num_a_tiles"], c["n"], c["m1"], c["n1"], c["pred_regs"], device)
                rows.append({**base, "status": "ok", "message": "", "grid_x": launch.grid_x,
                             "grid_y": launch.grid_y, "block": launch.block, "pred_regs": c["pred_regs"],
                             "num_atb": launch.num_atb, "smem_bytes": launch.smem_bytes})
            except Exception as e:
                rows.append({**base, "status": "error",
                             "message": f"{c['layer']} ({c['m1']},{c['n1']}): {type(e).__name__}: {e}"})
        return rows

    return _run_stage("pad", key, root, label, force, compute)


@task(name="compile", task_run_name="compile:{label}", **_TASK)
def compile_task(key: str, root: str, label: str, clusters: dict, reordered: dict, arch: str, verify: bool,
                 jobs: int = 1, run_id: str = "", force: bool = False) -> dict:
    def compute():
        table = read_artifact(Path(root) / clusters["path"])
        tiles = _tiles_by_layer(root, reordered) if verify else {}
        logger = get_run_logger()  # fetched here: pool threads do not carry Prefect's run context

        def one(i: int) -> dict:
            info = {c: table.column(c)[i].as_py() for c in _LAYER_FIELDS + ("sparsity", "m1", "status", "message")}
            base = _layer_fields(info, "sparsity", "m1")
            if info["status"] != "ok":
                return {**base, "status": info["status"], "message": info["message"], "kind": "proxy"}
            try:
                cl = schemas.clusters_from_row(table, i)
                kernel = proxy_kernel_source(info["m"], info["k"], cl)
                options = CompileOptions(arch=arch, maxrregcount=predicted_registers(info["m1"]))
                result, hit = cached_compile(root, kernel.source, kernel.name, options)
                logger.info(
                    "compiled proxy %s M1=%d (%d of %d): %s, %d registers, %d B spilled, %.1f s%s", info["layer"],
                    info["m1"], i + 1, table.num_rows, result["status"], result["registers"], result["spill_stores"],
                    result["seconds"], " (compile cache)" if hit else "")
                verified = "not run"
                if verify and result["status"] == "ok":
                    verified = _verify_proxy(kernel, cl, tiles[info["layer"]][info["m1"]], info)
                return {**base, "status": result["status"], "kind": "proxy", "kernel": kernel.name,
                        "message": "" if result["status"] == "ok" else f"{info['layer']} M1={info['m1']}: NVRTC failed",
                        "source_sha256": kernel.sha256, "compile_key": result["key"], "arch": arch,
                        "maxrregcount": options.maxrregcount, "registers": result["registers"],
                        "spill_stores": result["spill_stores"], "spill_loads": result["spill_loads"],
                        "stack_bytes": result["stack_bytes"], "smem_bytes": result["smem_bytes"],
                        "compile_seconds": result["seconds"], "from_cache": hit,
                        "source_bytes": len(kernel.source), "source_path": result["paths"]["source"],
                        "ptx_path": result["paths"]["ptx"], "cubin_path": result["paths"]["cubin"],
                        "verified": verified, "log": result["log"][-4000:]}
            except Exception as e:
                return {**base, "status": "error", "kind": "proxy",
                        "message": f"{info['layer']} M1={info['m1']}: {type(e).__name__}: {e}"}

        return _in_parallel(one, range(table.num_rows), jobs, _reporter(run_id, "compile", label))

    return _run_stage("compile", key, root, label, force, compute)


@task(name="time", task_run_name="time:{label}", **_TASK)
def time_task(key: str, root: str, label: str, launch: dict, compiled_: dict, clusters: dict, reordered: dict,
              gpu: str, timer: str, run_id: str = "", force: bool = False) -> dict:
    def compute():
        device = device_named(gpu)
        comp = _rows_by(read_artifact(Path(root) / compiled_["path"]), ("layer", "m1"))
        cl_table = read_artifact(Path(root) / clusters["path"])
        cl_index = {(cl_table.column("layer")[i].as_py(), cl_table.column("m1")[i].as_py()): i
                    for i in range(cl_table.num_rows) if cl_table.column("status")[i].as_py() == "ok"}
        tiles = _tiles_by_layer(root, reordered) if timer == "cuda" else {}

        def one(c: dict) -> dict:
            base = {**_layer_fields(c, "sparsity", "m1", "n1"), "kind": "proxy", "timer": timer}
            where = f"{c['layer']} ({c['m1']},{c['n1']})"
            p = comp.get((c["layer"], c["m1"]))
            if c["status"] != "ok" or p is None or p["status"] != "ok" or (c["layer"], c["m1"]) not in cl_index:
                why = c["message"] if c["status"] != "ok" else "its proxy did not compile"
                return {**base, "status": "skipped", "message": f"{where}: {why}", "time_us": float("inf")}
            t0 = time.perf_counter()
            cl = schemas.clusters_from_row(cl_table, cl_index[(c["layer"], c["m1"])])
            spill = int(p["spill_stores"]) + int(p["spill_loads"])
            if timer == "cuda":
                from lospmm.runtime import time_proxy_cubin

                cubin = (Path(root) / p["cubin_path"]).read_bytes()
                t = time_proxy_cubin(cubin, p["kernel"], c["m"], c["k"], c["n"], c["n1"], cl.cluster_of,
                                     proxy_tile_rows(tiles[c["layer"]][c["m1"]]), c["smem_bytes"])
            else:
                work = proxy_work(cl, c["m"], c["k"], c["n"], c["n1"], p["registers"], c["smem_bytes"], spill)
                t = estimated_timing(work, device)
            return {**base, "status": t.status, "message": f"{where}: {t.message}" if t.message else "",
                    "time_us": t.time_us, "compute_us": t.compute_us, "memory_us": t.memory_us,
                    "latency_us": t.latency_us, "active_blocks": t.active_blocks, "repeats": t.repeats,
                    "registers": p["registers"], "spill_bytes": spill, "smem_bytes": c["smem_bytes"],
                    "rank": c.get("rank"), "seconds": time.perf_counter() - t0}

        # one at a time: concurrent launches would disturb each other's measurements
        return _in_parallel(one, read_artifact(Path(root) / launch["path"]).to_pylist(), 1,
                            _reporter(run_id, "time", label))

    return _run_stage("time", key, root, label, force, compute)


@task(name="emit", task_run_name="emit:{label}", **_TASK)
def emit_task(key: str, root: str, label: str, timed: dict, pruned: dict, reordered: dict, gpu: str, timer: str,
              chosen_by: str, verify: bool, jobs: int = 1, run_id: str = "", force: bool = False) -> dict:
    def compute():
        device = device_named(gpu)
        matrices = _matrices(root, pruned)
        tiles = _tiles_by_layer(root, reordered)
        by_layer: dict = {}
        for r in read_artifact(Path(root) / timed["path"]).to_pylist():
            by_layer.setdefault(r["layer"], []).append(r)
        kernels_root = artifact_path(root, "emit", label, key).with_suffix("")
        logger = get_run_logger()

        def one(item) -> dict:
            layer, group = item
            ok = [r for r in group if r["status"] == "ok" and np.isfinite(r["time_us"])]
            base = {**_layer_fields(group[0], "sparsity"), "timer": timer, "chosen_by": chosen_by,
                    "candidates_timed": len(ok)}
            if not ok:
                return {**base, "status": "error", "message": f"{layer}: no candidate could be timed ("
                        + "; ".join(sorted({r["message"] for r in group if r["message"]}))[:500] + ")"}
            best = min(ok, key=lambda r: (r["time_us"], r["m1"], r["n1"]))
            t0 = time.perf_counter()
            try:
                m1, n1 = best["m1"], best["n1"]
                matrix, t = matrices[layer], tiles[layer][m1]
                out = kernels_root / sanitized_name(layer)
                facts = emitted_kernel(root, matrix, t, layer, best["sparsity"], n1, device.arch, out,
                                       compile_=True, verify=verify and timer != "cuda",
                                       extra={"chosen_by": chosen_by, "timer": timer, "gpu": device.name,
                                              "proxy_time_us": best["time_us"], "candidates_timed": len(ok)})
                comp = facts["compile"]
                full_us, dense_us, check, err = float("nan"), float("nan"), "not run", float("nan")
                if comp["status"] == "ok":
                    regs, spill = comp["registers"], comp["spill_stores"] + comp["spill_loads"]
                    if timer == "cuda":
                        from lospmm.runtime import check_full_kernel, dense_sgemm_time, time_full_kernel_cubin

                        cubin = (out / "kernel.cubin").read_bytes()
                        err = check_full_kernel(cubin, facts["kernel"], facts["grid"]["x"], n1, matrix)
                        check = "device" if err < 1e-4 else "device: FAILED"
                        full_us = time_full_kernel_cubin(cubin, facts["kernel"], facts["grid"]["x"], best["m"],
                                                         best["k"], best["n"], n1).time_us
                        dense_us = dense_sgemm_time(best["m"], best["k"], best["n"]).time_us
                    else:
                        work = full_kernel_work(t, best["m"], best["k"], best["n"], n1, regs, spill)
                        full_us = estimated_timing(work, device).time_us
                    hc = facts.get("host_check")
                    if hc:
                        check = "host-asan" if hc["status"] == "ok" else "host: FAILED"
                        err = hc.get("max_rel_error", float("inf"))
                    # a speedup only from two measurements: the estimate timer has no dense baseline
                    speedup = dense_us / full_us if np.isfinite(dense_us) and full_us > 0 else float("nan")
                    facts.update(full_time_us=full_us, dense_time_us=dense_us, speedup_vs_dense=speedup, check=check,
                                 max_rel_error=err)
                    atomic_write(out / "kernel.json", lambda tmp: Path(tmp).write_text(json.dumps(facts, indent=1)))
                failed = comp["status"] != "ok" or "FAILED" in check
                logger.info("emitted %s tile (%d,%d): compile %s in %.1f s, %s check, %s %.2f us, %.1f s in all",
                            layer, m1, n1, comp["status"], comp.get("seconds") or 0.0, check, timer, full_us,
                            time.perf_counter() - t0)
                return {**base, "status": "error" if failed else "ok",
                        "message": f"{layer} ({m1},{n1}): " + (comp.get("log", "")[-300:] or check) if failed else "",
                        "m1": m1, "n1": n1, "proxy_time_us": best["time_us"], "full_time_us": full_us,
                        "dense_time_us": dense_us, "speedup_vs_dense": facts.get("speedup_vs_dense"),
                        "kernel": facts["kernel"], "kernel_dir": str(out.relative_to(root)),
                        "registers": comp.get("registers"), "spill_bytes": comp.get("spill_stores", 0)
                        + comp.get("spill_loads", 0), "compile_seconds": comp.get("seconds"), "check": check,
                        "max_rel_error": err, "seconds": time.perf_counter() - t0}
            except Exception as e:
                return {**base, "status": "error", "message": f"{layer}: {type(e).__name__}: {e}"}

        # GPU timing is serialised: concurrent launches would disturb each other's measurements.
        return _in_parallel(one, list(by_layer.items()), 1 if timer == "cuda" else jobs,
                            _reporter(run_id, "emit", label))

    return _run_stage("emit", key, root, label, force, compute)


def _in_parallel(fn: Callable, items, jobs: int, report: Callable[[int, int, dict], None] | None = None) -> list:
    """fn over items, results in order; threads when jobs > 1 (NVRTC and the host compiler release
    the GIL). `report(done, total, row)` is called as each item finishes."""
    items = list(items)
    report = report or (lambda done, total, row: None)
    if jobs <= 1 or len(items) <= 1:
        out = []
        for x in items:
            out.append(fn(x))
            report(len(out), len(items), out[-1])
        return out
    from concurrent.futures import ThreadPoolExecutor, as_completed

    with ThreadPoolExecutor(min(jobs, len(items))) as pool:
        futures = [pool.submit(fn, x) for x in items]
        for done, f in enumerate(as_completed(futures), 1):
            report(done, len(items), f.result())
        return [f.result() for f in futures]


def _reporter(run_id: str, stage: str, label: str) -> Callable[[int, int, dict], None]:
    def report(done: int, total: int, row: dict) -> None:
        item = row.get("layer", "") + (f" M1={row['m1']}" if row.get("m1") and stage != "emit" else "")
        progress.report(run_id, stage, label, done, total, item)

    return report


def _rows_by(table, cols: tuple[str, ...]) -> dict:
    return {tuple(r[c] for c in cols): r for r in table.to_pylist()}


def _verify_proxy(kernel, cl, tiles, info) -> str:
    """Run the proxy on the host under AddressSanitizer with a small N; 'asan-ok' or the error."""
    n, n1 = 37, 32  # two column blocks, the second partial
    try:
        run_on_host(kernel, {"B": np.zeros(info["k"] * n, np.float32), "C": np.empty(info["m"] * n, np.float32),
                             "N": n, "cluster_of": cl.cluster_of, "tile_rows": proxy_tile_rows(tiles)},
                    (len(cl.cluster_of), -(-n // n1), 1), n1, sanitize=True)
        return "asan-ok"
    except Exception as e:
        return f"failed: {e}"[:2000]


def _matrices(root: str, pruned: dict) -> dict:
    table = read_artifact(Path(root) / pruned["path"])
    return {table.column("layer")[i].as_py(): schemas.csr_from_row(table, i)
            for i in range(table.num_rows) if table.column("status")[i].as_py() == "ok"}


def _tiles_by_layer(root: str, reordered: dict) -> dict:
    table = read_artifact(Path(root) / reordered["path"])
    out: dict = {}
    for i in range(table.num_rows):
        if table.column("status")[i].as_py() != "ok":
            continue
        t = schemas.tiles_from_row(table, i)
        out.setdefault(table.column("layer")[i].as_py(), {})[t.m1] = t
    return out


def _kept_rows(root: str, candidates: dict) -> list[dict]:
    """The kept candidates (04) or the chosen ones (05, after rank), in (layer, M1, N1) order."""
    table = read_artifact(Path(root) / candidates["path"])
    return table.filter(table["chosen" if "chosen" in table.column_names else "kept"]).to_pylist()


def _kept_by_layer(root: str, candidates: dict) -> dict:
    """layer -> M1 -> kept candidate rows."""
    out: dict = {}
    for row in _kept_rows(root, candidates):
        out.setdefault(row["layer"], {}).setdefault(row["m1"], []).append(row)
    return out


def _prefixed(prefix: str, stats: TileStats) -> dict:
    return {f"{prefix}_{k}": v for k, v in vars(stats).items() if k != "num_tiles"}


def _run_stage(stage: str, key: str, root: str, label: str, force: bool, compute: Callable[[], list]) -> dict:
    path = artifact_path(root, stage, label, key)
    meta = None if force else valid_sidecar(path)
    if meta is not None:  # a finished artifact without a cache record (e.g. the run was killed)
        return _manifest(meta, root, path, reused=True)
    t0 = time.perf_counter()
    rows = compute()
    table = schemas.table_from_rows(rows, schemas.SCHEMAS[stage])
    problems = [{"layer": r["layer"], "status": r["status"], "message": r["message"]}
                for r in rows if r.get("status") not in ("ok", None)]
    # One problem row per layer (reorder/constrain repeat the layer's status on each of its rows).
    problems = list({p["layer"]: p for p in problems}.values())
    meta = {"stage": stage, "key": key, "label": label, "seconds": time.perf_counter() - t0,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "problems": problems}
    return _manifest(write_artifact(path, table, meta), root, path, reused=False)


def _manifest(meta: dict, root: str, path: Path, reused: bool) -> dict:
    return {"stage": meta["stage"], "key": meta["key"], "label": meta["label"],
            "path": str(path.relative_to(root)), "rows": meta["rows"], "seconds": meta["seconds"],
            "problems": meta.get("problems", []), "reused": reused}


# --- the flow ----------------------------------------------------------------------------------


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def _label(*parts: Any) -> str:
    return "-".join(str(p) for p in parts)


@flow(name="lospmm-pipeline")
def pipeline(config: dict, refresh: list[str] | None = None, run_id: str | None = None) -> dict:
    """Stages 1–10 (until `config['until']`) for every zoo model / weights file × sparsity.

    `refresh` names stages to recompute even when cached (their dependants follow by key only
    if their inputs' keys change, so callers pass the downstream stages too)."""
    cfg = validated(RunConfig.from_dict(config))
    run_id = run_id or new_run_id()
    root = Path(cfg.artifacts).resolve()
    root.mkdir(parents=True, exist_ok=True)
    refresh = set(refresh or ())
    stages = cfg.stages()
    timer = resolved_timer(cfg.timer)
    jobs = cfg.jobs or os.cpu_count() or 1  # compile/emit threads; not part of any artifact key
    ranker_version = ranker_metadata(cfg.ranker)["version"] if cfg.rank and "rank" in stages else "none"
    record = {"run_id": run_id, "config": cfg.as_dict(), "refresh": sorted(refresh), "status": "running",
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "entries": []}
    write_run_record(root, record)
    t_start = time.perf_counter()

    submitted: list[tuple[dict, Any]] = []

    def submit(task_, stage: str, label: str, where: dict, params: dict, inputs: list[str], **kwargs):
        key = artifact_key(stage, stage_version(stage), params, inputs)
        path = artifact_path(root, stage, label, key)
        force = stage in refresh
        use_cache = not force and valid_sidecar(path) is not None
        fut = task_.with_options(refresh_cache=not use_cache, result_storage=root / ".prefect-results").submit(
            key=key, root=str(root), label=label, force=force, **kwargs)
        submitted.append(({"stage": stage, "label": label, "key": key, **where}, fut))
        return key, fut

    for source in _sources(cfg):
        model = source["label"]
        # The file's content, not where it lies, identifies real weights.
        ex_params = {k: v for k, v in source.items() if k not in ("label", "path")}
        ex_key, ex = submit(extract_task, "extract", model, {"model": model}, ex_params, [], source=source)
        if "prune" not in stages:
            continue
        method = cfg.prune or ("magnitude" if source["kind"] == "weights" else "random")
        for s in cfg.sparsities:
            where = {"model": model, "sparsity": s}
            lab = _label(model, f"s{s:g}")
            pr_key, pr = submit(prune_task, "prune", lab, where,
                                {"sparsity": s, "method": method, "seed": cfg.seed},
                                [ex_key], shapes=ex, sparsity=s, method=method, seed=cfg.seed,
                                weights=source.get("path"))
            if "reorder" not in stages:
                continue
            m1s = sorted(set(cfg.m1s))
            ro_key, ro = submit(reorder_task, "reorder", lab, where, {"m1s": m1s}, [pr_key],
                                pruned=pr, m1s=m1s)
            if "constrain" not in stages:
                continue
            co_key, co = submit(constrain_task, "constrain", lab, where,
                                {"gpu": cfg.gpu, "th_row": cfg.th_row, "th_col": cfg.th_col}, [ro_key],
                                reordered=ro, gpu=cfg.gpu, th_row=cfg.th_row, th_col=cfg.th_col)
            if "rank" not in stages:
                continue
            rk_params = {"top_k": cfg.top_k, "rank": cfg.rank, "ranker": ranker_version}
            rk_key, rk = submit(rank_task, "rank", lab, where, rk_params, [co_key], candidates=co, top_k=cfg.top_k,
                                use_rank=cfg.rank, ranker=cfg.ranker)
            if "cluster" not in stages:
                continue
            cl_key, cl = submit(cluster_task, "cluster", lab, where, {"gpu": cfg.gpu}, [pr_key, ro_key, rk_key],
                                pruned=pr, reordered=ro, candidates=rk, gpu=cfg.gpu)
            if "pad" not in stages:
                continue
            pa_key, pa = submit(pad_task, "pad", lab, where, {"gpu": cfg.gpu}, [rk_key], candidates=rk, gpu=cfg.gpu)
            if "compile" not in stages:
                continue
            arch = device_named(cfg.gpu).arch
            cp_key, cp = submit(compile_task, "compile", lab, where, {"arch": arch, "verify": cfg.verify},
                                [cl_key, ro_key], clusters=cl, reordered=ro, arch=arch, verify=cfg.verify,
                                jobs=jobs, run_id=run_id)
            if "time" not in stages:
                continue
            ti_key, ti = submit(time_task, "time", lab, where, {"gpu": cfg.gpu, "timer": timer},
                                [pa_key, cp_key, cl_key, ro_key], launch=pa, compiled_=cp, clusters=cl,
                                reordered=ro, gpu=cfg.gpu, timer=timer, run_id=run_id)
            if "emit" not in stages:
                continue
            chosen_by = (f"top-1 proxy of the ranker's top-{cfg.top_k}" if cfg.rank
                         else "top-1 proxy of every kept candidate")
            submit(emit_task, "emit", lab, where, {"gpu": cfg.gpu, "timer": timer, "chosen_by": chosen_by,
                                                   "verify": True}, [ti_key, pr_key, ro_key],
                   timed=ti, pruned=pr, reordered=ro, gpu=cfg.gpu, timer=timer, chosen_by=chosen_by, verify=True,
                   jobs=jobs, run_id=run_id)

    _awaited(run_id, submitted)
    for entry, fut in submitted:
        state = fut.state
        entry["state"] = state.name
        if state.is_completed():
            m = fut.result()
            entry.update(path=m["path"], rows=m["rows"], seconds=m["seconds"], problems=m["problems"],
                         reused=m["reused"])
        else:
            entry["error"] = _state_message(state)
        record["entries"].append(entry)
    record.update(status="completed" if all(e["state"] in ("Completed", "Cached") for e in record["entries"])
                  else "failed", wall_seconds=time.perf_counter() - t_start,
                  finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    try:
        record["summary"] = write_summary(root, record)
    except Exception as e:  # the stages' artifacts stand on their own; say why the summary is missing
        record["summary_error"] = f"{type(e).__name__}: {e}"
    write_run_record(root, record)
    _publish_summary(root, record)
    return {k: record[k] for k in ("run_id", "status", "wall_seconds")} | {"artifacts": str(root)}


def _awaited(run_id: str, submitted: list[tuple[dict, Any]]) -> None:
    """Wait for every task, publishing progress (Prefect progress artifact and log) as they go."""
    progress.started(run_id, [(e["stage"], e["label"]) for e, _ in submitted])
    publisher = progress.Publisher(run_id, get_run_logger())
    pending = list(submitted)
    try:
        while pending:
            done = wait([f for _, f in pending], timeout=publisher.every_s).done
            for entry, f in [p for p in pending if p[1] in done]:
                progress.report(run_id, entry["stage"], entry["label"], 1, 1)  # cached tasks report nothing
            pending = [p for p in pending if p[1] not in done]
            publisher.push()
        wait([f for _, f in submitted])  # a timed wait may return a future before its final state is set
        publisher.push(final=True)
    finally:
        progress.finished(run_id)


def resolved_timer(timer: str) -> str:
    """"auto" -> "cuda" when a GPU is present, else "estimate"; "cuda" without a GPU is an error."""
    from lospmm.runtime import gpu_present

    if timer == "auto":
        return "cuda" if gpu_present() else "estimate"
    if timer == "cuda" and not gpu_present():
        raise ConfigError("--timer cuda: no CUDA device here (use --timer estimate, or auto)")
    return timer


def _sources(cfg: RunConfig) -> list[dict]:
    # Only the sizes a model uses enter its key: a CNN batch change leaves BERT cached.
    sizes = {"bert-base": {"batch": cfg.batch, "seq_len": cfg.seq_len}}
    cnn = {"cnn_batch": cfg.cnn_batch, "image_size": cfg.image_size}
    out = [{"kind": "zoo", "name": name, "label": name, "zoo": sizes.get(name, cnn)} for name in cfg.zoo]
    if cfg.weights:
        path = str(Path(cfg.weights).resolve())
        out.append({"kind": "weights", "name": weights_label(path), "label": weights_label(path),
                    "path": path, "sha256": file_sha256(Path(path)), "tokens": cfg.tokens})
    return out


def write_summary(root: Path, record: dict) -> str | None:
    """Per layer: candidates at each step, search seconds by stage, chosen tile and its time; written
    to summary/<run_id>.parquet and published as a Prefect table artifact. None if nothing ran."""
    from prefect.artifacts import create_table_artifact

    by = {}
    for e in record["entries"]:
        if e.get("path") and "sparsity" in e:
            # the scalar columns only: the CSR and tile payloads are not needed here
            cols = [c for c in schemas.SCHEMAS[e["stage"]].names if c not in schemas.LIST_COLUMNS]
            by.setdefault((e["model"], e["sparsity"]), {})[e["stage"]] = \
                read_artifact(root / e["path"], columns=cols).to_pylist()
    stages = ("prune", "reorder", "rank", "cluster", "compile", "time", "emit")
    rows = []
    for (model, sparsity), arts in by.items():
        seconds = {s_: Counter() for s_ in stages}
        for s_ in stages:
            col = "compile_seconds" if s_ == "compile" else "seconds"
            for r in arts.get(s_, []):
                v = r.get(col)
                if v is not None and np.isfinite(v):
                    seconds[s_][r["layer"]] += float(v)
        # rank rows repeat the layer's ranking time on each candidate: count it once
        seconds["rank"] = Counter({r["layer"]: r["seconds"] for r in arts.get("rank", [])})
        total = Counter(r["layer"] for r in arts.get("constrain", []))
        kept = Counter(r["layer"] for r in arts.get("constrain", []) if r["kept"])
        chosen = Counter(r["layer"] for r in arts.get("rank", []) if r["chosen"])
        timed = Counter(r["layer"] for r in arts.get("time", []) if r["status"] == "ok")
        emitted = {r["layer"]: r for r in arts.get("emit", [])}
        for lay in (r for r in arts.get("prune", []) if r["status"] == "ok"):
            name = lay["layer"]
            em = emitted.get(name, {})
            status = em.get("status") or ("no kept candidate" if not kept[name] and "constrain" in arts
                                          else "not emitted")
            row = {**_layer_fields(lay), "sparsity": sparsity, "status": status, "candidates": total[name],
                   "after_constrain": kept[name], "after_rank": chosen.get(name) if "rank" in arts else None,
                   "timed": timed.get(name) if "time" in arts else None, "m1": em.get("m1"), "n1": em.get("n1"),
                   "timer": em.get("timer"), "time_us": em.get("full_time_us"),
                   "speedup_vs_dense": em.get("speedup_vs_dense"), "kernel_dir": em.get("kernel_dir")}
            row.update({f"{s_}_seconds": seconds[s_].get(name) for s_ in stages})
            row["search_seconds"] = sum(row[f"{s_}_seconds"] or 0.0 for s_ in stages)
            rows.append(row)
    if not rows:
        return None
    path = root / "summary" / f"{record['run_id']}.parquet"
    write_artifact(path, schemas.table_from_rows(rows, schemas.SUMMARY),
                   {"stage": "summary", "key": record["run_id"], "label": record["run_id"], "seconds": 0.0})
    show = ("model", "layer", "sparsity", "status", "candidates", "after_constrain", "after_rank", "timed", "m1",
            "n1", "timer", "time_us", "speedup_vs_dense", *(f"{s_}_seconds" for s_ in stages), "search_seconds")
    create_table_artifact(table=[{k: r[k] for k in show} for r in rows], key="lospmm-layer-summary",
                          description=f"lospmm run {record['run_id']}: per layer (time_us from the "
                                      f"timer named in each row; 'estimate' rows are model estimates)")
    return str(path.relative_to(root))


def _state_message(state) -> str:
    try:
        state.result()
    except BaseException as e:  # the task's own exception, for the record
        return "".join(traceback.format_exception_only(type(e), e)).strip()
    return state.message or state.name


def _publish_summary(root: Path, record: dict) -> None:
    lines = [f"# lospmm run `{record['run_id']}` — {record['status']}", "",
             "| stage | model | sparsity | state | rows | seconds | artifact |", "|---|---|---|---|---|---|---|"]
    for e in record["entries"]:
        link = f"[{e.get('path', '-')}]({(root / e['path']).as_uri()})" if e.get("path") else e.get("error", "-")
        lines.append(f"| {e['stage']} | {e.get('model', '')} | {e.get('sparsity', '')} | {e['state']} | "
                     f"{e.get('rows', '')} | {e.get('seconds', 0):.2f} | {link} |")
    problems = {(p["layer"], p["message"]) for e in record["entries"] for p in e.get("problems", [])}
    if problems:
        lines += ["", "## Layers with problems", ""] + [f"- `{layer}`: {msg}" for layer, msg in sorted(problems)]
    create_markdown_artifact(markdown="\n".join(lines), key="lospmm-run-summary",
                             description=f"lospmm run {record['run_id']}")
