"""Adapter of stage 7, pad: 05_ranked (chosen rows) -> 07_launch, the proxy launch of each."""

from __future__ import annotations

from lospmm.flows.catalog.launch import SCHEMA
from lospmm.flows.execution.taskio import (RunContext, chosen_rows, failed_row, layer_fields, run_stage, stage_task,
                                           stoppable)
from lospmm.kernel.design import design_named
from lospmm.devices import Device
from lospmm.stages.pad import proxy_launch
from lospmm.status import Status


@stage_task("pad")
def pad(key: str, ctx: RunContext, label: str, inputs: dict, force: bool, device: Device) -> dict:
    def one(c: dict) -> dict:
        base = {**layer_fields(c, "sparsity", "m1", "n1", "design"), "gpu": device.name, "rank": c["rank"]}
        try:
            launch = proxy_launch(c["num_a_tiles"], c["n"], c["m1"], c["n1"], c["pred_regs"], device,
                                  design_named(c["design"]))
        except Exception as e:
            return failed_row(base, f"{c['layer']} ({c['m1']},{c['n1']}) {c['design']}", e)
        return {**base, "status": Status.OK, "message": "", "grid_x": launch.grid_x, "grid_y": launch.grid_y,
                "block": launch.block, "pred_regs": c["pred_regs"], "num_atb": launch.num_atb,
                "smem_bytes": launch.smem_bytes}

    return run_stage("pad", SCHEMA, key, ctx, label, force,
                     lambda: [one(c) for c in stoppable(chosen_rows(ctx, inputs["rank"]))], inputs)
