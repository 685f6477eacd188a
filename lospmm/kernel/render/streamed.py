"""The streamed kernels (design `streamed`): A's tiles as data in the cubin, each block's non-empty
columns (a byte offset, or with chained loads the step from the previous one) and per column the M1
values of its rows (0 where a row has none), read by one loop; rows of A with no nonzero are blocks
with no column. One unit of O(1) code whatever the layer's size; the block size is blockDim.x. fp32;
an epilogue's bias is data beside the rows (one float a block's row), its activation code.

The implicit-im2col convolution in a streamed design (`streamed_conv_kernel`) is the same loop over
the same data with each column's entry the input's offset from the window's top-left pixel and its
window row and column: a thread's pixel finds its window once, as the baked conv kernel's tile
functions do, and each load is predicated on the two window masks (zero in the padding; no test
without padding). It takes the design's grid order, walks and columns per thread: V output pixels a
thread, blockDim.x apart as the baked vector conv kernel's lanes (adjacent output pixels are not
adjacent inputs at a stride), each lane its own window and load of each column's entry, and each value
read from the data feeding V multiply-adds; B addresses from the pixel's pointer (chaining has
nothing to remove there).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from lospmm.kernel.design import conv_design
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.geometry import ConvGeometry
from lospmm.kernel.includes import included
from lospmm.kernel.layout import LaunchLayout, proxy_layout
from lospmm.kernel.render.common import (CodegenParams, axes, checked_tile, first_column, float_literal, kernel_name,
                                         sorted_matrix, zero_blocks)
from lospmm.kernel.render.conv import WINDOW_INSIDE, checked_conv_weight, lane_windows, pixel_window, window_entries
from lospmm.kernel.render.numbers import LANES, SUFFIX, VECTOR_TYPE, epilogue_applied, zero_value
from lospmm.kernel.spec import KernelSource, KernelSpec


def streamed_kernel(matrix: sp.csr_matrix, tiles, n1: int, params: CodegenParams,
                    epilogue: Epilogue = Epilogue()) -> KernelSource:
    """C = epilogue(A·B) by the streamed loop over `tiles` in blocks of `n1` threads."""
    a = sorted_matrix(matrix, epilogue)
    checked_tile(n1)
    design = params.design
    m, k = a.shape
    m1, v = max(tiles.m1, 1), design.columns_per_thread
    blocks, colptr, cols, values, rows = _blocks(a, tiles, m1)
    name = kernel_name("lospmm_stream", m, k, a.indptr.tobytes(), a.indices.tobytes(), a.data.tobytes(),
                       tiles.rows.tobytes(), tiles.tile_ptr.tobytes(), n1, *design.code_key,
                       *(() if epilogue.empty else ("epilogue", *epilogue.name_parts())))
    offsets = [o for block_cols in cols for o in _offsets(design, block_cols)]
    data = _data(name, colptr, offsets, values, rows, _biases(epilogue, rows))
    source = "".join([
        included("preamble.cuh"), included("vector.cuh"),
        f"// lospmm streamed kernel {name}: M={m} K={k} nnz={a.nnz} M1={m1} N1={n1} tiles={tiles.num_tiles} "
        f"design={design.code_label}" + (f" epilogue={epilogue.label}" if not epilogue.empty else "") + "\n", data,
        f"LOSPMM_KERNEL void {name}(const float* __restrict__ B, float* __restrict__ C, const int N) {{\n",
        *_loop(design, name, m1, f"blockIdx.{axes(design)[0]}",
               _stores(epilogue, m1, v, name, "Cn", "N"), _rows_setup(name, m1, epilogue))])
    layout = LaunchLayout(len(blocks), n1, v, design.column_walks, design.order)
    spec = KernelSpec(name, "gemm", m, k, tiles.m1, layout, tiles.num_tiles, design, epilogue, nnz=int(a.nnz))
    return KernelSource(spec, (source,))


def streamed_conv_kernel(matrix: sp.csr_matrix, tiles, n1: int, geometry: ConvGeometry,
                         epilogue: Epilogue = Epilogue(), params: CodegenParams = CodegenParams()) -> KernelSource:
    """Y = epilogue(conv(X)) without im2col by the streamed loop: parameters (X, Y, batch), launched
    with grid(geometry.n(batch)) as the baked conv kernel. Same tiles as the GEMM kernel (the
    search's shapes are the im2col GEMM's)."""
    design = params.design
    if design != conv_design(design) or design.a_values != "streamed":
        raise ValueError(f"design {design.label}: a streamed conv kernel takes the grid's order, walks and columns "
                         f"per thread of a streamed design (loads from the pixel's pointer)")
    if params.n1_at_launch:
        raise ValueError("an implicit-im2col conv kernel bakes its N1 in (N1 at launch is the GEMM kernels')")
    a = sorted_matrix(matrix, epilogue)
    m, k = a.shape
    checked_conv_weight(k, geometry)
    checked_tile(n1)
    g, m1 = geometry, max(tiles.m1, 1)
    blocks, colptr, cols, values, rows = _blocks(a, tiles, m1)
    entries = [x for block_cols in cols for x in window_entries(g, block_cols)]
    name = kernel_name("lospmm_stream_conv", m, k, a.indptr.tobytes(), a.indices.tobytes(), a.data.tobytes(),
                       tiles.rows.tobytes(), tiles.tile_ptr.tobytes(), n1, tuple(vars(g).values()),
                       *epilogue.name_parts(), *design.code_key)
    data = _data(name, colptr, entries, values, rows, _biases(epilogue, rows), align=8)
    source = "".join([
        included("preamble.cuh"), included("conv.cuh"),
        f"// lospmm streamed conv kernel {name}: Cout={m} Cin={g.cin} {g.h}x{g.w} window {g.kh}x{g.kw} "
        f"stride={g.stride} pad={g.pad} dilation={g.dilation} -> {g.h_out}x{g.w_out}, nnz={a.nnz} M1={m1} "
        f"N1={n1} tiles={tiles.num_tiles} design={design.code_label}"
        + (f" epilogue={epilogue.label}" if not epilogue.empty else "") + "\n", data,
        f"LOSPMM_KERNEL void {name}(const float* __restrict__ X, float* __restrict__ Y, const int batch) {{\n",
        *_loop(design, name, m1, f"blockIdx.{axes(design)[0]}", _pixel_stores(epilogue, m1, design.columns_per_thread,
                                                                              str(g.pixels)),
               _rows_setup(name, m1, epilogue), (g, m))])
    layout = LaunchLayout(len(blocks), n1, design.columns_per_thread, design.column_walks, design.order)
    spec = KernelSpec(name, "conv", m, k, tiles.m1, layout, tiles.num_tiles, design, epilogue, g, nnz=int(a.nnz))
    return KernelSource(spec, (source,))


def _blocks(a: sp.csr_matrix, tiles, m1: int):
    """A streamed kernel's blocks (each tile, then the rows with no nonzero M1 at a time) and their data:
    (blocks, each block's column range, its non-empty columns, its M1 values per column, its rows of
    C with -1 past a block's last)."""
    blocks = [tiles.tile(t) for t in range(tiles.num_tiles)] + zero_blocks(tiles.empty_rows, m1)
    colptr, cols, values, rows = [0], [], [], []
    for block_rows in blocks:
        sub = a[block_rows].tocsc()
        nonempty = np.flatnonzero(np.diff(sub.indptr))
        dense = np.zeros((len(nonempty), m1), np.float32)
        dense[:, :len(block_rows)] = sub[:, nonempty].toarray().T
        cols.append(nonempty)
        values.append(dense.ravel())
        colptr.append(colptr[-1] + len(nonempty))
        rows.extend([*map(int, block_rows), *([-1] * (m1 - len(block_rows)))])
    return blocks, colptr, cols, values, rows


def _lane_load(g: ConvGeometry, lane: str, index: int) -> str:
    """A vector streamed conv kernel's load of lane `index` (component `lane` of x): the entry's input from
    its window's corner xp_L, predicated on its window masks (none without padding)."""
    if g.windows_inside:
        return f" x{lane} = __ldg(reinterpret_cast<const float*>(reinterpret_cast<const char*>(xp_{index}) + e.x));"
    inside = WINDOW_INSIDE.format("e.y").replace("rows_ok", f"rows_ok_{index}").replace("cols_ok", f"cols_ok_{index}")
    return f" LOSPMM_LDXR(x{lane}, xp_{index}, e.x, {inside});"


def _pixel_stores(epilogue: Epilogue, m1: int, v: int, stride: str) -> list[str]:
    """A streamed conv kernel's stores: each of the block's M1 sums through the epilogue (its row's bias
    from the data) to its row of each live lane's pixel (one pixel a thread: Yb; V lanes: Yb_L where
    live_L), rows `stride` apart, skipped past the block's last row."""
    if v == 1:
        return _stores(epilogue, m1, 1, "", "Yb", stride)

    def value(i: int, lane: str) -> str:
        return (f"acc{i}{lane}" if epilogue.empty
                else epilogue_applied(epilogue, f"acc{i}{lane}", 0, 1, f"__ldg(bias + {i})"))

    return [f"    {{ const int r = __ldg(rows + {i}); if (r >= 0) {{"
            + "".join(f" if (live_{index}) lospmm_st(Yb_{index}, r, {stride}, {value(i, lane)});"
                      for index, lane in enumerate(LANES[v])) + " } }\n" for i in range(m1)]


def _biases(epilogue: Epilogue, rows: list[int]) -> list[float] | None:
    """The bias of each block's row (0 past its last), beside `rows`; None without a bias."""
    return [float(epilogue.bias[r]) if r >= 0 else 0.0 for r in rows] if epilogue.bias else None


def _rows_setup(name: str, m1: int, epilogue: Epilogue) -> str:
    """The block's rows of C (and their biases) in the data: the line that points at them."""
    return (f"  const int* __restrict__ rows = lospmm_rows_{name} + block * {m1};\n"
            + (f"  const float* __restrict__ bias = lospmm_bias_{name} + block * {m1};\n" if epilogue.bias else ""))


def _stores(epilogue: Epilogue, m1: int, v: int, name: str, out: str, stride: str) -> list[str]:
    """Each of the block's M1 sums through the epilogue (its row's bias from the data, the activation)
    to its row of `out` (rows `stride` apart), skipped past the block's last row."""
    def value(i: int) -> str:
        return f"acc{i}" if epilogue.empty else epilogue_applied(epilogue, f"acc{i}", 0, v, f"__ldg(bias + {i})")

    return [f"    {{ const int r = __ldg(rows + {i}); if (r >= 0) lospmm_st{SUFFIX[v]}({out}, r, {stride}, {value(i)}); }}\n"
            for i in range(m1)]


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


def _data(name: str, colptr, offsets, values, rows=None, biases=None, align: int = 0) -> str:
    """The loop's data as device arrays: each block's column range, its columns' entries (byte offsets
    or steps; a conv kernel's offset and window, `align`ed to read as pairs), M1 values per column
    and (a full kernel's) its rows of C and their biases."""
    arrays = [("int", "lospmm_colptr", map(str, colptr)), ("int", "lospmm_cols", map(str, offsets)),
              ("float", "lospmm_vals", float_literal(np.concatenate(values)) if values else [])]
    if rows is not None:
        arrays.append(("int", "lospmm_rows", map(str, rows)))
    if biases is not None:
        arrays.append(("float", "lospmm_bias", float_literal(np.asarray(biases, np.float32))))
    return "".join(f"__device__ {f'__align__({align}) ' if align and array == 'lospmm_cols' else ''}const {ctype} "
                   f"{array}_{name}[] = {{{', '.join(items) or '0'}}};\n" for ctype, array, items in arrays)


def _loop(design, name: str, m1: int, block: str, stores: list[str], setup: str,
          conv: tuple[ConvGeometry, int] | None = None) -> list[str]:
    """The streamed loop's lines after the signature: the thread's columns, the data of `block` (an
    expression: the tile, or a proxy's cluster of it), `setup`, then per column block the M1 sums
    over the block's columns, stored by `stores`. With `conv` (its geometry and output channels) a
    column is an output pixel of a batch of images, each found with its window, and each load is the
    window's, predicated on it (none where every window is inside the image: no padding)."""
    v = design.columns_per_thread
    tile_axis, column_axis = axes(design)
    kind, suffix, lanes = VECTOR_TYPE[v], SUFFIX[v], LANES[v]
    per_block = "blockDim.x" if v == 1 else f"(blockDim.x * {v})"  # the block size is a launch argument
    if conv is not None and v > 1:  # V output pixels a thread, blockDim.x apart: each lane its window and loads
        geometry, m = conv
        count, entries = "total", "  const int2* __restrict__ entries = reinterpret_cast<const int2*>(lospmm_cols_{})"
        head = [f"  const int n0 = blockIdx.{column_axis} * {per_block} + threadIdx.x;\n",
                f"  const int total = batch * {geometry.pixels};\n"]
        column = [lane_windows(geometry, m, "blockDim.x", v)]
        load = ("const int2 e = __ldg(entries + j);  // the column's byte offset from each xp; its window row, column\n"
                + f"      {kind} x;" + "".join(_lane_load(geometry, lane, index) for index, lane in enumerate(lanes)))
        value = "x"
    elif conv is not None:
        geometry, m = conv
        count, entries = "total", "  const int2* __restrict__ entries = reinterpret_cast<const int2*>(lospmm_cols_{})"
        head = [first_column(design, per_block, "n0"), f"  const int total = batch * {geometry.pixels};\n"]
        column = [pixel_window(geometry, m, "    ", bounds=not geometry.windows_inside)]
        load = ("const int2 e = __ldg(entries + j);  // the column's byte offset from xp; its window row, column\n"
                + ("      const float x = __ldg(reinterpret_cast<const float*>(reinterpret_cast<const char*>(xp) + e.x));"
                   if geometry.windows_inside else f"      float x; LOSPMM_LDXR(x, xp, e.x, {WINDOW_INSIDE.format('e.y')});"))
        value = "x"  # not b: the pixel's image is b
    else:
        count, entries = "N", "  const int* __restrict__ cols = lospmm_cols_{}"
        head = [first_column(design, per_block, "n0")]
        column = ["    const float* Bn = B + n;\n    float* Cn = C + n;\n",
                  *(["    const float* p = Bn;\n"] if design.loads == "chained" else [])]
        load = (f"{kind} b; LOSPMM_LDCR{suffix}(b, p, N, __ldg(cols + j));" if design.loads == "chained"
                else f"const {kind} b = lospmm_ld{suffix}(Bn, __ldg(cols + j), N);")
        value = "b"
    return [
        *head,
        f"  const int stride = {f'gridDim.{column_axis} * {per_block}' if design.looped else count};\n",
        f"  const int block = {block};\n",
        f"  const int begin = __ldg(lospmm_colptr_{name} + block), end = __ldg(lospmm_colptr_{name} + block + 1);\n",
        entries.format(name) + ";\n",
        setup,
        f"  for (int n = n0; n < {count}; n += stride) {{\n",
        *column,
        f"    {kind} " + ", ".join(f"acc{i} = {zero_value(v)}" for i in range(m1)) + ";\n",
        f"    const float* __restrict__ vals = lospmm_vals_{name} + (long long)begin * {m1};\n",
        "#pragma unroll 4\n",
        f"    for (int j = begin; j < end; ++j, vals += {m1}) {{\n      {load}\n",
        *(f"      {{ const float a = __ldg(vals + {i}); "
          + " ".join(f"acc{i}{lane} += {value}{lane} * a;" for lane in lanes) + " }\n" for i in range(m1)),
        "    }\n",
        *stores,
        "  }\n}\n"]
