"""Instruction efficiency of emitted full kernels, read from the cubin's SASS (nvdisasm):
FFMA per nonzero (per output column a thread computes), global loads per non-empty tile column,
and spills. The ideal is 1, 1, 0.

    python benchmarks/sass_efficiency.py [--sparsity 0.9] [--m1 8 16 32]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from lospmm.stages.codegen import full_kernel_source
from lospmm.stages.compile import CompileOptions, compiled
from lospmm.stages.constrain import predicted_registers
from lospmm.stages.prune import random_pruned
from lospmm.stages.reorder import reordered_tiles


def nvdisasm() -> str:
    found = shutil.which("nvdisasm")
    if found:
        return found
    import nvidia  # pip nvidia-cuda-nvdisasm installs nvidia/cu13/bin/nvdisasm

    for base in nvidia.__path__:
        for p in Path(base).glob("*/bin/nvdisasm"):
            return str(p)
    raise SystemExit("nvdisasm not found: pip install nvidia-cuda-nvdisasm")


def sass_counts(cubin: bytes) -> dict[str, int]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout
    ops = re.findall(r"^\s+(?:/\*[0-9a-f]+\*/\s+)?(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass, flags=re.M)
    base = [o.split(".")[0] for o in ops]
    return {"FFMA": base.count("FFMA"), "LDG": base.count("LDG"), "STG": base.count("STG"),
            "LDL": base.count("LDL"), "STL": base.count("STL"), "total": len(base)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sparsity", type=float, default=0.9)
    ap.add_argument("--m1", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--k", type=int, default=768)
    ap.add_argument("--cap", choices=["prediction", "none"], default="prediction")
    args = ap.parse_args()
    table = Table(title=f"SASS of full kernels, {args.rows}×{args.k} at sparsity {args.sparsity}, sm_90, "
                        f"--maxrregcount={args.cap}")
    for c in ("M1", "nnz", "non-empty tile cols", "FFMA", "FFMA/nnz", "LDG", "LDG/col", "STG", "LDL+STL (spill)",
              "regs", "spill bytes", "instructions"):
        table.add_column(c)
    a = random_pruned(args.rows, args.k, args.sparsity, np.random.default_rng(0))
    for m1 in args.m1:
        tiles = reordered_tiles(a, m1)
        k = full_kernel_source(a, tiles, 128)
        cap = predicted_registers(m1) if args.cap == "prediction" else None
        out = compiled(k.source, k.name, CompileOptions(arch="sm_90", maxrregcount=cap))
        c = sass_counts(out.cubin)
        cols = int(tiles.tile_nnc.sum())
        table.add_row(str(m1), str(a.nnz), str(cols), str(c["FFMA"]), f"{c['FFMA'] / a.nnz:.3f}", str(c["LDG"]),
                      f"{c['LDG'] / cols:.3f}", str(c["STG"]), str(c["LDL"] + c["STL"]), str(out.registers),
                      str(out.spill_stores), str(c["total"]))
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
