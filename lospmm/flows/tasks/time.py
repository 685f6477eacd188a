"""Adapter of stage 9, time: 07_launch, 08_compiled, 06_clusters -> 09_timed, each chosen
candidate's proxy timed by the run's Timer, one at a time."""

from __future__ import annotations

import time as clock

from lospmm.flows.catalog.clusters import clusters_from_row
from lospmm.flows.catalog.timed import SCHEMA, timing_row
from lospmm.flows.execution.taskio import RunContext, in_parallel, layer_fields, run_stage, stage_task
from lospmm.kernel.design import design_named
from lospmm.kernel.timing import Timer
from lospmm.status import Status
from lospmm.stages.time import proxy_under_test, untimed_reason


@stage_task("time")
def time(key: str, ctx: RunContext, label: str, inputs: dict, force: bool, timer: Timer) -> dict:
    def compute():
        compiled = {(r["layer"], r["m1"], r["design"]): r for r in ctx.read(inputs["compile"]).to_pylist()}
        clusters = ctx.read(inputs["cluster"])
        cluster_row = {tuple(clusters.column(c)[i].as_py() for c in ("layer", "m1", "design")): i
                       for i in range(clusters.num_rows) if clusters.column("status")[i].as_py() == Status.OK}

        def one(c: dict) -> dict:
            base = {**layer_fields(c, "sparsity", "m1", "n1", "design"), "kind": "proxy", "timer": timer.name}
            where, at = f"{c['layer']} ({c['m1']},{c['n1']}) {c['design']}", (c["layer"], c["m1"], c["design"])
            p = compiled.get(at)
            why = untimed_reason(c, p, at in cluster_row)
            if why:
                return {**base, "status": Status.SKIPPED, "message": f"{where}: {why}", "time_us": float("inf")}
            t0 = clock.perf_counter()
            launch = proxy_under_test(c, p, clusters_from_row(clusters, cluster_row[at]), design_named(c["design"]),
                                      ctx.path({"path": p["cubin_path"]}).read_bytes() if timer.runs_binary else None)
            t = timer.time(launch)
            return {**base, **timing_row(t), "message": f"{where}: {t.message}" if t.message else "",
                    "registers": p["registers"], "spill_bytes": launch.spill_bytes, "smem_bytes": launch.smem_bytes,
                    "rank": c.get("rank"), "seconds": clock.perf_counter() - t0}

        # one at a time: concurrent launches would disturb each other's measurements
        return in_parallel(one, ctx.read(inputs["pad"]).to_pylist(), 1, ctx.reporter("time", label))

    return run_stage("time", SCHEMA, key, ctx, label, force, compute, inputs)
