"""Static SASS statistics of the half-precision kernels (issue 23) beside the fp32 ones, on the same
pruned matrix and tile: instructions per useful multiply-add (nonzeros × columns per thread), B loads
per nonzero, registers and spills, read from the cubin NVRTC builds for sm_90 with nvdisasm (the
bench extra). No GPU: these are counts of the code, not times.

    python -m benchmarks.half_sass [--m 768] [--k 768] [--sparsity 0.9] [--m1 4] [--n1 64]
"""

from __future__ import annotations

import argparse


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", type=int, default=768)
    p.add_argument("--k", type=int, default=768)
    p.add_argument("--sparsity", type=float, default=0.9)
    p.add_argument("--m1", type=int, default=4)
    p.add_argument("--n1", type=int, default=64)
    args = p.parse_args(argv)
    import numpy as np

    from lospmm.kernel.sass import opcodes_by_function
    from lospmm.kernel.design import design_named, half_design
    from lospmm.kernel.numbers import NumberFormat, rounded_matrix
    from lospmm.kernel.render import CodegenParams, kernel_source
    from lospmm.stages.compile import compiled_kernel, kernel_options
    from lospmm.stages.prune import random_pruned
    from lospmm.stages.reorder import reordered_tiles

    a0 = random_pruned(args.m, args.k, args.sparsity, np.random.default_rng(2))
    rows = []

    def row(label, kernel, nnz, columns, options):
        c = compiled_kernel(kernel, options)
        ops = [o for f in opcodes_by_function(c.cubin).values() for o in f]
        rows.append({"kernel": label, "instructions_per_useful_fma": len(ops) / (nnz * columns),
                     "loads_per_nonzero": ops.count("LDG") / nnz, "registers": c.registers,
                     "spill_bytes": c.thread_spill_bytes})

    for design in ("baseline", "chained,v=2"):
        d = design_named(design)
        row(f"fp32 {design}", kernel_source(a0, reordered_tiles(a0, args.m1), args.n1, CodegenParams(design=d)),
            a0.nnz, d.columns_per_thread, kernel_options("sm_90", args.m1, design=d))
    half = NumberFormat.half
    for precision in (half("fp16"), half("fp16", "f32"), half("fp16", "packed", 8), half("bf16"), half("bf16", "f32")):
        a, _ = rounded_matrix(a0, precision.dtype)
        for loads in ("based", "chained"):
            kernel = kernel_source(a, reordered_tiles(a, args.m1), args.n1,
                                   CodegenParams(design=half_design(precision, design_named(loads))))
            row(f"{precision.label} {loads}", kernel, a.nnz, 2, kernel_options("sm_90", args.m1))
    print(f"{args.m}×{args.k} at sparsity {args.sparsity}, tile ({args.m1}, {args.n1}), sm_90 (static counts)")
    print(f"{'kernel':32} {'instr/useful FMA':>17} {'LDG/nnz':>8} {'regs':>5} {'spill B':>8}")
    for r in rows:
        print(f"{r['kernel']:32} {r['instructions_per_useful_fma']:17.2f} {r['loads_per_nonzero']:8.2f} "
              f"{r['registers']:5d} {r['spill_bytes']:8d}")
    return rows


if __name__ == "__main__":
    main()
