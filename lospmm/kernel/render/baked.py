"""The baked GEMM kernel (Alg. 2, §6.1) and its proxies (§5.1), in any number format.

Layout: A is M×K (baked in), B is K×N row-major, C is M×N row-major, in the kernel's number
format; N is a runtime argument, so one kernel serves any batch. Block (tile, column block) has N1
threads; a thread owns V output columns (n = column block·N1·V + threadIdx.x·V) and the M1 rows of
its A_tile (the reorder stage's rows, possibly non-contiguous), kept in registers. The tile's
non-empty columns are visited in order: the B value of column j + P is loaded before the
multiply-adds of column j (prefetch depth P), a column with no nonzero is never loaded, and each
nonzero is one multiply-add of a literal; loads and stores go through the preamble's inline PTX.
Rows of A with no nonzero are stored by extra blocks after the last tile.

Sharding: ptxas's time and memory grow superlinearly with the size of one function, so each tile
(of a proxy: each cluster) is a `__noinline__`, never-returning device function, and the functions
are grouped into units of at most `shard_nnz` multiply-adds, compiled separately as relocatable
code and linked by nvJitLink into one cubin with one entry point (the entry unit is last).
"""

from __future__ import annotations

import scipy.sparse as sp

from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.layout import LaunchLayout, proxy_layout
from lospmm.kernel.render.common import (CodegenParams, axes, checked_tile, entry_unit, first_column, kernel_name,
                                         proxy_nonzeros, sectioned_walks, sorted_matrix, tile_columns, tile_costs,
                                         tile_signature, units, zero_functions)
from lospmm.kernel.render.numbers import number_code
from lospmm.kernel.spec import KernelSource, KernelSpec


def baked_kernel(matrix: sp.csr_matrix, tiles, n1: int, params: CodegenParams = CodegenParams(),
                 epilogue: Epilogue = Epilogue()) -> KernelSource:
    """Alg. 2 for every A_tile of `tiles`, blocks of `n1` threads (or N1 read at launch:
    params.n1_at_launch), in `params.design`, each output stored through `epilogue` (bias and
    activation fused; the empty one: the plain product). A half design's A must hold its dtype's
    values already (numbers.rounded_matrix), and `tiles` be that A's."""
    design = params.design
    code = number_code(design)
    checked_tile(n1)
    if params.n1_at_launch and design.half:
        raise ValueError(f"design {design.label}: N1 at launch is the baked fp32 kernels' so far")
    a = sorted_matrix(code.matrix(matrix), epilogue)
    m, k = a.shape
    v, ctype = design.columns_per_thread, code.ctype
    at_launch = params.n1_at_launch
    name = kernel_name(code.kernel_prefix, m, k, a.indptr.tobytes(), a.indices.tobytes(), code.value_bytes(a),
                       tiles.rows.tobytes(), tiles.tile_ptr.tobytes(), "at launch" if at_launch else n1,
                       params.prefetch, params.shard_nnz, *code.name_parts(),
                       *(() if epilogue.empty else ("epilogue", *epilogue.name_parts())))
    header = (f"// lospmm {code.kernel_kind} {name}: M={m} K={k} nnz={a.nnz} M1={tiles.m1} "
              f"N1={'at launch' if at_launch else n1} tiles={tiles.num_tiles} prefetch={params.prefetch}"
              + code.header_note()
              + (f" bias={bool(epilogue.bias)} activation={epilogue.activation or 'none'}" if not epilogue.empty else ""))
    signature = tile_signature(design, ctype)
    functions = []
    for t in range(tiles.num_tiles):
        rows = tiles.tile(t)
        sub, cols = tile_columns(a, rows)
        values = code.tile_values(sub.data)
        nonzeros = [[(int(sub.indices[p]), values[p]) for p in range(sub.indptr[c], sub.indptr[c + 1])] for c in cols]
        body = sectioned_walks(
            code, design, [int(c) for c in cols], nonzeros, len(rows), params.prefetch, code.load,
            lambda finish, rows=rows: [code.store(f, int(r), epilogue) for r, f in zip(rows, finish)],
            lambda finish, rows=rows: [code.resumed(f, int(r)) for r, f in zip(rows, finish)],
            lambda finish, rows=rows: [code.store(f, int(r), None) for r, f in zip(rows, finish)])
        functions.append("".join([f"LOSPMM_TILE void tile_{t}{signature} {{\n", *body, "  LOSPMM_TILE_END\n}\n"]))
    zeros = zero_functions(code, tiles, epilogue)
    tile_axis, column_axis = axes(design)
    per_block = (("blockDim.x" if v == 1 else f"(blockDim.x * {v})") if at_launch else n1 * v)
    head = [f"LOSPMM_KERNEL void {name}(const {ctype}* __restrict__ B, {ctype}* __restrict__ C, const int N) {{\n",
            first_column(design, str(per_block)) + "  if (n >= N) return;\n"]
    if design.looped:
        head.append(f"  const int stride = gridDim.{column_axis} * {per_block};\n")
        tile_args, zero_call = "B, C, N, n, stride", "for (int c = n; c < N; c += stride) zero_{z}(C + c, N)"
    else:
        head.append(f"  const {ctype}* Bn = B + n;\n  {ctype}* Cn = C + n;\n")
        tile_args, zero_call = "Bn, Cn, N", "zero_{z}(Cn, N)"
    preamble = code.preamble()
    entry = entry_unit(preamble, header, tiles.num_tiles, signature, zeros, "".join(head), tile_args,
                       zero_call, tile_axis)
    layout = LaunchLayout(tiles.num_tiles + len(zeros), 0 if at_launch else n1, v, design.column_walks, design.order)
    spec = KernelSpec(name, "gemm", m, k, tiles.m1, layout, tiles.num_tiles, design, epilogue, nnz=int(a.nnz))
    return KernelSource(spec, tuple(units("tile", functions, tile_costs(a, tiles), params.shard_nnz, preamble)
                                    + [entry]))


def baked_proxy(m: int, k: int, clusters, params: CodegenParams = CodegenParams()) -> KernelSource:
    """The M1 proxy of §5.1 in `params.design`: one kernel for every N1 (block size, grid and the
    tile -> cluster map are launch arguments), one block function per cluster, NNC_p iterations of
    one B load and CPL multiply-adds each (of distinct literals, so that none fold), results stored
    to rows tile·M1 + i of C (rows past M skipped): the row index is made from the block index after
    the multiply-adds, so no register holds it through them (a table of each tile's rows, read at
    the end, made ptxas keep its pointer and the rows live and spill 40-250 bytes per thread where
    the full kernel spills none). It follows the design's grid order, walks, columns per thread,
    loads and number format (a streamed design's proxy is render.streamed.streamed_proxy)."""
    design = params.design
    if design.a_values != "baked":
        raise ValueError(f"design {design.label}: the baked proxy is the baked designs' (render.proxy_source)")
    code = number_code(design)
    m1, v, ctype = clusters.m1, design.columns_per_thread, code.ctype
    name = kernel_name(code.proxy_prefix, m, k, m1, clusters.nnc_p.tobytes(), clusters.cpl.tobytes(),
                       b"".join(c.tobytes() for c in clusters.columns), params.prefetch, params.shard_nnz,
                       *(() if design.half else ("rows from the block index",)), *code.name_parts())
    header = (f"// lospmm {code.proxy_kind} {name}: M={m} K={k} M1={m1} clusters={clusters.num_clusters} "
              f"NNC_p={clusters.nnc_p.tolist()} CPL={clusters.cpl.tolist()}" + code.header_note())
    signature = tile_signature(design, ctype)
    tile_axis, column_axis = axes(design)
    functions = []
    for c in range(clusters.num_clusters):
        cols, nonzeros = proxy_nonzeros(code, clusters, c)

        def stores(finish) -> list[str]:
            return [f"  {{ const int r0 = blockIdx.{tile_axis} * {m1};\n",
                    *(code.store(f, i, None, f"r0 + {i}", f"r0 + {i} < {m}") for i, f in enumerate(finish)), "  }\n"]

        def resumed(finish) -> list[str]:  # a K split's section after the first, as the full kernel's
            return [f"  {{ const int r0 = blockIdx.{tile_axis} * {m1};\n",
                    *(code.resumed(f, f"r0 + {i}", f"r0 + {i} < {m}") for i, f in enumerate(finish)), "  }\n"]
        body = sectioned_walks(code, design, cols, nonzeros, m1, params.prefetch, code.load, stores, resumed, stores)
        functions.append("".join([f"LOSPMM_TILE void proxy_{c}{signature} {{\n", *body, "  LOSPMM_TILE_END\n}\n"]))
    costs = [len(clusters.columns[c]) * int(clusters.cpl[c]) for c in range(clusters.num_clusters)]
    args = "B, C, N, n, stride" if design.looped else "Bn, Cn, N"
    cases = "".join(f"    case {c}: proxy_{c}({args}); break;\n" for c in range(clusters.num_clusters))
    per_block = "blockDim.x" if v == 1 else f"(blockDim.x * {v})"
    preamble = code.preamble()
    entry = (preamble + header + " (entry unit)\n"
             + "".join(f"LOSPMM_TILE void proxy_{c}{signature};\n" for c in range(clusters.num_clusters))
             + f"LOSPMM_KERNEL void {name}(const {ctype}* __restrict__ B, {ctype}* __restrict__ C, const int N, "
             f"const int* __restrict__ cluster_of) {{\n"
             + first_column(design, per_block) + "  if (n >= N) return;\n"
             + (f"  const int stride = gridDim.{column_axis} * {per_block};\n" if design.looped
                else f"  const {ctype}* Bn = B + n;\n  {ctype}* Cn = C + n;\n")
             + f"  switch (cluster_of[blockIdx.{tile_axis}]) {{\n{cases}    default: break;\n  }}\n}}\n")
    spec = KernelSpec(name, "proxy", m, k, m1, proxy_layout(len(clusters.cluster_of), design),
                      len(clusters.cluster_of), design)
    return KernelSource(spec, tuple(units("proxy", functions, costs, params.shard_nnz, preamble) + [entry]))
