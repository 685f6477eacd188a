"""The sliced GEMM kernel (design k_slices = W > 1: a baked fp32 tile's K split across a block's warps)
and its proxy.

A block is W groups of N1 threads over the same N1·V columns of C (n = column block·N1·V + lane·V,
lane = threadIdx.x % N1); group `slice` = threadIdx.x / N1 walks the slice-th of W consecutive runs of
the tile's non-empty columns, balanced by their loads and multiply-adds (`column_slices`), with the
baked kernel's straight-line code (Alg. 2, one walk; based or chained loads, prefetch as the baked
kernel). A tile's serial walk is so about W times shorter, and W times as many warps walk it: on the
H200 the flow's tiles were bound by the longest walk at 4-33% achieved occupancy.

A row only one slice touches is stored by that slice. A row that several touch is reduced through
shared memory: each touching slice but the row's owner stores its partial sum in its slot (slice, the
row's place among the tile's reduced rows) of N1·V floats (the lane's V at lane·V), the block meets at
a barrier, and the owner (one of the touching slices, chosen to spread the rows over them) adds the
others' partials to its own in slice order and stores the row through the epilogue. The accumulators
are declared once for the whole function, so a slice's sums stay in registers across the barrier.
Threads past N load column 0 of B (never past it) and store nothing: no thread leaves before the barrier.
Rows of A with no nonzero are stored by extra blocks after the last tile, by their first N1 threads.

The implicit-im2col convolution in this design (sliced_conv_kernel) slices and reduces its tiles alike;
each B value is its window's input as render.conv's kernel of V lanes loads it (V output pixels a thread,
n1 apart, each its own window, zero in the padding), and each owner stores its rows to its pixels' NCHW Y.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from lospmm.kernel.design import conv_design
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.geometry import ConvGeometry
from lospmm.kernel.includes import included
from lospmm.kernel.layout import LaunchLayout, proxy_layout
from lospmm.kernel.render.common import (CodegenParams, axes, checked_tile, entry_unit, kernel_name, proxy_nonzeros,
                                         sorted_matrix, straight_line, tile_columns, tile_costs, units, zero_blocks,
                                         zero_functions)
from lospmm.kernel.render.conv import checked_conv_weight, lane_windows, lane_zero_stores, window_bit
from lospmm.kernel.render.numbers import LANES, Fp32Code
from lospmm.kernel.spec import KernelSource, KernelSpec


def column_slices(columns: list[int], nonzeros: list, slices: int) -> list[tuple[list[int], list]]:
    """A tile's columns (and their nonzeros) in `slices` consecutive runs, each about an equal share of
    the tile's work (a column weighs its load and its multiply-adds: 1 + its nonzeros); a run may be
    empty where the tile has fewer columns than slices. Every column is in exactly one run, in order."""
    weights = np.array([1 + len(nz) for nz in nonzeros], np.float64)
    ends = np.cumsum(weights) - weights / 2  # a column goes to the slice its middle falls in
    total = float(weights.sum())
    owner = np.minimum((ends * slices // total).astype(int), slices - 1) if len(columns) else np.zeros(0, int)
    return [([c for c, o in zip(columns, owner) if o == s], [nz for nz, o in zip(nonzeros, owner) if o == s])
            for s in range(slices)]


def row_owners(parts: list[tuple[list[int], list]], num_rows: int) -> tuple[list[list[int]], list[int], list[int]]:
    """Per row of the tile: the slices that touch it (in order), the row's owner (the slice that stores
    it: a touching slice, the one owning fewest reduced rows so far, so that the sums are spread; slice
    0 for a row none touches) and the rows more than one slice touches (reduced through shared memory),
    in row order."""
    touched = [{i for nz in nzs for i, _ in nz} for _, nzs in parts]
    by_row = [[s for s in range(len(parts)) if i in touched[s]] for i in range(num_rows)]
    reduced = [i for i in range(num_rows) if len(by_row[i]) > 1]
    load = [0] * len(parts)
    owner = []
    for i in range(num_rows):
        if len(by_row[i]) > 1:
            s = min(by_row[i], key=lambda t: (load[t], t))
            load[s] += 1
        else:
            s = by_row[i][0] if by_row[i] else 0
        owner.append(s)
    return by_row, owner, reduced


def sliced_body(code: Fp32Code, columns: list[int], nonzeros: list, num_rows: int, prefetch: int, store,
                slot_bytes: str, load=None) -> tuple[list[str], int]:
    """A tile's (or cluster's) function body in the sliced design: its accumulators, each slice's
    straight-line walk of its run of columns (under `slice == s`) with its partial sums of the reduced
    rows stored to its slots, the barrier (where any row is reduced), and each owner's sums and stores
    (`store(i)`: row i's store statement, of its accumulator acc{i}) for its live threads. `slot_bytes`:
    the bytes between two slots (a literal, or an expression of N1 read at launch); `load`: the statement
    that defines b{j} (straight_line's; default code.load: B's row). Returns the lines and how many rows it
    reduces (its slots per slice)."""
    slices = code.design.k_slices
    parts = column_slices(columns, nonzeros, slices)
    by_row, owner, reduced = row_owners(parts, num_rows)
    place = {i: q for q, i in enumerate(reduced)}
    suffix = {1: "", 2: "2", 4: "4"}[code.v]

    def offset(s: int, i: int) -> str:
        return f"{s * len(reduced) + place[i]} * {slot_bytes}"

    declared = code.declarations(num_rows)
    out = list(declared)
    for s, (cols, nzs) in enumerate(parts):
        partials = [f"    lospmm_part_st{suffix}(mine, Pl, {offset(s, i)}, acc{i});\n"
                    for i in reduced if s in by_row[i] and owner[i] != s]
        if not cols:
            continue
        body, _ = straight_line(code, cols, nzs, num_rows, prefetch, load or code.load)
        out.append(f"  if (slice == {s}) {{\n" + "".join(body[len(declared):]) + "".join(partials) + "  }\n")
    if reduced:
        out.append("  __syncthreads();\n")
    finals = []
    for s in range(slices):
        lines = []
        for i in range(num_rows):
            if owner[i] != s:
                continue
            for t in (by_row[i] if i in place else ()):
                if t != s:
                    lines.append(f"    {{ const {code.vector} q = lospmm_part_ld{suffix}(mine, Pl, {offset(t, i)}); "
                                 + " ".join(f"acc{i}{lane} += q{lane};" for lane in LANES[code.v]) + " }\n")
            lines.append("  " + store(i))
        if lines:
            finals.append(f"    if (slice == {s}) {{\n" + "".join(lines) + "    }\n")
    if finals:
        out.append("  if (live) {\n" + "".join(finals) + "  }\n")
    return out, len(reduced)


def _tile_functions(code: Fp32Code, a: sp.csr_matrix, tiles, n1: int, prefetch: int, signature: str, store,
                    load=None, windows: str = "") -> tuple[list[str], int]:
    """Each tile's function in the sliced design (`store(i, row)`: row i's store statement, of A's row
    `row`; `load` and `windows`: a conv kernel's window loads and its lanes' windows, found first), and the
    most rows any tile reduces (its slots per slice)."""
    functions, most = [], 0
    for t in range(tiles.num_tiles):
        rows = tiles.tile(t)
        sub, cols = tile_columns(a, rows)
        values = code.tile_values(sub.data)
        nonzeros = [[(int(sub.indices[p]), values[p]) for p in range(sub.indptr[c], sub.indptr[c + 1])] for c in cols]
        body, reduced = sliced_body(code, [int(c) for c in cols], nonzeros, len(rows), prefetch,
                                    lambda i, rows=rows: store(i, int(rows[i])), str(4 * n1 * code.v), load)
        most = max(most, reduced)
        functions.append("".join([f"LOSPMM_TILE void tile_{t}{signature} {{\n", _thread_setup(str(n1)), windows,
                                  *body, "  LOSPMM_TILE_END\n}\n"]))
    return functions, most


def _signature() -> str:
    """A tile (or cluster) function's parameters: the thread's B and C, N, its lane's partial slots, whether
    its columns are inside N."""
    return ("(const float* __restrict__ Bn, float* __restrict__ Cn, const int N, float* __restrict__ Pl, "
            "const bool live)")


def _thread_setup(lanes: str) -> str:
    """A tile function's first lines: its slice and its lane's shared address."""
    return (f"  const int slice = threadIdx.x / ({lanes});  // the slice of the tile's columns this group walks\n"
            "  const unsigned mine = lospmm_partial_address(Pl);\n")


def _kernel_head(name: str, lanes: str, v: int, design, partials: str, extra_params: str = "") -> str:
    """The kernel's signature and per-thread set-up: its lane (column) and slice's B and C."""
    column_axis = axes(design)[1]
    return (f"LOSPMM_KERNEL void {name}(const float* __restrict__ B, float* __restrict__ C, const int N{extra_params}) {{\n"
            + partials
            + (f"  if (N % {v} != 0) __trap();\n" if v > 1 else "")
            + f"  const int lanes = {lanes};\n"
            f"  const int lane = threadIdx.x % lanes;\n"
            f"  const int n = blockIdx.{column_axis} * lanes * {v} + lane * {v};\n"
            "  const bool live = n < N;  // a thread past N walks column 0 and stores nothing\n"
            "  const float* Bn = B + (live ? n : 0);\n"
            "  float* Cn = C + n;\n"
            "  float* Pl = Ps + lane * " + str(v) + ";\n")


def _preamble(code: Fp32Code) -> str:
    return code.preamble() + included("sliced.cuh")


def sliced_kernel(matrix: sp.csr_matrix, tiles, n1: int, params: CodegenParams = CodegenParams(),
                  epilogue: Epilogue = Epilogue()) -> KernelSource:
    """The sliced kernel of `matrix` on `tiles` in blocks of W·`n1` threads (W = the design's k_slices),
    storing through `epilogue`. ValueError where the design is not sliced, N1 is asked at launch, or the
    block cannot be launched (KernelDesign.block_problem)."""
    design = params.design
    if design.k_slices == 1:
        raise ValueError(f"design {design.label}: the sliced kernel is the sliced designs' (slices=W)")
    if params.n1_at_launch:
        raise ValueError(f"design {design.label}: N1 at launch is the baked fp32 kernels' so far")
    checked_tile(n1)
    problem = design.block_problem(tiles.m1, n1)
    if problem:
        raise ValueError(f"design {design.label}: {problem}")
    code = Fp32Code(design)
    a = sorted_matrix(matrix, epilogue)
    m, k = a.shape
    v, slices = design.columns_per_thread, design.k_slices
    name = kernel_name("lospmm_sliced", m, k, a.indptr.tobytes(), a.indices.tobytes(), a.data.tobytes(),
                       tiles.rows.tobytes(), tiles.tile_ptr.tobytes(), n1, params.prefetch, params.shard_nnz,
                       design.code_key, *(() if epilogue.empty else ("epilogue", *epilogue.name_parts())))
    functions, most = _tile_functions(code, a, tiles, n1, params.prefetch, _signature(),
                                      lambda i, row: code.store(i, row, epilogue))
    floats = max(1, slices * most * n1 * v)
    header = (f"// lospmm sliced kernel {name}: M={m} K={k} nnz={a.nnz} M1={tiles.m1} N1={n1} slices={slices} "
              f"tiles={tiles.num_tiles} prefetch={params.prefetch} design={design.code_label} "
              f"shared={4 * floats} B"
              + (f" bias={bool(epilogue.bias)} activation={epilogue.activation or 'none'}" if not epilogue.empty else ""))
    zeros = zero_functions(code, tiles, epilogue)
    head = _kernel_head(name, str(n1), v, design, f"  __shared__ __align__(16) float Ps[{floats}];\n")
    preamble = _preamble(code)
    entry = entry_unit(preamble, header, tiles.num_tiles, _signature(), zeros, head, "Bn, Cn, N, Pl, live",
                       f"if (live && threadIdx.x < {n1}) zero_{{z}}(Cn, N)", axes(design)[0])
    layout = LaunchLayout(tiles.num_tiles + len(zeros), design.block_threads(n1), v, 1, design.order, slices)
    spec = KernelSpec(name, "gemm", m, k, tiles.m1, layout, tiles.num_tiles, design, epilogue, nnz=int(a.nnz))
    return KernelSource(spec, tuple(units("tile", functions, tile_costs(a, tiles), params.shard_nnz, preamble)
                                    + [entry]))


def sliced_conv_kernel(matrix: sp.csr_matrix, tiles, n1: int, geometry: ConvGeometry, epilogue: Epilogue = Epilogue(),
                       params: CodegenParams = CodegenParams()) -> KernelSource:
    """The sliced design's implicit-im2col conv kernel of `matrix` on `tiles` (parameters X, Y, batch;
    launched over geometry.n(batch) columns in blocks of W·`n1` threads): the GEMM's slices and reduction,
    each B value its window's input (V output pixels a thread, n1 apart, each its own window and loads).
    A thread past the last pixel walks pixel 0's window (inside X), meets the barrier and stores nothing.
    ValueError where the design is not a sliced conv form, or the block cannot be launched."""
    design = params.design
    if design.k_slices == 1 or design != conv_design(design):
        raise ValueError(f"design {design.label}: the sliced conv kernel is a sliced design's conv form "
                         f"(grid order, columns per thread, slices)")
    if params.n1_at_launch:
        raise ValueError("an implicit-im2col conv kernel bakes its N1 in (N1 at launch is the GEMM kernels')")
    checked_tile(n1)
    problem = design.block_problem(tiles.m1, n1)
    if problem:
        raise ValueError(f"design {design.label}: {problem}")
    g = geometry
    code = Fp32Code(design, chain_from="")  # each load one instruction from its lane's window corner
    a = sorted_matrix(matrix, epilogue)
    m, k = a.shape
    checked_conv_weight(k, g)
    v, slices, hwo = design.columns_per_thread, design.k_slices, g.pixels
    name = kernel_name("lospmm_sliced_conv", m, k, a.indptr.tobytes(), a.indices.tobytes(), a.data.tobytes(),
                       tiles.rows.tobytes(), tiles.tile_ptr.tobytes(), n1, params.prefetch, params.shard_nnz,
                       design.code_key, tuple(vars(g).values()), *epilogue.name_parts())

    def load(j: int, column: int, previous: int) -> str:
        return code.window_load(j, g.window_offset(column)[0], *window_bit(g, column), g.windows_inside)

    signature = ("(const float* __restrict__ X, float* __restrict__ Y, const int n, const int total, "
                 "float* __restrict__ Pl, const bool live)")
    functions, most = _tile_functions(code, a, tiles, n1, params.prefetch, signature,
                                      lambda i, row: code.pixel_stores(i, row, epilogue, hwo), load,
                                      lane_windows(g, m, n1, v))
    floats = max(1, slices * most * n1 * v)
    header = (f"// lospmm sliced conv kernel {name}: Cout={m} Cin={g.cin} {g.h}x{g.w} window {g.kh}x{g.kw} "
              f"stride={g.stride} pad={g.pad} dilation={g.dilation} -> {g.h_out}x{g.w_out}, nnz={a.nnz} "
              f"M1={tiles.m1} N1={n1} slices={slices} tiles={tiles.num_tiles} prefetch={params.prefetch} "
              f"design={design.code_label} shared={4 * floats} B bias={bool(epilogue.bias)} "
              f"activation={epilogue.activation or 'none'}")
    zeros = [("(float* __restrict__ Y, const int n, const int total)",
              "".join(lane_zero_stores(code, g, m, n1, v, rows, epilogue)))
             for rows in zero_blocks(tiles.empty_rows, max(tiles.m1, 1))]
    tile_axis, column_axis = axes(design)
    head = (f"LOSPMM_KERNEL void {name}(const float* __restrict__ X, float* __restrict__ Y, const int batch) {{\n"
            f"  __shared__ __align__(16) float Ps[{floats}];\n"
            f"  const int lane = threadIdx.x % {n1};\n"
            f"  const int total = batch * {hwo};\n"
            f"  const int first = blockIdx.{column_axis} * {n1 * v} + lane;\n"
            "  const bool live = first < total;  // a thread past the last pixel walks pixel 0 and stores nothing\n"
            "  const int n = live ? first : 0;\n"
            f"  float* Pl = Ps + lane * {v};\n")
    preamble = _preamble(code) + ("" if g.windows_inside else included("window.cuh"))
    entry = entry_unit(preamble, header, tiles.num_tiles, signature, zeros, head, "X, Y, n, total, Pl, live",
                       f"if (live && threadIdx.x < {n1}) zero_{{z}}(Y, n, total)", tile_axis)
    layout = LaunchLayout(tiles.num_tiles + len(zeros), design.block_threads(n1), v, 1, design.order, slices)
    spec = KernelSpec(name, "conv", m, k, tiles.m1, layout, tiles.num_tiles, design, epilogue, g, nnz=int(a.nnz))
    return KernelSource(spec, tuple(units("tile", functions, tile_costs(a, tiles), params.shard_nnz, preamble)
                                    + [entry]))


def sliced_proxy(m: int, k: int, clusters, params: CodegenParams = CodegenParams()) -> KernelSource:
    """The M1 proxy (§5.1) in a sliced design: one function per cluster, its NNC_p loads of CPL
    multiply-adds (proxy_nonzeros) sliced and reduced as the full kernel's tiles are, its rows stored to
    rows tile·M1 + i of C (past M skipped); N1 (its slots' stride too) is read at launch, and its
    partial sums are dynamic shared memory: launched with at least KernelDesign.slice_shared_bytes(M1, N1)
    (stages.pad.proxy_dynamic_shared), which also stands for the full kernel's in its occupancy."""
    design = params.design
    if design.k_slices == 1:
        raise ValueError(f"design {design.label}: the sliced proxy is the sliced designs'")
    code = Fp32Code(design)
    m1, v, slices = clusters.m1, design.columns_per_thread, design.k_slices
    name = kernel_name("lospmm_sliced_proxy", m, k, m1, clusters.nnc_p.tobytes(), clusters.cpl.tobytes(),
                       b"".join(c.tobytes() for c in clusters.columns), params.prefetch, params.shard_nnz,
                       design.code_key)
    header = (f"// lospmm sliced proxy {name}: M={m} K={k} M1={m1} slices={slices} clusters={clusters.num_clusters} "
              f"NNC_p={clusters.nnc_p.tolist()} CPL={clusters.cpl.tolist()} design={design.code_label}")
    tile_axis = axes(design)[0]
    lanes = f"blockDim.x / {slices}"
    functions, costs = [], []
    for c in range(clusters.num_clusters):
        cols, nonzeros = proxy_nonzeros(code, clusters, c)
        body, _ = sliced_body(code, cols, nonzeros, m1, params.prefetch,
                              lambda i: code.store(i, i, None, f"r0 + {i}", f"r0 + {i} < {m}"),
                              f"(int)(blockDim.x / {slices} * {4 * v})")
        functions.append("".join([f"LOSPMM_TILE void proxy_{c}{_signature()} {{\n", _thread_setup(lanes),
                                  f"  const int r0 = blockIdx.{tile_axis} * {m1};\n", *body, "  LOSPMM_TILE_END\n}\n"]))
        costs.append(len(cols) * int(clusters.cpl[c]))
    cases = "".join(f"    case {c}: proxy_{c}(Bn, Cn, N, Pl, live); break;\n" for c in range(clusters.num_clusters))
    preamble = _preamble(code)
    entry = (preamble + header + " (entry unit)\n"
             + "".join(f"LOSPMM_TILE void proxy_{c}{_signature()};\n" for c in range(clusters.num_clusters))
             + _kernel_head(name, lanes, v, design, "  LOSPMM_PARTIALS(Ps);\n", ", const int* __restrict__ cluster_of")
             + f"  switch (cluster_of[blockIdx.{tile_axis}]) {{\n{cases}    default: break;\n  }}\n}}\n")
    spec = KernelSpec(name, "proxy", m, k, m1, proxy_layout(len(clusters.cluster_of), design),
                      len(clusters.cluster_of), design)
    return KernelSource(spec, tuple(units("proxy", functions, costs, params.shard_nnz, preamble) + [entry]))
