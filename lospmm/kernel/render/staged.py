"""The staged GEMM kernel (design loads="staged", fp32, baked values): B through shared memory.

A block is `tiles_per_block` (G) warps over one warp's 32 columns of C (n = blockIdx.y·32 + lane);
warp w of block g walks tile g·G + w. Per chunk of STAGED_ROWS rows of K, the block copies the union
of its tiles' non-empty columns of B there into shared memory (each column once, 128 coalesced bytes
a copy, the columns shared out among the warps by a loop over a table: straight-line copies doubled
the code and ptxas's time), meets at a barrier, and each warp does its tile's
multiply-adds of the chunk reading B from shared memory; a second barrier, and the next chunk. B's
traffic through L2 is each union's instead of each tile's columns (benchmarks/staged_reuse.py
estimates the ratio: 1.4-7.6× on the A/B layers at 8 tiles), at the price of the copy's
instructions and two barriers a chunk. A tile's sums stay in its warp's registers across the chunks,
as many as today's kernel. Lanes past N copy zeros and store nothing (no thread leaves before the
last barrier). Rows of A with no nonzero are stored by extra blocks after the last group, by their
first warp.
"""

from __future__ import annotations

import scipy.sparse as sp

from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.includes import included
from lospmm.kernel.layout import LaunchLayout
from lospmm.kernel.render.common import (CodegenParams, entry_unit, kernel_name, sorted_matrix, tile_columns,
                                         units, zero_blocks)
from lospmm.kernel.render.numbers import Fp32Code
from lospmm.kernel.spec import KernelSource, KernelSpec

# rows of K a block stages at a time: its union there is at most 256 columns × 32 floats (32 KiB)
STAGED_ROWS = 256
WARP = 32


def staged_kernel(matrix: sp.csr_matrix, tiles, n1: int, params: CodegenParams = CodegenParams(),
                  epilogue: Epilogue = Epilogue()) -> KernelSource:
    """The staged kernel of `matrix` on `tiles` in `params.design` (loads="staged"), storing through
    `epilogue`. `n1` must be 32: a block's warps share one warp's columns."""
    design = params.design
    if design.loads != "staged":
        raise ValueError(f"design {design.label}: the staged kernel is the staged designs'")
    if n1 != WARP:
        raise ValueError(f"a staged block's warps share {WARP} columns: N1 must be {WARP}, got {n1}")
    if params.n1_at_launch:
        raise ValueError(f"design {design.label}: N1 at launch is the baked fp32 kernels' so far")
    a = sorted_matrix(matrix, epilogue)
    m, k = a.shape
    code = Fp32Code(design)
    per_block = design.tiles_per_block
    name = kernel_name("lospmm_staged", m, k, a.indptr.tobytes(), a.indices.tobytes(), a.data.tobytes(),
                       tiles.rows.tobytes(), tiles.tile_ptr.tobytes(), per_block, STAGED_ROWS, params.shard_nnz,
                       *(() if epilogue.empty else ("epilogue", *epilogue.name_parts())))
    groups = [list(range(g, min(g + per_block, tiles.num_tiles))) for g in range(0, tiles.num_tiles, per_block)]
    bodies = [_group(a, code, tiles, ts, epilogue) for ts in groups]
    largest = max([staged for _, _, staged, _ in bodies] + [1])
    header = (f"// lospmm staged kernel {name}: M={m} K={k} nnz={a.nnz} M1={tiles.m1} tiles={tiles.num_tiles} "
              f"tiles a block={per_block} rows of K staged={STAGED_ROWS} shared={largest * WARP * 4} B"
              + (f" bias={bool(epilogue.bias)} activation={epilogue.activation or 'none'}" if not epilogue.empty else ""))
    signature = "(const float* __restrict__ B, float* __restrict__ C, const int N, float* __restrict__ Bs)"
    functions = [f"{tables}LOSPMM_TILE void tile_{g}{signature} {{\n{text}  LOSPMM_TILE_END\n}}\n"
                 for g, (tables, text, _, _) in enumerate(bodies)]
    zeros = zero_blocks(tiles.empty_rows, max(tiles.m1, 1))
    zero_functions = [("(float* __restrict__ Cn, const int N)", "".join(code.zero_store(int(r), epilogue) for r in rows))
                      for rows in zeros]
    head = (f"LOSPMM_KERNEL void {name}(const float* __restrict__ B, float* __restrict__ C, const int N) {{\n"
            f"  __shared__ __align__(16) float Bs[{largest * WARP}];\n")
    zero_call = (f"if (threadIdx.x < {WARP} && blockIdx.y * {WARP} + threadIdx.x < N) "
                 f"zero_{{z}}(C + blockIdx.y * {WARP} + threadIdx.x, N)")
    preamble = code.preamble() + included("staged.cuh")
    entry = entry_unit(preamble, header, len(groups), signature, zero_functions, head, "B, C, N, Bs", zero_call, "x")
    layout = LaunchLayout(len(groups) + len(zeros), WARP * per_block, 1, 1, "tile-x", per_block)
    spec = KernelSpec(name, "gemm", m, k, tiles.m1, layout, tiles.num_tiles, design, epilogue, nnz=int(a.nnz))
    return KernelSource(spec, tuple(units("tile", functions, [cost for _, _, _, cost in bodies], params.shard_nnz,
                                          preamble) + [entry]))


def _group(a: sp.csr_matrix, code: Fp32Code, tiles, group: list[int], epilogue: Epilogue) -> tuple[str, int, int]:
    """A block's function for the tiles of `group` (warp w walks group[w]): (its tables of the columns
    each chunk stages, its body's text, the most columns it stages in one chunk, its multiply-adds)."""
    per_tile = []
    for t in group:
        rows = tiles.tile(t)
        sub, cols = tile_columns(a, rows)
        values = code.tile_values(sub.data)
        per_tile.append((rows, [(int(c), [(int(sub.indices[p]), values[p])
                                          for p in range(sub.indptr[c], sub.indptr[c + 1])]) for c in cols]))
    most_rows = max(len(rows) for rows, _ in per_tile)
    out = [f"  const int warp = threadIdx.x / {WARP}, lane = threadIdx.x % {WARP};\n",
           f"  const int n = blockIdx.y * {WARP} + lane;\n  const bool live = n < N;\n",
           "  const float* Bn = B + n;\n  float* Cn = C + n;\n",
           "  const float* Bl = Bs + lane;  // the lane's column of the staged chunk\n",
           "  const unsigned mine = lospmm_shared_address(Bl);\n",
           "  float " + ", ".join(f"acc{i} = 0.0f" for i in range(most_rows)) + ";\n"]
    staged_most, tables = 0, []
    for chunk0 in range(0, a.shape[1], STAGED_ROWS):
        inside = [[(c, nz) for c, nz in columns if chunk0 <= c < chunk0 + STAGED_ROWS] for _, columns in per_tile]
        union = sorted({c for columns in inside for c, _ in columns})
        if not union:
            continue
        staged_most = max(staged_most, len(union))
        slot = {c: i for i, c in enumerate(union)}
        table = f"lospmm_staged_{group[0]}_{chunk0 // STAGED_ROWS}"
        tables.append(f"__device__ const int {table}[{len(union)}] = {{{', '.join(str(4 * c) for c in union)}}};\n")
        # the union's columns (their byte offsets in a row of B, times N at the load) shared out among the warps
        out.append(f"  // rows {chunk0}..{chunk0 + STAGED_ROWS - 1} of K: {len(union)} columns of B staged\n"
                   f"  for (int j = warp; j < {len(union)}; j += {code.design.tiles_per_block}) "
                   f"Bs[j * {WARP} + lane] = live ? lospmm_ld(Bn, {table}[j], N) : 0.0f;\n"
                   "  __syncthreads();\n  switch (warp) {\n")
        for w, columns in enumerate(inside):
            if columns:
                lines = [f"      {{ float b{j}; LOSPMM_LDS(b{j}, mine, Bl, {4 * slot[c] * WARP}); "
                         + " ".join(code.multiply_adds(j, nz, None)) + " }\n" for j, (c, nz) in enumerate(columns)]
                out.append(f"    case {w}:\n" + "".join(lines) + "      break;\n")
        out.append("    default: break;\n  }\n  __syncthreads();\n")
    out.append("  if (live) switch (warp) {\n")
    for w, (rows, _) in enumerate(per_tile):
        out.append(f"    case {w}:\n" + "".join("    " + code.store(i, int(r), epilogue) for i, r in enumerate(rows))
                   + "      break;\n")
    out.append("    default: break;\n  }\n")
    return "".join(tables), "".join(out), staged_most, int(sum(len(nz) for _, columns in per_tile for _, nz in columns))
