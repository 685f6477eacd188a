"""Adapter of stage 10, emit: 09_timed, 02_pruned, 03_reordered -> 10_kernels, each layer's chosen
tile as a full kernel directory beside the artifact, compiled, checked and timed."""

from __future__ import annotations

import time

from lospmm.flows.kernels import emitted_kernel
from lospmm.flows.store import artifact_path
from lospmm.flows.tasks.prune import matrices
from lospmm.flows.tasks.reorder import tiles_by_layer
from lospmm.flows.taskio import (RunContext, failed_row, grouped, in_parallel, layer_fields, run_logger, run_stage,
                                 stage_task)
from lospmm.stages.emit import EmitParams, check_verdict, fastest_proxy, speedup
from lospmm.stages.extract import sanitized_name
from lospmm.stages.status import Status
from lospmm.stages.timing import LaunchUnderTest, Timer


@stage_task("emit")
def emit(key: str, ctx: RunContext, label: str, inputs: dict, force: bool, timer: Timer, arch: str,
         params: EmitParams) -> dict:
    def compute():
        a, tiles = matrices(ctx, inputs["prune"]), tiles_by_layer(ctx, inputs["reorder"])
        kernels_root = artifact_path(ctx.root, "emit", label, key).with_suffix("")
        logger = run_logger()

        def one(item) -> dict:
            layer, group = item
            best = fastest_proxy(group)
            ok = sum(1 for r in group if r["status"] == Status.OK and r["time_us"] < float("inf"))
            base = {**layer_fields(group[0], "sparsity"), "timer": timer.name, "chosen_by": params.chosen_by,
                    "candidates_timed": ok}
            if best is None:
                return {**base, "status": Status.ERROR, "message": f"{layer}: no candidate could be timed ("
                        + "; ".join(sorted({r["message"] for r in group if r["message"]}))[:500] + ")"}
            m1, n1, t0 = best["m1"], best["n1"], time.perf_counter()
            try:
                launch = LaunchUnderTest(tiles[layer][m1], best["m"], best["k"], best["n"], n1, 0)

                def measured(facts: dict, cubin: bytes) -> dict:
                    comp = facts["compile"]
                    full = LaunchUnderTest(launch.tiles, launch.m, launch.k, launch.n, n1, comp["registers"],
                                           comp["spill_stores"] + comp["spill_loads"], kernel=facts["kernel"],
                                           grid_x=facts["grid"]["x"], cubin=cubin)
                    device_error = timer.device_error(full, a[layer], params.device_check_n)
                    hc = facts.get("host_check")
                    error = device_error if device_error is not None else \
                        (hc.get("max_rel_error", float("inf")) if hc else float("nan"))
                    check = ("not run" if device_error is None and not hc else
                             check_verdict("device" if device_error is not None else "host", error, params))
                    full_us = timer.time(full).time_us
                    dense_us = timer.dense(full.m, full.k, full.n).time_us
                    return {"full_time_us": full_us, "dense_time_us": dense_us,
                            "speedup_vs_dense": speedup(dense_us, full_us, timer.measures), "check": check,
                            "max_rel_error": error}

                out = kernels_root / sanitized_name(layer)
                facts = emitted_kernel(ctx.root, a[layer], tiles[layer][m1], layer, best["sparsity"], n1, arch, out,
                                       compile_=True, verify=params.verify and not timer.runs_binary,
                                       extra={"chosen_by": params.chosen_by, "timer": timer.name,
                                              "gpu": timer.device.name, "proxy_time_us": best["time_us"],
                                              "candidates_timed": ok}, measured=measured)
                comp, check = facts["compile"], facts.get("check", "not run")
                failed = comp["status"] != Status.OK or "FAILED" in check
                logger.info("emitted %s tile (%d,%d): compile %s in %.1f s, %s check, %s %.2f us, %.1f s in all",
                            layer, m1, n1, comp["status"], comp.get("seconds") or 0.0, check, timer.name,
                            facts.get("full_time_us", float("nan")), time.perf_counter() - t0)
                return {**base, "status": Status.ERROR if failed else Status.OK,
                        "message": f"{layer} ({m1},{n1}): " + (comp.get("log", "")[-300:] or check) if failed else "",
                        "m1": m1, "n1": n1, "proxy_time_us": best["time_us"],
                        "full_time_us": facts.get("full_time_us", float("nan")),
                        "dense_time_us": facts.get("dense_time_us", float("nan")),
                        "speedup_vs_dense": facts.get("speedup_vs_dense"), "kernel": facts["kernel"],
                        "kernel_dir": str(out.relative_to(ctx.root)), "registers": comp.get("registers"),
                        "spill_bytes": comp.get("spill_stores", 0) + comp.get("spill_loads", 0),
                        "compile_seconds": comp.get("seconds"), "check": check,
                        "max_rel_error": facts.get("max_rel_error", float("nan")),
                        "seconds": time.perf_counter() - t0}
            except Exception as e:
                return failed_row(base, layer, e)

        layers = list(grouped(ctx.read(inputs["time"]).to_pylist(), "layer").items())
        # GPU timing is serialised: concurrent launches would disturb each other's measurements.
        return in_parallel(one, layers, 1 if timer.runs_binary else ctx.jobs, ctx.reporter("emit", label))

    return run_stage("emit", key, ctx, label, force, compute)
