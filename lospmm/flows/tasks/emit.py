"""Adapter of stage 10, emit: 09_timed, 02_pruned, 03_reordered -> 10_kernels, each layer's chosen
tile as a full kernel directory beside the artifact, compiled, checked and timed."""

from __future__ import annotations

import contextlib

from lospmm.flows.catalog.kernels import SCHEMA
from lospmm.flows.catalog.pruned import matrices
from lospmm.flows.catalog.reordered import tiles_by_layer
from lospmm.flows.inputs.sources import Source
from lospmm.flows.inputs.weights import planned_weights
from lospmm.flows.kernels import conv_geometry, emitted_layer, layer_epilogue
from lospmm.flows.storage.store import artifact_path
from lospmm.flows.execution.taskio import (RunContext, failed_row, grouped, in_parallel, is_transient, run_logger,
                                           run_stage, stage_task, stoppable)
from lospmm.flows.storage.schemas import LAYER_COLUMNS
from lospmm.flows.execution.units import run_compiler, waiting_on_units
from lospmm.kernel.design import KernelDesign
from lospmm.kernel.epilogue import Epilogue
from lospmm.stages.emit import EmitParams, kernel_form
from lospmm.stages.extract import layer_id
from lospmm.kernel.timing import Timer


@stage_task("emit")
def emit(key: str, ctx: RunContext, label: str, inputs: dict, force: bool, timer: Timer, arch: str,
         params: EmitParams, design: KernelDesign, source: Source) -> dict:
    def compute():
        a, tiles = matrices(ctx, inputs["prune"]), tiles_by_layer(ctx, inputs["reorder"])
        kernels_root = artifact_path(ctx.root, "emit", label, key).with_suffix("")
        logger = run_logger()
        shapes = ctx.read(inputs["extract"]).to_pylist()
        convs = {r["layer"]: conv_geometry(r) for r in shapes if kernel_form(r, params, design) == "implicit-conv"}
        epilogues = fused_epilogues([r for r in shapes if r.get("bias") or r.get("activation")], source)

        def one(item) -> dict:
            layer, group = item
            units = run_compiler(ctx, ctx.unit_reporter("emit", label, {"layer": layer}, len(layers)))
            epilogue = epilogues.get(layer, Epilogue())
            if isinstance(epilogue, Exception):  # a bias that cannot be read fails its layer's row, not the stage
                return failed_row({c: group[0][c] for c in LAYER_COLUMNS + ("sparsity",)}, layer, epilogue)
            return emitted_layer(ctx.root, kernels_root / layer_id(layer), group, a.get(layer),
                                 tiles.get(layer, {}), timer, arch, params, logger, units, convs.get(layer), design,
                                 epilogue)

        layers = list(grouped(ctx.read(inputs["time"]).to_pylist(), "layer").items())
        # GPU timing is serialised: concurrent launches would disturb each other's measurements.
        with waiting_on_units(ctx):
            return in_parallel(one, layers, 1 if timer.runs_binary else ctx.jobs, ctx.reporter("emit", label))

    return run_stage("emit", SCHEMA, key, ctx, label, force, compute, inputs)


def fused_epilogues(rows: list[dict], source: Source) -> dict:
    """layer -> what its kernel fuses (flows.kernels.layer_epilogue), or the error reading its bias
    gave; the biases read from the file the run planned with, opened once (WeightsChanged otherwise)."""
    out = {}
    with contextlib.ExitStack() as stack:
        weights = None
        if any(r.get("bias") for r in rows):
            weights = stack.enter_context(planned_weights(source.path, source.sha256))
        for r in stoppable(rows):
            try:
                out[r["layer"]] = layer_epilogue(r, weights)
            except Exception as e:
                if is_transient(e):
                    raise
                out[r["layer"]] = e
    return out

