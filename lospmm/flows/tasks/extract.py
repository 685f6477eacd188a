"""Adapter of stage 1, extract: a zoo model, a safetensors checkpoint (plain, or saved by lospmm.torch with
its layers' geometry) or an ONNX model -> 01_shapes."""

from __future__ import annotations

from lospmm.flows.catalog.shapes import SCHEMA, shape_row
from lospmm.flows.inputs.sources import Source
from lospmm.flows.execution.taskio import RunContext, run_stage, stage_task
from lospmm.flows.inputs.layers import source_shapes
from lospmm.flows.inputs.weights import planned_weights
from lospmm.stages.extract import zoo_shapes


@stage_task("extract")
def extract(key: str, ctx: RunContext, label: str, inputs: dict, force: bool, source: Source) -> dict:
    def compute():
        if source.kind == "zoo":
            shapes = zoo_shapes(source.name, source.zoo)
        else:  # the file the run planned with, read once (WeightsChanged fails the run otherwise)
            with planned_weights(source.path, source.sha256) as weights:
                shapes = source_shapes(source, weights)
        return [shape_row(s, source.path or source.name, source.sha256) for s in shapes]

    return run_stage("extract", SCHEMA, key, ctx, label, force, compute, inputs)
