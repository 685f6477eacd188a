"""02_pruned: each layer's pruned A as CSR (prune); a row is the layer's A."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import scipy.sparse as sp

from lospmm.flows.storage.schemas import F32, F64, I32, I64, LAYER, STATUS, STR, list_values
from lospmm.status import Status

if TYPE_CHECKING:  # a reader takes the flow's context; the catalog itself needs no Prefect
    from lospmm.flows.execution.taskio import RunContext

# 02_pruned (artifacts/README.md documents every column)
SCHEMA = pa.schema(
    LAYER + [("sparsity_requested", F64), ("sparsity_achieved", F64), ("method", STR), ("nm", STR), ("nnz", I64),
              ("zeros_before", F64)]
    + STATUS
    + [("indptr", pa.list_(I32)), ("indices", pa.list_(I32)), ("data", pa.list_(F32)), ("seconds", F64)]
)
RECORD = sp.csr_matrix  # what a row stands for in the stages


def csr_from_row(table, i: int) -> sp.csr_matrix:
    """Row i of a 02_pruned table as the layer's A (CSR)."""
    m, k = table.column("m")[i].as_py(), table.column("k")[i].as_py()
    return sp.csr_matrix((list_values(table, "data", i), list_values(table, "indices", i),
                          list_values(table, "indptr", i)), shape=(m, k))


def matrices(ctx: RunContext, pruned: dict) -> dict:
    """layer -> its pruned A (CSR), for the layers that pruned ok."""
    table = ctx.read(pruned)
    return {table.column("layer")[i].as_py(): csr_from_row(table, i)
            for i in range(table.num_rows) if table.column("status")[i].as_py() == Status.OK}
