"""Adapter of stage 1, extract: a zoo model, a safetensors checkpoint (plain, or saved by lospmm.torch with
its layers' geometry) or an ONNX model -> 01_shapes."""

from __future__ import annotations

from lospmm.flows.catalog.shapes import SCHEMA, shape_row
from lospmm.flows.inputs.sources import Source
from lospmm.flows.execution.taskio import RunContext, run_stage, stage_task
from lospmm.flows.inputs.onnx_model import graph_weights, is_onnx
from lospmm.flows.inputs.weights import GRAPH_METADATA, graph_of, planned_weights
from lospmm.stages.extract import ModelConfig, graph_shapes, weight_shapes, zoo_shapes


@stage_task("extract")
def extract(key: str, ctx: RunContext, label: str, inputs: dict, force: bool, source: Source) -> dict:
    def compute():
        if source.kind == "zoo":
            shapes = zoo_shapes(source.name, source.zoo)
        else:  # the file the run planned with, read once (WeightsChanged fails the run otherwise)
            with planned_weights(source.path, source.sha256) as weights:
                if is_onnx(source.path):
                    shapes = graph_shapes(source.label, graph_weights(source.path, source.input_shapes), source.tokens,
                                          source.images)
                elif GRAPH_METADATA in weights.metadata():  # lospmm.torch.save_model: shapes from a forward pass
                    shapes = graph_shapes(source.label, graph_of(weights), source.tokens, 1)
                else:
                    shapes = weight_shapes(source.label, weights.infos(), source.tokens,
                                           source.model_config or ModelConfig(), source.sequences or None)
        return [shape_row(s, source.path or source.name, source.sha256) for s in shapes]

    return run_stage("extract", SCHEMA, key, ctx, label, force, compute, inputs)
