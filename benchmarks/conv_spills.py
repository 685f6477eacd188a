"""Spills of implicit-im2col conv kernels at the register prediction, and how many registers past it
each needed to spill nothing (NVRTC, sm_90, the run's ptxas level: no GPU needed). A row tries the
prediction, then each step of --extra above it, and stops at the first without a spill: where a
larger cap spills again ("+8: 8 B, +16: 80 B"), ptxas's scheduling, not the count of live values,
sets the spill, and no fixed term in kernel.registers predicts it.

    python -m benchmarks.conv_spills [--window 3 7 11] [--cin 3] [--designs chained,slices=2 ...]
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np
from rich.console import Console
from rich.table import Table

from lospmm.kernel.design import design_named
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.geometry import ConvGeometry
from lospmm.kernel.render import CodegenParams, kernel_source
from lospmm.stages.compile import compiled_kernel, kernel_options
from lospmm.stages.prune import random_pruned
from lospmm.stages.reorder import reordered_tiles


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--window", type=int, nargs="+", default=[3, 7, 11], help="square windows (kh = kw)")
    ap.add_argument("--cin", type=int, default=3, help="input channels (a first layer's 3)")
    ap.add_argument("--size", type=int, default=63, help="input height and width")
    ap.add_argument("--stride", type=int, default=4)
    ap.add_argument("--cout", type=int, default=64)
    ap.add_argument("--sparsity", type=float, nargs="+", default=[0.8, 0.9])
    ap.add_argument("--designs", nargs="+", default=["chained,v=2", "chained,slices=2", "chained,slices=4",
                                                     "chained,v=2,slices=2"])
    ap.add_argument("--m1", type=int, nargs="+", default=[4, 8, 16, 24])
    ap.add_argument("--extra", type=int, nargs="+", default=[8, 16, 24, 32], help="registers above the prediction")
    args = ap.parse_args()
    table = Table(title=f"conv kernels, {args.cout} output channels, {args.cin} input channels of "
                        f"{args.size}×{args.size}, stride {args.stride}, padded, sm_90: spill bytes a thread "
                        f"at the prediction and above it")
    for column in ("window", "sparsity", "design", "M1", "predicted", "spills (registers above: bytes)"):
        table.add_column(column)
    for window, sparsity, label, m1 in itertools.product(args.window, args.sparsity, args.designs, args.m1):
        geometry = ConvGeometry(cin=args.cin, h=args.size, w=args.size, kh=window, kw=window, stride=args.stride,
                                pad=window // 2)
        a = random_pruned(args.cout, geometry.k, sparsity, np.random.default_rng(0))
        design = design_named(label)
        design = design.conv_kernel or design
        kernel = kernel_source(a, reordered_tiles(a, m1), design.fixed_n1 or 64, CodegenParams(design=design),
                               Epilogue((0.5,) * args.cout, "relu"), geometry)
        cells, predicted = [], None
        for extra in (0, *args.extra):
            options = kernel_options("sm_90", m1, design=kernel.design, conv=True, extra_registers=extra)
            predicted = predicted or options.maxrregcount
            out = compiled_kernel(kernel, options)
            cells.append(f"+{extra}: {out.thread_spill_bytes} B" if out.status == "ok" else f"+{extra}: {out.status}")
            if out.status != "ok" or out.thread_spill_bytes == 0:
                break
        table.add_row(f"{window}×{window}", str(sparsity), label, str(m1), str(predicted), ", ".join(cells))
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
