"""Adapter of stage 3, reorder: 02_pruned -> 03_reordered (one row per layer and M1)."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from lospmm.flows.schemas import F64, I32, I64, LAYER, LAYER_COLUMNS, STATUS, list_values
from lospmm.flows.taskio import RunContext, failed_row, layer_fields, run_stage, stage_task
from lospmm.flows.tasks.prune import csr_from_row
from lospmm.stages.reorder import (ReorderParams, Tiles, TileStats, distinct_m1s, identity_tiles, reordered_tiles,
                                   tile_stats)
from lospmm.stages.status import Status

# 03_reordered (artifacts/README.md documents every column)
_GROUPING_STATS = ["max_nnc", "mean_nnc", "nnc_sum", "max_nnz", "cov_nnz"]
SCHEMA = pa.schema(
    LAYER + [("sparsity", F64), ("nnz", I64), ("m1", I32)] + STATUS
    + [("num_tiles", I32), ("num_empty_rows", I32), ("empty_rows", pa.list_(I32)), ("rows", pa.list_(I32)),
       ("tile_ptr", pa.list_(I32)), ("tile_nnz", pa.list_(I32)), ("tile_nnc", pa.list_(I32))]
    + [(f"{g}_{s}", F64 if s in ("mean_nnc", "cov_nnz") else I64)
       for g in ("identity", "reordered") for s in _GROUPING_STATS]
    + [("seconds", F64)]
)


@stage_task("reorder")
def reorder(key: str, ctx: RunContext, label: str, inputs: dict, force: bool, m1s: tuple[int, ...],
            params: ReorderParams) -> dict:
    def compute():
        table = ctx.read(inputs["prune"])
        rows = []
        for i, info in enumerate(table.select(list(LAYER_COLUMNS) + ["nnz", "status", "message",
                                                                              "sparsity_requested"]).to_pylist()):
            base = {**layer_fields(info, "nnz"), "sparsity": info["sparsity_requested"], "m1": 0}
            if info["status"] != Status.OK:
                rows.append({**base, "status": info["status"], "message": info["message"]})
                continue
            try:
                matrix = csr_from_row(table, i)
                for m1 in distinct_m1s(matrix, m1s):
                    t0 = time.perf_counter()
                    tiles = reordered_tiles(matrix, m1, params)
                    rows.append({**base, **tiles_row(tiles), "status": Status.OK, "message": "",
                                 **prefixed("identity", tile_stats(identity_tiles(matrix, m1))),
                                 **prefixed("reordered", tile_stats(tiles)),
                                 "seconds": time.perf_counter() - t0})
            except Exception as e:
                rows.append(failed_row(base, info["layer"], e))
        return rows

    return run_stage("reorder", SCHEMA, key, ctx, label, force, compute, inputs)


def tiles_row(tiles: Tiles) -> dict:
    """A reorder.Tiles as 03_reordered's columns."""
    return {"m1": tiles.m1, "num_tiles": tiles.num_tiles, "num_empty_rows": len(tiles.empty_rows),
            "empty_rows": tiles.empty_rows, "rows": tiles.rows, "tile_ptr": tiles.tile_ptr,
            "tile_nnz": tiles.tile_nnz, "tile_nnc": tiles.tile_nnc}


def prefixed(prefix: str, stats: TileStats) -> dict:
    """TileStats as 03_reordered's `<prefix>_<stat>` columns."""
    return {f"{prefix}_{k}": v for k, v in vars(stats).items() if k != "num_tiles"}


def tiles_from_row(table, i: int) -> Tiles:
    """Row i of a 03_reordered table as the reorder stage's Tiles."""
    lv = lambda c: list_values(table, c, i).astype(np.int32)  # noqa: E731
    return Tiles(table.column("m1")[i].as_py(), lv("rows"), lv("tile_ptr"), lv("tile_nnz"), lv("tile_nnc"),
                 lv("empty_rows"))


def tiles_by_layer(ctx: RunContext, reordered: dict) -> dict:
    """layer -> M1 -> reorder.Tiles."""
    table = ctx.read(reordered)
    out: dict = {}
    for i in range(table.num_rows):
        if table.column("status")[i].as_py() == Status.OK:
            t = tiles_from_row(table, i)
            out.setdefault(table.column("layer")[i].as_py(), {})[t.m1] = t
    return out
