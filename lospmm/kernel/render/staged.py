"""The staged GEMM kernel (design loads="staged", fp32, baked values): B through shared memory.

A block is `tiles_per_block` (G) tiles over the design's N1 = 32·tile_warps columns of C (n =
blockIdx.y·N1 + lane): the threads of slot w (threadIdx.x / N1: tile_warps warps) walk tile g·G + w
of block g. Per chunk of K (the design's staged_rows: 256 rows at N1 = 32, fewer at wider N1, so a
chunk of the union is at most 32 KiB), the block copies the union of its tiles' non-empty columns of
B there into shared memory (each column once, N1 coalesced floats a copy, the columns shared out
among the slots by a loop over a table: straight-line copies doubled the code and ptxas's time;
stored with st.shared at the thread's shared address: through the generic pointer a tile function is
passed, ptxas stored with ST.E), meets at a barrier, and each slot does its tile's multiply-adds of
the chunk reading B from shared memory; a second barrier, and the next chunk. B's traffic through
L2 is each union's instead of each tile's columns (benchmarks/staged_reuse.py estimates the ratio:
1.4-7.6× on the A/B layers at 8 tiles), at the price of the copy's instructions and two barriers a
chunk; a tile's code, fetched once a block, serves its N1 columns (more with more warps a tile). A
tile's sums stay in its threads' registers across the chunks, as many as today's kernel. Threads
past N copy zeros and store nothing (no thread leaves before the last barrier). Rows of A with no
nonzero are stored by extra blocks after the last group, by their first N1 threads.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.geometry import ConvGeometry
from lospmm.kernel.includes import included
from lospmm.kernel.layout import LaunchLayout, proxy_layout
from lospmm.kernel.render.common import (CodegenParams, entry_unit, kernel_name, proxy_nonzeros, sorted_matrix,
                                         tile_columns, units, zero_functions)
from lospmm.kernel.render.conv import WINDOW_INSIDE, checked_conv_weight, pixel_output, pixel_window, window_entries
from lospmm.kernel.render.numbers import Fp32Code
from lospmm.kernel.spec import KernelSource, KernelSpec
from lospmm.kernel.staging import block_tiles, chunk_count, staged_shared_bytes


def staged_kernel(matrix: sp.csr_matrix, tiles, n1: int, params: CodegenParams = CodegenParams(),
                  epilogue: Epilogue = Epilogue(), geometry: ConvGeometry | None = None) -> KernelSource:
    """The staged kernel of `matrix` on `tiles` in `params.design` (loads="staged"), storing through
    `epilogue`. `n1` must be the design's (KernelDesign.fixed_n1: 32 threads for each warp a tile spans):
    a block's tiles share its N1 columns. With `geometry`, the implicit-im2col convolution's (parameters
    X, Y, batch; launched over geometry.n(batch) columns): a block's N1 columns are N1 output pixels,
    each finding its window once, and the copy gathers each union column's input at its window offset
    (zero in the padding: one predicated load per column and pixel, paid once per block where a baked
    conv kernel's tiles each pay it), so the tiles' walks are the GEMM's, from shared memory."""
    design = params.design
    if design.loads != "staged":
        raise ValueError(f"design {design.label}: the staged kernel is the staged designs'")
    if n1 != design.fixed_n1:
        raise ValueError(f"a staged block's tiles share {design.fixed_n1} columns ({design.tile_warps} warps a tile): "
                         f"N1 must be {design.fixed_n1}, got {n1}")
    if params.n1_at_launch:
        raise ValueError(f"design {design.label}: N1 at launch is the baked fp32 kernels' so far")
    a = sorted_matrix(matrix, epilogue)
    m, k = a.shape
    g = geometry
    if g is not None:
        checked_conv_weight(k, g)
    code = Fp32Code(design)
    per_block, rows = design.tiles_per_block, design.staged_rows
    name = kernel_name("lospmm_staged" if g is None else "lospmm_staged_conv", m, k, a.indptr.tobytes(),
                       a.indices.tobytes(), a.data.tobytes(), tiles.rows.tobytes(), tiles.tile_ptr.tobytes(), per_block,
                       rows, params.shard_nnz, *(() if epilogue.empty else ("epilogue", *epilogue.name_parts())),
                       *(() if design.tile_warps == 1 else ("warps", design.tile_warps)),
                       *(() if g is None else ("conv", tuple(vars(g).values()))))
    groups = block_tiles(tiles.num_tiles, per_block)
    bodies = [_group(a, code, tiles, ts, epilogue, n1, rows, g) for ts in groups]
    largest = max([staged for _, _, staged, _ in bodies] + [1])
    shape = (f"M={m} K={k}" if g is None else
             f"Cout={m} Cin={g.cin} {g.h}x{g.w} window {g.kh}x{g.kw} stride={g.stride} pad={g.pad} "
             f"dilation={g.dilation} -> {g.h_out}x{g.w_out},")
    header = (f"// lospmm staged {'' if g is None else 'conv '}kernel {name}: {shape} nnz={a.nnz} M1={tiles.m1} "
              f"tiles={tiles.num_tiles} tiles a block={per_block} N1={n1} rows of K staged={rows} "
              f"shared={largest * n1 * 4} B"
              + (f" bias={bool(epilogue.bias)} activation={epilogue.activation or 'none'}" if not epilogue.empty else ""))
    functions = [f"{tables}LOSPMM_TILE void tile_{t}{_signature(g)} {{\n{text}  LOSPMM_TILE_END\n}}\n"
                 for t, (tables, text, _, _) in enumerate(bodies)]
    zeros = zero_functions(code, tiles, epilogue)
    if g is None:
        head = (f"LOSPMM_KERNEL void {name}(const float* __restrict__ B, float* __restrict__ C, const int N) {{\n"
                f"  __shared__ __align__(16) float Bs[{largest * n1}];\n")
        zero_call = (f"if (threadIdx.x < {n1} && blockIdx.y * {n1} + threadIdx.x < N) "
                     f"zero_{{z}}(C + blockIdx.y * {n1} + threadIdx.x, N)")
        args, preamble = "B, C, N, Bs", code.preamble() + included("staged.cuh")
    else:  # a zeroing block's first N1 threads store their pixels' rows: Y's rows are g.pixels apart
        head = (f"LOSPMM_KERNEL void {name}(const float* __restrict__ X, float* __restrict__ Y, const int batch) {{\n"
                f"  __shared__ __align__(16) float Bs[{largest * n1}];\n"
                f"  const int pixel = blockIdx.y * {n1} + threadIdx.x;\n")
        zero_call = (f"if (threadIdx.x < {n1} && pixel < batch * {g.pixels}) "
                     f"zero_{{z}}({pixel_output(g, m, 'pixel')}, {g.pixels})")
        args, preamble = "X, Y, batch, Bs", code.preamble() + included("staged.cuh") + included("conv.cuh")
    entry = entry_unit(preamble, header, len(groups), _signature(g), zeros, head, args, zero_call, "x")
    layout = LaunchLayout(len(groups) + len(zeros), design.block_threads(n1), 1, 1, "tile-x", per_block)
    spec = KernelSpec(name, "gemm" if g is None else "conv", m, k, tiles.m1, layout, tiles.num_tiles, design, epilogue,
                      g, nnz=int(a.nnz))
    return KernelSource(spec, tuple(units("tile", functions, [cost for _, _, _, cost in bodies], params.shard_nnz,
                                          preamble) + [entry]))


def _signature(geometry: ConvGeometry | None) -> str:
    """A block function's parameters: B, C, N (a convolution's X, Y, batch) and the staged chunk."""
    if geometry is None:
        return "(const float* __restrict__ B, float* __restrict__ C, const int N, float* __restrict__ Bs)"
    return "(const float* __restrict__ X, float* __restrict__ Y, const int batch, float* __restrict__ Bs)"


def _group(a: sp.csr_matrix, code: Fp32Code, tiles, group: list[int], epilogue: Epilogue, n1: int,
           rows_staged: int, geometry: ConvGeometry | None = None) -> tuple[str, str, int, int]:
    """A block's function for the tiles of `group` (the threads of slot w, threadIdx.x / N1, walk
    group[w]), over its N1 columns (a convolution's output pixels) in chunks of `rows_staged` rows of
    K: (its tables of the columns each chunk stages, its body's text, the most columns it stages in
    one chunk, its multiply-adds)."""
    per_tile = []
    for t in group:
        rows = tiles.tile(t)
        sub, cols = tile_columns(a, rows)
        values = code.tile_values(sub.data)
        per_tile.append((rows, [(int(c), [(int(sub.indices[p]), values[p])
                                          for p in range(sub.indptr[c], sub.indptr[c + 1])]) for c in cols]))
    most_rows = max(len(rows) for rows, _ in per_tile)
    out = [_thread_setup(n1, geometry, a.shape[0]),
           "  float " + ", ".join(f"acc{i} = 0.0f" for i in range(most_rows)) + ";\n"]
    # one table a block, its chunks' unions back to back
    staged_most, table, entries = 0, f"lospmm_staged_{group[0]}", []
    for chunk0 in range(0, a.shape[1], rows_staged):
        inside = [[(c, nz) for c, nz in columns if chunk0 <= c < chunk0 + rows_staged] for _, columns in per_tile]
        union = sorted({c for columns in inside for c, _ in columns})
        if not union:
            continue
        staged_most = max(staged_most, len(union))
        place = {c: i for i, c in enumerate(union)}
        if geometry is None:
            start = len(entries)
            entries += [4 * c for c in union]
            # the union's columns (their byte offsets in a row of B, times N at the load) shared out among the slots
            copy = _copy_loop(len(union), code.design.tiles_per_block, n1, f"{table}[{start} + j]")
        else:  # each column's entry: its input's offset from the pixel's window corner, its window row and column
            start = len(entries) // 2
            entries += window_entries(geometry, union)
            copy = _window_copy_loop(len(union), code.design.tiles_per_block, n1, table, start, geometry.windows_inside)
        out.append(f"  // rows {chunk0}..{chunk0 + rows_staged - 1} of K: {len(union)} columns of B staged\n"
                   f"  {copy}\n"
                   "  __syncthreads();\n")
        # each slot's part by a chain of tests, not a switch: a switch's jump table is a compiler-generated
        # constant, one a chunk, and 72 chunks × 49 blocks of them passed what a kernel may hold
        for w, columns in enumerate(inside):
            if columns:
                lines = [_shared_read(code, j, place[c], n1, nz) for j, (c, nz) in enumerate(columns)]
                out.append(f"  if (slot == {w}) {{\n" + "".join(lines) + "  }\n")
        out.append("  __syncthreads();\n")
    target = {} if geometry is None else {"out": "Yb", "stride": str(geometry.pixels)}
    for w, (rows, _) in enumerate(per_tile):
        out.append(f"  if (live && slot == {w}) {{\n" + "".join("  " + code.store(i, int(r), epilogue, **target)
                                                             for i, r in enumerate(rows)) + "  }\n")
    aligned = "" if geometry is None else "__align__(8) "  # read as int2 pairs
    tables = (f"__device__ {aligned}const int {table}[{len(entries)}] = {{{', '.join(map(str, entries))}}};\n"
              if entries else "")
    return tables, "".join(out), staged_most, int(sum(len(nz) for _, columns in per_tile for _, nz in columns))


def staged_proxy(m: int, k: int, clusters, params: CodegenParams = CodegenParams()) -> KernelSource:
    """The M1 proxy (§5.1) in a staged design: blocks of G tiles over the design's N1 columns (its
    fixed_n1, the threads of each tile), tile slot w of block g running the proxy function of tile
    g·G + w's cluster (`cluster_of`, a launch argument as for every proxy) or, past the last tile, only
    the copies and barriers. Per chunk of K (the design's staged_rows) the block copies as many
    columns of B as the full kernel's block g copies there (`clusters.staged_counts`, from the real
    tiles: the copies and B's L2 traffic are the full kernel's) and meets at its barriers; each
    cluster's NNC_p loads of CPL multiply-adds read B from shared memory at literal offsets in the
    chunk of their column, as the full kernel's do. Its shared memory is the full kernel's (the
    largest union), declared statically; Eq. 6's padding is added on top of it at launch only where
    it needs more (stages.pad.proxy_dynamic_shared). Its output is meaningless, its memory accesses
    and barriers are the full kernel's in kind."""
    design = params.design
    if design.loads != "staged":
        raise ValueError(f"design {design.label}: the staged proxy is the staged designs'")
    counts = np.asarray(clusters.staged_counts, np.int32)
    n1, rows = design.fixed_n1, design.staged_rows
    if clusters.staged_columns != n1:  # its shared memory at launch is reckoned from them (pad.proxy_dynamic_shared)
        raise ValueError(f"design {design.label}: its clusters were sized for {clusters.staged_columns} columns a "
                         f"block, the design has {n1}")
    tiles, per_block, chunks = len(clusters.cluster_of), design.tiles_per_block, chunk_count(k, rows)
    if counts.shape != (design.blocks_along_a(tiles), chunks):
        raise ValueError(f"the staged proxy needs the copies of each of its {design.blocks_along_a(tiles)} blocks in each of "
                         f"{chunks} chunks of K (ProxyClusters.staged_counts), got shape {counts.shape}")
    code = Fp32Code(design)
    m1 = clusters.m1
    slots = max(1, int(counts.max(initial=0)))  # the full kernel's largest union: its shared memory
    name = kernel_name("lospmm_staged_proxy", m, k, m1, clusters.nnc_p.tobytes(), clusters.cpl.tobytes(),
                       b"".join(c.tobytes() for c in clusters.columns), counts.tobytes(), per_block, rows,
                       params.shard_nnz, *(() if design.tile_warps == 1 else ("warps", design.tile_warps)))
    header = (f"// lospmm staged proxy {name}: M={m} K={k} M1={m1} clusters={clusters.num_clusters} tiles={tiles} "
              f"tiles a block={per_block} N1={n1} rows of K staged={rows} "
              f"shared={staged_shared_bytes(counts, columns=n1)} B NNC_p={clusters.nnc_p.tolist()} "
              f"CPL={clusters.cpl.tolist()}")
    signature = ("(const float* __restrict__ B, float* __restrict__ C, const int N, float* __restrict__ Bs, "
                 "const int* __restrict__ counts)")
    walk = _ProxyWalk(code, m, n1, rows, slots, per_block)
    functions, costs = [], []
    for c in range(clusters.num_clusters):
        cols, nonzeros = proxy_nonzeros(code, clusters, c)
        by_chunk = [[j for j, col in enumerate(cols) if col // rows == chunk] for chunk in range(chunks)]
        functions.append(f"LOSPMM_TILE void proxy_{c}{signature} {{\n" + walk.text(m1, by_chunk, nonzeros)
                         + "  LOSPMM_TILE_END\n}\n")
        costs.append(sum(map(len, nonzeros)))
    idle = (f"LOSPMM_TILE void proxy_idle{signature} {{\n" + walk.text(0, [[] for _ in range(chunks)], [])
            + "  LOSPMM_TILE_END\n}\n")
    table = f"{name}_counts"
    cases = "".join(f"    case {c}: proxy_{c}(B, C, N, Bs, counts); break;\n" for c in range(clusters.num_clusters))
    preamble = code.preamble() + included("staged.cuh")
    entry = (preamble + header + " (entry unit)\n"
             + "".join(f"LOSPMM_TILE void proxy_{c}{signature};\n" for c in range(clusters.num_clusters))
             + f"LOSPMM_TILE void proxy_idle{signature};\n"
             + f"__device__ const int {table}[{counts.size}] = {{{', '.join(map(str, counts.ravel().tolist()))}}};\n"
             + f"LOSPMM_KERNEL void {name}(const float* __restrict__ B, float* __restrict__ C, const int N, "
             f"const int* __restrict__ cluster_of) {{\n"
             f"  __shared__ __align__(16) float Bs[{slots * n1}];\n"
             f"  const int tile = blockIdx.x * {per_block} + threadIdx.x / {n1};\n"
             f"  const int* counts = {table} + blockIdx.x * {chunks};  // the block's copies, chunk by chunk\n"
             f"  switch (tile < {tiles} ? cluster_of[tile] : -1) {{\n{cases}"
             f"    default: proxy_idle(B, C, N, Bs, counts); break;\n  }}\n}}\n")
    spec = KernelSpec(name, "proxy", m, k, m1, proxy_layout(tiles, design), tiles, design)
    return KernelSource(spec, tuple(units("proxy", functions + [idle], costs + [0], params.shard_nnz, preamble)
                                    + [entry]))


class _ProxyWalk:
    """The walk of one tile slot's threads in a staged proxy (N1 columns, chunks of `rows` rows of K,
    a chunk's union at most `slots` columns, `per_block` tiles a block)."""

    def __init__(self, code: Fp32Code, m: int, n1: int, rows: int, slots: int, per_block: int):
        self.code, self.m, self.n1, self.rows, self.slots, self.per_block = code, m, n1, rows, slots, per_block

    def text(self, m1: int, by_chunk: list[list[int]], nonzeros: list) -> str:
        """Per chunk, the block's copies (as many as `counts` says, from rows of the chunk) between its
        barriers, where the chunk copies any, and this slot's loads of the chunk (`by_chunk`: its
        columns' positions) from shared memory with their multiply-adds; then its M1 rows' stores
        (none for an idle slot: m1 = 0)."""
        code, n1, rows, slots = self.code, self.n1, self.rows, self.slots
        out = [_thread_setup(n1)]
        if m1:
            out.append("  float " + ", ".join(f"acc{i} = 0.0f" for i in range(m1)) + ";\n")
        for chunk, positions in enumerate(by_chunk):
            out.append(f"  {{ const int copies = counts[{chunk}];  // rows {chunk * rows}.. of K\n"
                       f"    if (copies) {{\n"
                       f"      {_copy_loop('copies', self.per_block, n1, f'{4 * chunk * rows} + 4 * j')}\n"
                       "      __syncthreads();\n    }\n")
            for place, j in enumerate(positions):  # the block's union holds the slot's columns: a place of it each
                out.append(_shared_read(code, j, place % slots, n1, nonzeros[j]))
            out.append("    if (copies) __syncthreads();\n  }\n")
        if m1:
            out.append(f"  {{ const int r0 = (blockIdx.x * {self.per_block} + slot) * {m1};\n"
                       + "".join("  " + code.store(i, i, None, f"r0 + {i}", f"live && r0 + {i} < {self.m}")
                                 for i in range(m1))
                       + "  }\n")
        return "".join(out)


def _thread_setup(n1: int, geometry: ConvGeometry | None = None, m: int = 0) -> str:
    """A block function's first lines, the kernel's and the proxy's alike: the thread's slot (its
    tile in the block) and column of the block's N1, its column's B and C (a convolution's output
    pixel: its window and Y, of M channels), its address in the chunk."""
    columns = ("  const bool live = n < N;\n  const float* Bn = B + n;\n  float* Cn = C + n;\n" if geometry is None else
               f"  const bool live = n < batch * {geometry.pixels};\n"
               + pixel_window(geometry, m, bounds=not geometry.windows_inside))
    return (f"  const int slot = threadIdx.x / {n1}, lane = threadIdx.x % {n1};  // the block's tile, the thread's column\n"
            f"  const int n = blockIdx.y * {n1} + lane;\n" + columns
            + "  float* Bl = Bs + lane;  // the thread's column of the staged chunk\n"
            "  const unsigned mine = lospmm_shared_address(Bl);\n")


def _copy_loop(count, per_block: int, n1: int, offset: str) -> str:
    """A chunk's copy: `count` columns of B (offset: the j-th one's byte offset in a row of B, times N at
    the load) shared out among the block's `per_block` slots, each stored at its place in the chunk."""
    return (f"for (int j = slot; j < {count}; j += {per_block}) "
            f"LOSPMM_STS(mine, Bl, j * {4 * n1}, live ? lospmm_ld(Bn, {offset}, N) : 0.0f);")


def _window_copy_loop(count: int, per_block: int, n1: int, table: str, start: int, inside: bool = False) -> str:
    """A convolution's chunk copy: `count` union columns (entries `start`.. of `table`: an input offset
    from the pixel's window corner and its window row and column) shared out among the block's slots,
    each the pixel's input there, zero in the padding or past the last pixel, stored at its place
    (`inside`: no padding, every window inside the image: only the last pixel's test)."""
    test = "live ? 1u : 0u" if inside else f"(live ? 1u : 0u) & {WINDOW_INSIDE.format('e.y')}"
    return (f"for (int j = slot; j < {count}; j += {per_block}) {{ "
            f"const int2 e = reinterpret_cast<const int2*>({table})[{start} + j]; float x; "
            f"LOSPMM_LDXR(x, xp, e.x, {test}); "
            f"LOSPMM_STS(mine, Bl, j * {4 * n1}, x); }}")


def _shared_read(code: Fp32Code, j: int, place: int, n1: int, nonzeros) -> str:
    """One column's B from the chunk's `place` in shared memory and its multiply-adds."""
    return (f"    {{ float b{j}; LOSPMM_LDS(b{j}, mine, Bl, {4 * place * n1}); "
            + " ".join(code.multiply_adds(j, nonzeros, None)) + " }\n")
