"""Adapter of stage 4, constrain: 03_reordered (scalar columns) -> 04_candidates, every (M1, N1) in
each design the layer's search spans (stages.constrain.searched_designs)."""

from __future__ import annotations

from lospmm.flows.catalog.candidates import SCHEMA
from lospmm.flows.catalog.reordered import SCHEMA as REORDERED
from lospmm.flows.execution.taskio import (RunContext, failed_row, grouped, layer_fields, run_stage, scalar_rows,
                                           stage_task, stoppable)
from lospmm.kernel.design import KernelDesign
from lospmm.stages.constrain import UPSTREAM_ERROR, ConstrainParams, layer_candidates, searched_designs
from lospmm.devices import Device
from lospmm.stages.reorder import TileStats
from lospmm.status import Status


@stage_task("constrain")
def constrain(key: str, ctx: RunContext, label: str, inputs: dict, force: bool, device: Device,
              params: ConstrainParams, designs: tuple[KernelDesign, ...], implicit_conv: bool) -> dict:
    def one(layer: str, group: list[dict]) -> list[dict]:
        first = group[0]
        base = {**layer_fields(first, "sparsity"), "gpu": device.name, "arch": device.arch}
        if first["status"] == Status.ERROR:
            return [{**base, "kept": False, "removed_by": UPSTREAM_ERROR, "status": Status.ERROR,
                     "message": first["message"]}]
        stats = {r["m1"]: TileStats(r["num_tiles"], r["reordered_max_nnc"], r["reordered_mean_nnc"],
                                    r["reordered_nnc_sum"], r["reordered_max_nnz"], r["reordered_cov_nnz"])
                 for r in group if r["status"] == Status.OK}
        try:
            cands = layer_candidates(first["n"], stats, device, params, empty=first["status"] == Status.EMPTY,
                                     designs=searched_designs(designs, first["op"], implicit_conv),
                                     conv=first["op"] == "conv" and implicit_conv)
        except Exception as e:
            return [{**failed_row(base, layer, e), "kept": False, "removed_by": UPSTREAM_ERROR}]
        return [{**base, **vars(c), "kept": c.kept, "status": first["status"], "message": first["message"]}
                for c in cands]

    def compute():
        return [row for layer, group in stoppable(grouped(scalar_rows(ctx, inputs["reorder"], REORDERED),
                                                          "layer").items())
                for row in one(layer, group)]

    return run_stage("constrain", SCHEMA, key, ctx, label, force, compute, inputs)
