"""Adapter of stage 4, constrain: 03_reordered (scalar columns) -> 04_candidates."""

from __future__ import annotations

import pyarrow as pa

from lospmm.flows.schemas import BOOL, F64, I32, I64, LAYER, STATUS, STR
from lospmm.flows.taskio import RunContext, failed_row, grouped, layer_fields, run_stage, scalar_rows, stage_task
from lospmm.flows.tasks.reorder import SCHEMA as REORDERED
from lospmm.stages.codegen import KernelDesign
from lospmm.stages.constrain import UPSTREAM_ERROR, ConstrainParams, layer_candidates
from lospmm.stages.devices import Device
from lospmm.stages.reorder import TileStats
from lospmm.stages.status import Status

# 04_candidates (artifacts/README.md documents every column)
SCHEMA = pa.schema(
    LAYER + [("sparsity", F64), ("gpu", STR), ("arch", STR)]
    + [("m1", I32), ("n1", I32), ("num_a_tiles", I32), ("num_b_tiles", I32), ("block_num", I64),
       ("threads", I32), ("pred_regs", I32), ("block_regs", I64), ("cov_row", F64), ("waste_col", F64),
       ("nnc_sum", I64), ("nnz_max", I64), ("max_nnc", I64), ("kept", BOOL), ("removed_by", STR),
       ("fallback", BOOL)]
    + STATUS
)


@stage_task("constrain")
def constrain(key: str, ctx: RunContext, label: str, inputs: dict, force: bool, device: Device,
              params: ConstrainParams, design: KernelDesign) -> dict:
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
                                     design=design)
        except Exception as e:
            return [{**failed_row(base, layer, e), "kept": False, "removed_by": UPSTREAM_ERROR}]
        return [{**base, **vars(c), "kept": c.kept, "status": first["status"], "message": first["message"]}
                for c in cands]

    def compute():
        return [row for layer, group in grouped(scalar_rows(ctx, inputs["reorder"], REORDERED), "layer").items()
                for row in one(layer, group)]

    return run_stage("constrain", SCHEMA, key, ctx, label, force, compute, inputs)
