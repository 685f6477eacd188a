"""03_reordered: each layer's A_tiles per M1 (reorder: the kept order and every candidate's figures);
a row is a stages.reorder.Tiles and its Reordering's candidates."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from lospmm.flows.storage.schemas import BOOL, F64, I32, I64, LAYER, STATUS, STR, list_values
from lospmm.stages.reorder import Reordering, Tiles, TileStats
from lospmm.status import Status

if TYPE_CHECKING:  # a reader takes the flow's context; the catalog itself needs no Prefect
    from lospmm.flows.execution.taskio import RunContext

# 03_reordered (artifacts/README.md documents every column)
_GROUPING_STATS = ["max_nnc", "mean_nnc", "nnc_sum", "max_nnz", "cov_nnz"]
# per candidate order (identity, algorithm1, partition, refine): a stages.reorder.OrderCandidate
_CANDIDATE_COLUMNS = [("strategy", STR), ("nnc_sum", I64), ("max_nnc", I64), ("cov_nnz", F64), ("estimate_us", F64),
                      ("seconds", F64), ("chosen", BOOL), ("note", STR)]
SCHEMA = pa.schema(
    LAYER + [("sparsity", F64), ("nnz", I64), ("m1", I32)] + STATUS
    + [("num_tiles", I32), ("num_empty_rows", I32), ("empty_rows", pa.list_(I32)), ("rows", pa.list_(I32)),
       ("tile_ptr", pa.list_(I32)), ("tile_nnz", pa.list_(I32)), ("tile_nnc", pa.list_(I32))]
    + [(f"{g}_{s}", F64 if s in ("mean_nnc", "cov_nnz") else I64)
       for g in ("identity", "reordered") for s in _GROUPING_STATS]
    + [("order", STR)]
    + [(f"order_{c}", pa.list_(t)) for c, t in _CANDIDATE_COLUMNS]
    + [("seconds", F64)]
)
RECORD = Tiles  # what a row stands for in the stages


def tiles_row(tiles: Tiles) -> dict:
    """A reorder.Tiles as 03_reordered's columns."""
    return {"m1": tiles.m1, "num_tiles": tiles.num_tiles, "num_empty_rows": len(tiles.empty_rows),
            "empty_rows": tiles.empty_rows, "rows": tiles.rows, "tile_ptr": tiles.tile_ptr,
            "tile_nnz": tiles.tile_nnz, "tile_nnc": tiles.tile_nnc}


def reordering_row(reordering: Reordering) -> dict:
    """The kept order (a tiles_row) and every candidate order's figures as 03_reordered's columns."""
    return {**tiles_row(reordering.tiles), "order": reordering.strategy,
            **{f"order_{c}": [getattr(cand, c) for cand in reordering.candidates] for c, _ in _CANDIDATE_COLUMNS}}


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
