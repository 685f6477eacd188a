"""Registers, spills and compile seconds of full kernels at ptxas -O1 vs -O3, uncapped and capped
at the §3.2 register prediction (NVRTC, sm_90, no GPU needed).

    python -m benchmarks.ptxas_level [--rows 128] [--m1 2 4 8 16 32 64 128]
"""

from __future__ import annotations

import argparse

import numpy as np
from rich.console import Console
from rich.table import Table

from lospmm.kernel.render import kernel_source as full_kernel_source
from lospmm.stages.compile import CompileOptions, compiled_kernel
from lospmm.stages.constrain import predicted_registers
from lospmm.stages.prune import random_pruned
from lospmm.stages.reorder import reordered_tiles


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--k", type=int, default=768)
    ap.add_argument("--sparsity", type=float, default=0.9)
    ap.add_argument("--m1", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--levels", type=int, nargs="+", default=[3, 1])
    args = ap.parse_args()
    a = random_pruned(args.rows, args.k, args.sparsity, np.random.default_rng(0))
    table = Table(title=f"{args.rows}×{args.k} at {args.sparsity}, nnz {a.nnz}, N1=128, sm_90: "
                        f"registers / spill bytes (stores) / compile s")
    table.add_column("M1")
    table.add_column("predicted")
    for lvl in args.levels:
        table.add_column(f"-O{lvl} uncapped")
        table.add_column(f"-O{lvl} cap=pred")
    for m1 in args.m1:
        k = full_kernel_source(a, reordered_tiles(a, m1), 128)
        pred = predicted_registers(m1)
        cells = []
        for lvl in args.levels:
            for cap in (None, pred):
                r = compiled_kernel(k, CompileOptions(maxrregcount=cap, ptxas_level=lvl, relocatable=True))
                cells.append(f"{r.registers} / {r.spill_stores} / {r.seconds:.1f}" if r.status == "ok" else r.status)
        table.add_row(str(m1), str(pred), *cells)
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
