"""Adapter of stage 8, compile: 06_clusters -> 08_compiled, one proxy per layer, chosen M1 and design,
through the content-addressed compile cache, on `jobs` threads."""

from __future__ import annotations

from lospmm.flows.catalog.clusters import clusters_from_row
from lospmm.flows.catalog.compiled import SCHEMA, compile_row
from lospmm.flows.storage.compile_cache import cached_kernel, compile_summary
from lospmm.flows.storage.schemas import LAYER_COLUMNS
from lospmm.flows.execution.taskio import RunContext, failed_row, in_parallel, layer_fields, run_logger, run_stage, stage_task
from lospmm.flows.execution.units import run_compiler, waiting_on_units
from lospmm.kernel.design import design_named
from lospmm.kernel.host import proxy_check
from lospmm.kernel.render import CodegenParams, proxy_source
from lospmm.stages.compile import ProxyCheck, kernel_options
from lospmm.stages.pad import proxy_dynamic_shared
from lospmm.status import Status


@stage_task("compile")
def compile(key: str, ctx: RunContext, label: str, inputs: dict, force: bool, arch: str, verify: bool,
             check: ProxyCheck) -> dict:
    def compute():
        table = ctx.read(inputs["cluster"])
        logger = run_logger()  # fetched here: pool threads do not carry Prefect's run context

        def one(i: int) -> dict:
            info = {c: table.column(c)[i].as_py() for c in LAYER_COLUMNS + ("sparsity", "m1", "design", "status",
                                                                                   "message")}
            base = {**layer_fields(info, "sparsity", "m1", "design"), "kind": "proxy"}
            where = f"{info['layer']} M1={info['m1']} ({info['design']})"
            if info["status"] != Status.OK:
                return {**base, "status": info["status"], "message": info["message"]}
            try:
                design = design_named(info["design"] or "baseline")
                cl = clusters_from_row(table, i)
                kernel = proxy_source(info["m"], info["k"], cl, CodegenParams(design=design))
                options = kernel_options(arch, info["m1"], design=design)
                result, hit = cached_kernel(ctx.root, kernel, options,
                                             run_compiler(ctx, ctx.unit_reporter("compile", label, info, table.num_rows)))
                logger.info("compiled proxy %s (%d of %d): %s, %d registers, %d B spilled", where, i + 1,
                            table.num_rows, compile_summary(result, hit), result["registers"], result["spill_stores"])
                ok = result["status"] == Status.OK
                # a design whose tiles have their own N1 (a staged one's) is checked at it
                n1 = design.fixed_n1 or check.n1
                verified = (proxy_check(kernel, cl.cluster_of, check.n, n1, proxy_dynamic_shared(0, cl, design, n1))
                            if verify and ok else "not run")
                return {**base, **compile_row(result, hit), "status": result["status"],
                        "message": "" if ok else f"{where}: NVRTC failed", "kernel": kernel.name,
                        "source_sha256": kernel.sha256, "arch": arch, "maxrregcount": options.maxrregcount,
                        "source_bytes": len(kernel.source), "verified": verified}
            except Exception as e:
                return failed_row(base, where, e)

        with waiting_on_units(ctx):
            return in_parallel(one, range(table.num_rows), ctx.jobs, ctx.reporter("compile", label))

    return run_stage("compile", SCHEMA, key, ctx, label, force, compute, inputs)
