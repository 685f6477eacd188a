"""Adapter of stage 10, emit: 09_timed, 02_pruned, 03_reordered -> 10_kernels, each layer's chosen
tile as a full kernel directory beside the artifact, compiled, checked and timed."""

from __future__ import annotations

from lospmm.flows.catalog.kernels import SCHEMA
from lospmm.flows.catalog.pruned import matrices
from lospmm.flows.catalog.reordered import tiles_by_layer
from lospmm.flows.kernels import conv_geometry, emitted_layer
from lospmm.flows.storage.store import artifact_path
from lospmm.flows.execution.taskio import RunContext, grouped, in_parallel, run_logger, run_stage, stage_task
from lospmm.flows.execution.units import run_compiler, waiting_on_units
from lospmm.stages.codegen import KernelDesign
from lospmm.stages.emit import EmitParams, kernel_form
from lospmm.stages.extract import layer_id
from lospmm.stages.timing import Timer


@stage_task("emit")
def emit(key: str, ctx: RunContext, label: str, inputs: dict, force: bool, timer: Timer, arch: str,
         params: EmitParams, design: KernelDesign) -> dict:
    def compute():
        a, tiles = matrices(ctx, inputs["prune"]), tiles_by_layer(ctx, inputs["reorder"])
        kernels_root = artifact_path(ctx.root, "emit", label, key).with_suffix("")
        logger = run_logger()
        convs = {r["layer"]: conv_geometry(r) for r in ctx.read(inputs["extract"]).to_pylist()
                 if kernel_form(r, params, design) == "implicit-conv"}

        def one(item) -> dict:
            layer, group = item
            units = run_compiler(ctx, ctx.unit_reporter("emit", label, {"layer": layer}, len(layers)))
            return emitted_layer(ctx.root, kernels_root / layer_id(layer), group, a.get(layer),
                                 tiles.get(layer, {}), timer, arch, params, logger, units, convs.get(layer), design)

        layers = list(grouped(ctx.read(inputs["time"]).to_pylist(), "layer").items())
        # GPU timing is serialised: concurrent launches would disturb each other's measurements.
        with waiting_on_units(ctx):
            return in_parallel(one, layers, 1 if timer.runs_binary else ctx.jobs, ctx.reporter("emit", label))

    return run_stage("emit", SCHEMA, key, ctx, label, force, compute, inputs)
