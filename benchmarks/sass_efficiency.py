"""Instruction efficiency of emitted full kernels, read from the linked cubin's SASS (nvdisasm):
FFMA per nonzero (per output column a thread computes), global loads per non-empty tile column,
spills, and the call overhead per tile: the entry's instructions (dispatch and call) per tile plus
each tile function's instructions that are neither FFMA, LDG, STG, spill nor address arithmetic.
The ideal is 1, 1, 0.

    python -m benchmarks.sass_efficiency [--sparsity 0.9] [--m1 8 16 32]
    python -m benchmarks.sass_efficiency --calibrate   # spills at the prediction over 30 layer × M1 cases
    python -m benchmarks.sass_efficiency --conv        # implicit-im2col conv kernels against the GEMM kernels
    python -m benchmarks.sass_efficiency --nm          # the N:M kernels' chunk loop: instructions a stage
"""

from __future__ import annotations

import argparse

import numpy as np
from rich.console import Console
from rich.table import Table

from lospmm.kernel.sass import sass_counts
from lospmm.kernel.render import kernel_source as full_kernel_source
from lospmm.stages.compile import CompileOptions, compiled_kernel
from lospmm.stages.constrain import predicted_registers
from lospmm.stages.prune import random_pruned
from lospmm.stages.reorder import reordered_tiles


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sparsity", type=float, default=0.9)
    ap.add_argument("--m1", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--k", type=int, default=768)
    ap.add_argument("--cap", choices=["prediction", "none"], default="prediction")
    ap.add_argument("--calibrate", action="store_true",
                    help="spill bytes of every tile function at the prediction, over sparsities "
                         "0.5/0.7/0.9, two layers each")
    ap.add_argument("--conv", action="store_true",
                    help="ResNet-50 conv1 and layer1.0.conv2 at --sparsity: implicit-im2col conv kernel vs GEMM kernel")
    ap.add_argument("--nm", action="store_true",
                    help="the N:M kernels' (CUDA cores, fp32 and fp16; sparse tensor cores) instructions per chunk of K")
    args = ap.parse_args()
    if args.nm:
        return nm_loops()
    if args.conv:
        return conv_cost(args.sparsity, args.m1 if args.m1 != [8, 16, 32] else [1, 8, 16, 32])
    if args.calibrate:
        return calibrate(args.rows, args.k, args.m1 if args.m1 != [8, 16, 32] else [8, 12, 16, 24, 32])
    table = Table(title=f"SASS of full kernels, {args.rows}×{args.k} at sparsity {args.sparsity}, sm_90, "
                        f"--maxrregcount={args.cap}")
    for c in ("M1", "nnz", "non-empty tile cols", "FFMA", "FFMA/nnz", "LDG", "LDG/col", "STG", "LDL+STL (spill)",
              "regs", "spill bytes", "call overhead/tile", "instructions"):
        table.add_column(c)
    a = random_pruned(args.rows, args.k, args.sparsity, np.random.default_rng(0))
    for m1 in args.m1:
        tiles = reordered_tiles(a, m1)
        k = full_kernel_source(a, tiles, 128)
        cap = predicted_registers(m1) if args.cap == "prediction" else None
        out = compiled_kernel(k, CompileOptions(arch="sm_90", maxrregcount=cap, relocatable=True))
        c = sass_counts(out.cubin, k.name)
        cols = int(tiles.tile_nnc.sum())
        table.add_row(str(m1), str(a.nnz), str(cols), str(c["FFMA"]), f"{c['FFMA'] / a.nnz:.3f}", str(c["LDG"]),
                      f"{c['LDG'] / cols:.3f}", str(c["STG"]), str(c["LDL"] + c["STL"]), str(out.registers),
                      str(out.spill_stores + out.spill_loads),
                      f"{(c['entry'] + c['tile_other']) / tiles.num_tiles:.1f}", str(c["total"]))
    Console(width=160).print(table)


def calibrate(rows: int, k: int, m1s: list[int]) -> None:
    """Largest spill (stores + loads, bytes) of any tile function at the register prediction, per
    layer and M1 (the call into a tile function must cost no register the prediction lacks)."""
    table = Table(title=f"Spill bytes per tile function at the §3.2 prediction, {rows}×{k}, sm_90, ptxas -O1")
    for c in ("sparsity", "layer seed", "M1", "cap (prediction)", "linked registers", "spill bytes (worst function)"):
        table.add_column(c)
    for sparsity in (0.5, 0.7, 0.9):
        for seed in (0, 1):
            a = random_pruned(rows, k, sparsity, np.random.default_rng(seed))
            for m1 in m1s:
                k_src = full_kernel_source(a, reordered_tiles(a, m1), 128)
                cap = predicted_registers(m1)
                out = compiled_kernel(k_src, CompileOptions(arch="sm_90", maxrregcount=cap, relocatable=True))
                table.add_row(str(sparsity), str(seed), str(m1), str(cap), str(out.registers),
                              str(out.thread_spill_bytes))
    Console(width=160).print(table)


def conv_cost(sparsity: float, m1s: list[int]) -> None:
    """Compile seconds and SASS of the implicit-im2col kernel (reads NCHW input, fuses ReLU) against
    the GEMM kernel (reads a materialised im2col B) for the same weights and tiles."""
    import time

    from lospmm.kernel.epilogue import Epilogue
    from lospmm.kernel.geometry import ConvGeometry

    layers = {"resnet50 conv1 (7×7 s2, 3→64, 224²)": ConvGeometry(cin=3, h=224, w=224, kh=7, kw=7, stride=2, pad=3),
              "resnet50 layer1.0.conv2 (3×3, 64→64, 56²)": ConvGeometry(cin=64, h=56, w=56, kh=3, kw=3, pad=1)}
    table = Table(title=f"Implicit-im2col conv kernels vs GEMM kernels, sparsity {sparsity}, sm_90, cap = prediction")
    for c in ("layer", "M1", "kernel", "compile s", "regs", "spill B", "instructions/nnz", "FFMA/nnz", "LDG/col"):
        table.add_column(c)
    for label, g in layers.items():
        a = random_pruned(64, g.k, sparsity, np.random.default_rng(0))
        for m1 in m1s:
            tiles = reordered_tiles(a, m1)
            cols = int(tiles.tile_nnc.sum())
            for kind, kernel in (("GEMM (im2col B)", full_kernel_source(a, tiles, 128)),
                                 ("conv (implicit)", full_kernel_source(a, tiles, 128, epilogue=Epilogue(activation="relu"), conv=g))):
                t0 = time.perf_counter()
                out = compiled_kernel(kernel, CompileOptions(arch="sm_90", maxrregcount=predicted_registers(m1),
                                                             relocatable=True))
                seconds = time.perf_counter() - t0
                c = sass_counts(out.cubin, kernel.name)
                table.add_row(label, str(m1), kind, f"{seconds:.1f}", str(out.registers), str(out.thread_spill_bytes),
                              f"{c['total'] / a.nnz:.2f}", f"{c['FFMA'] / a.nnz:.3f}", f"{c['LDG'] / cols:.3f}")
    Console(width=160).print(table)


def chunk_counts(kernel, block_rows: int, design, conv: bool = False) -> dict[str, float]:
    """An N:M kernel's chunk loop per warp and chunk, from its sm_90 SASS on the 16-byte path (the launch's
    path test fixed to it, so that the element-wise path's loop is not counted; a convolution's form has
    one path, its gathers): instructions, multiply-adds (FFMA, HFMA2, HMMA), cp.async copies and
    shared-memory loads, each divided by the chunks the loop holds where ptxas unrolled it (two barriers a
    chunk: its stage in, its slots done); and the registers of the kernel as a run compiles it."""
    from lospmm.kernel.sass import FMA_PIPE, disassembled, fma_loop
    from lospmm.stages.compile import compiled, kernel_options

    (text,) = kernel.units
    vector_path = text.replace("const bool vec = N %", "const bool vec = true || N %")
    if vector_path == text and not conv:
        raise SystemExit(f"{kernel.name}: the kernel's path test has changed; fixing it to the 16-byte path failed")
    options = kernel_options("sm_90", block_rows, design=design, conv=conv)
    loop = fma_loop(disassembled(compiled(vector_path, kernel.name, options).cubin))
    chunks = max(1, loop.count("BAR") // 2)
    return {"instructions": len(loop) / chunks, "fmas": sum(o in FMA_PIPE for o in loop) / chunks,
            "copies": loop.count("LDGSTS") / chunks, "loads": (loop.count("LDS") + loop.count("LDSM")) / chunks,
            "registers": compiled(text, kernel.name, options).registers}


def nm_loops(rows: int = 1024, k: int = 1024) -> None:
    """The N:M kernels' chunk loop on their 16-byte path, per warp: its instructions (straight code, so
    each runs once a chunk), how many are multiply-adds (FFMA, HFMA2 or HMMA), cp.async copies and
    shared-memory loads, and what is left (addresses, the barriers, the loop). Compiled with the
    launch's path test fixed to the 16-byte path, which a launch with N a multiple of 4 (8 for 16-bit
    B) and aligned B and C takes, so that the element-wise path's loop is not counted; a convolution's
    implicit-im2col form has one path, a 4-byte gather a staged row. Beside each, the estimate's count
    (estimate.nm_chunk_instructions); the registers are the kernel's as a run compiles it (both paths).
    Where ptxas unrolls the chunk loop, its counts are divided by the chunks it holds (two barriers each)."""
    from lospmm.kernel.design import design_named, half_design
    from lospmm.kernel.epilogue import Epilogue
    from lospmm.kernel.geometry import ConvGeometry
    from lospmm.kernel.nm import NMTiling
    from lospmm.kernel.numbers import NumberFormat, rounded_matrix
    from lospmm.kernel.estimate import nm_chunk_instructions
    from lospmm.kernel.render import CodegenParams, kernel_source
    from lospmm.kernel.sparse_mma import MMATiling
    from lospmm.stages.prune import NMPattern, random_nm_pruned

    nm = design_named("nm")
    fp16 = half_design(NumberFormat.half("fp16", "packed", 0), nm)
    mma = half_design(NumberFormat.half("fp16", "mma", 0), nm)
    cases = [("fp32", nm, NMTiling(16, 32, 32)), ("fp32", nm, NMTiling(12, 32, 32)),
             ("fp32", nm, NMTiling(8, 32, 32)), ("fp32", nm, NMTiling(8, 32, 32, depth=64)),
             ("fp32", nm, NMTiling(4, 32, 32)), ("fp32", nm, NMTiling(4, 32, 32, depth=128)),
             ("fp32", nm, NMTiling(2, 4, 1)), ("fp32", nm, NMTiling(2, 4, 1, 16, 64, 4, 4)),
             ("fp16 packed", fp16, NMTiling(16, 32, 32)), ("fp16 packed", fp16, NMTiling(2, 4, 1)),
             ("fp16 packed", fp16, NMTiling(8, 32, 8)), ("fp16 packed", fp16, NMTiling(8, 32, 8, 16, 64, 4, 4)),
             ("fp16 packed", fp16, NMTiling(2, 4, 1, 16, 64, 4, 4)),
             ("fp16 mma.sp", mma, MMATiling(2, 4, 1)), ("fp16 mma.sp", mma, MMATiling(2, 4, 1, 128, 128, 64, 64)),
             ("fp32 conv", nm, NMTiling(2, 4, 1)), ("fp32 conv", nm, NMTiling(2, 4, 1, 16, 64, 4, 4)),
             ("fp32 conv", nm, NMTiling(8, 32, 8)), ("fp16 packed conv", fp16, NMTiling(8, 32, 8)),
             ("fp16 packed conv", fp16, NMTiling(8, 32, 8, 16, 64, 4, 4)),
             ("fp16 packed conv", fp16, NMTiling(2, 4, 1, 16, 64, 4, 4))]
    # a 3×3 convolution (64 channels, 14×14): its implicit-im2col form gathers 4 bytes a staged row and pixel
    geometry = ConvGeometry(cin=64, h=14, w=14, kh=3, kw=3, stride=1, pad=1)
    table = Table(title=f"N:M kernels' chunk loop, per warp, on the 16-byte path ({rows}×{k}, sm_90, NVRTC; SASS counts)")
    for c in ("numbers", "tiling", "registers (as shipped)", "instructions a chunk", "the estimate's", "multiply-adds",
              "share", "cp.async", "shared loads", "other"):
        table.add_column(c)
    for numbers, design, tiling in cases:
        conv = geometry if numbers.endswith("conv") else None
        a = random_nm_pruned(rows, conv.k if conv else k, NMPattern(tiling.n, tiling.m, tiling.vector),
                             np.random.default_rng(0))
        if design.half:
            a, _ = rounded_matrix(a, design.dtype)
        kernel = kernel_source(a, None, 0, CodegenParams(design=design), Epilogue(), conv, nm=tiling)
        counts = chunk_counts(kernel, tiling.block_rows, design, conv is not None)
        instructions, fmas, copies, loads = (counts[c] for c in ("instructions", "fmas", "copies", "loads"))
        estimate = "-" if isinstance(tiling, MMATiling) else f"{nm_chunk_instructions(tiling, design.number, conv is not None):.0f}"
        table.add_row(numbers, tiling.label, str(counts["registers"]), f"{instructions:.0f}", estimate, f"{fmas:.0f}",
                      f"{fmas / instructions:.3f}", f"{copies:.0f}", f"{loads:.0f}",
                      f"{instructions - fmas - copies - loads:.0f}")
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
