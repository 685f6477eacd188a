"""The streamed GEMM kernel (design `streamed`): A's tiles as data in the cubin, each block's
non-empty columns (a byte offset, or with chained loads the step from the previous one) and per
column the M1 values of its rows (0 where a row has none), read by one loop; rows of A with no
nonzero are blocks with no column. One unit of O(1) code whatever the layer's size; the block size
is blockDim.x. fp32 only, no epilogue so far (KernelSpec says so)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from lospmm.kernel.includes import included
from lospmm.kernel.layout import LaunchLayout, proxy_layout
from lospmm.kernel.render.common import CodegenParams, axes, checked_tile, first_column, float_literal, kernel_name, zero_blocks
from lospmm.kernel.render.numbers import LANES, SUFFIX, VECTOR_TYPE, zero_value
from lospmm.kernel.spec import KernelSource, KernelSpec


def streamed_kernel(matrix: sp.csr_matrix, tiles, n1: int, params: CodegenParams) -> KernelSource:
    a = sp.csr_matrix(matrix)
    a.sort_indices()
    checked_tile(n1)
    design = params.design
    m, k = a.shape
    m1, v = max(tiles.m1, 1), design.columns_per_thread
    blocks = [tiles.tile(t) for t in range(tiles.num_tiles)] + zero_blocks(tiles.empty_rows, m1)
    colptr, offsets, values, rows = [0], [], [], []
    for block_rows in blocks:
        sub = a[block_rows].tocsc()
        cols = np.flatnonzero(np.diff(sub.indptr))
        dense = np.zeros((len(cols), m1), np.float32)
        dense[:, :len(block_rows)] = sub[:, cols].toarray().T
        offsets.extend(_offsets(design, cols))
        values.append(dense.ravel())
        colptr.append(colptr[-1] + len(cols))
        rows.extend([*map(int, block_rows), *([-1] * (m1 - len(block_rows)))])
    name = kernel_name("lospmm_stream", m, k, a.indptr.tobytes(), a.indices.tobytes(), a.data.tobytes(),
                       tiles.rows.tobytes(), tiles.tile_ptr.tobytes(), n1, *design.code_key)
    data = _data(name, colptr, offsets, values, rows)
    source = "".join([
        included("preamble.cuh"), included("vector.cuh"),
        f"// lospmm streamed kernel {name}: M={m} K={k} nnz={a.nnz} M1={m1} N1={n1} tiles={tiles.num_tiles} "
        f"design={design.code_label}\n", data,
        f"LOSPMM_KERNEL void {name}(const float* __restrict__ B, float* __restrict__ C, const int N) {{\n",
        *_loop(design, name, m1, f"blockIdx.{axes(design)[0]}", [
            f"    {{ const int r = __ldg(rows + {i}); if (r >= 0) lospmm_st{SUFFIX[v]}(Cn, r, N, acc{i}); }}\n"
            for i in range(m1)], f"  const int* __restrict__ rows = lospmm_rows_{name} + block * {m1};\n")])
    layout = LaunchLayout(len(blocks), n1, v, design.column_walks, design.order)
    spec = KernelSpec(name, "gemm", m, k, tiles.m1, layout, tiles.num_tiles, design, nnz=int(a.nnz))
    return KernelSource(spec, (source,))


def streamed_proxy(m: int, k: int, clusters, params: CodegenParams = CodegenParams()) -> KernelSource:
    """The M1 proxy (§5.1) of a streamed kernel: the same loop, over each cluster's NNC_p columns
    (`clusters.columns`) with M1 multiply-adds per column (as the full kernel makes per non-empty
    column, whatever its nonzeros), of distinct values; block t reads the data of cluster
    `cluster_of[t]` (a launch argument, as the baked proxy's) and stores to rows t·M1 + i of C (rows
    past M skipped). Its data is the clusters', so it stays small whatever the layer; its signature
    and launch are the baked proxy's, so the compile, time and check stages run it as they run those."""
    design = params.design
    if design.a_values != "streamed":
        raise ValueError(f"design {design.label}: the streamed proxy is the streamed design's")
    m1, v = clusters.m1, design.columns_per_thread
    colptr, offsets, values = [0], [], []
    for c in range(clusters.num_clusters):
        cols = np.asarray(clusters.columns[c], np.int64)
        offsets.extend(_offsets(design, cols))
        values.append((1 + (np.arange(len(cols) * m1) % 97) / 128).astype(np.float32))
        colptr.append(colptr[-1] + len(cols))
    name = kernel_name("lospmm_stream_proxy", m, k, m1, clusters.nnc_p.tobytes(),
                       b"".join(np.asarray(c, np.int32).tobytes() for c in clusters.columns), *design.code_key)
    tile_axis = axes(design)[0]
    source = "".join([
        included("preamble.cuh"), included("vector.cuh"),
        f"// lospmm streamed proxy {name}: M={m} K={k} M1={m1} clusters={clusters.num_clusters} "
        f"NNC_p={clusters.nnc_p.tolist()} design={design.code_label}\n", _data(name, colptr, offsets, values),
        f"LOSPMM_KERNEL void {name}(const float* __restrict__ B, float* __restrict__ C, const int N, "
        f"const int* __restrict__ cluster_of) {{\n",
        *_loop(design, name, m1, f"cluster_of[blockIdx.{tile_axis}]", [
            f"    if (r0 + {i} < {m}) lospmm_st{SUFFIX[v]}(Cn, r0 + {i}, N, acc{i});\n" for i in range(m1)],
            f"  const int r0 = blockIdx.{tile_axis} * {m1};\n")])
    spec = KernelSpec(name, "proxy", m, k, m1, proxy_layout(len(clusters.cluster_of), design),
                      len(clusters.cluster_of), design)
    return KernelSource(spec, (source,))


def _offsets(design, cols) -> list[int]:
    """A block's column entries as the loop reads them: each column's byte offset in a row of B, or
    with chained loads the step from the previous column's."""
    steps = np.diff(cols, prepend=0) if design.loads == "chained" else cols
    return (4 * np.asarray(steps, np.int64)).tolist()


def _data(name: str, colptr, offsets, values, rows=None) -> str:
    """The loop's data as device arrays: each block's column range, byte offsets (or steps), M1
    values per column and (a full kernel's) its rows of C."""
    arrays = [("int", "lospmm_colptr", map(str, colptr)), ("int", "lospmm_cols", map(str, offsets)),
              ("float", "lospmm_vals", float_literal(np.concatenate(values)) if values else [])]
    if rows is not None:
        arrays.append(("int", "lospmm_rows", map(str, rows)))
    return "".join(f"__device__ const {ctype} {array}_{name}[] = {{{', '.join(items) or '0'}}};\n"
                   for ctype, array, items in arrays)


def _loop(design, name: str, m1: int, block: str, stores: list[str], setup: str) -> list[str]:
    """The streamed loop's lines after the signature: the thread's columns, the data of `block` (an
    expression: the tile, or a proxy's cluster of it), `setup`, then per column block the M1 sums
    over the block's columns, stored by `stores`."""
    v = design.columns_per_thread
    tile_axis, column_axis = axes(design)
    kind, suffix, lanes = VECTOR_TYPE[v], SUFFIX[v], LANES[v]
    load = (f"{kind} b; LOSPMM_LDCR{suffix}(b, p, N, __ldg(cols + j));" if design.loads == "chained"
            else f"const {kind} b = lospmm_ld{suffix}(Bn, __ldg(cols + j), N);")
    per_block = "blockDim.x" if v == 1 else f"(blockDim.x * {v})"  # the block size is a launch argument
    return [
        first_column(design, per_block, "n0"),
        f"  const int stride = {f'gridDim.{column_axis} * {per_block}' if design.looped else 'N'};\n",
        f"  const int block = {block};\n",
        f"  const int begin = __ldg(lospmm_colptr_{name} + block), end = __ldg(lospmm_colptr_{name} + block + 1);\n",
        f"  const int* __restrict__ cols = lospmm_cols_{name};\n",
        setup,
        "  for (int n = n0; n < N; n += stride) {\n",
        "    const float* Bn = B + n;\n    float* Cn = C + n;\n",
        *(["    const float* p = Bn;\n"] if design.loads == "chained" else []),
        f"    {kind} " + ", ".join(f"acc{i} = {zero_value(v)}" for i in range(m1)) + ";\n",
        f"    const float* __restrict__ vals = lospmm_vals_{name} + (long long)begin * {m1};\n",
        "#pragma unroll 4\n",
        f"    for (int j = begin; j < end; ++j, vals += {m1}) {{\n      {load}\n",
        *(f"      {{ const float a = __ldg(vals + {i}); "
          + " ".join(f"acc{i}{lane} += b{lane} * a;" for lane in lanes) + " }\n" for i in range(m1)),
        "    }\n",
        *stores,
        "  }\n}\n"]
