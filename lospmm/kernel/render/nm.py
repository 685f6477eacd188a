"""The data-driven N:M kernel (design `nm`, in the manner of NM-SpMM with A and B swapped): A's kept
values and their columns are data (lospmm.kernel.nm lays them out), filled into the module's
globals when it is loaded (KernelSpec.module_data); one unit of O(1) code per pattern and blocking,
whatever the layer's size.

Each block computes block_rows × block_columns of C. Per chunk of K (whole groups of M columns),
its threads copy the chunk's rows of B (or, where the tiling gathers, only the rows its slots read,
as the block's list for the chunk says), the block's slots of A's values and their rows into
shared memory (cp.async, two stages: the next chunk is on its way while this one is multiplied);
then per slot each thread reads its rows' values (vectors of 4) and, per group of rows that share
the slot's column, one B vector of its columns from that row of the chunk, and does rows ×
columns multiply-adds. A thread's columns are vectors of 4 spaced 4·block_columns/thread_columns
apart, so that a warp's shared-memory reads are consecutive. B and C are read and written as
float4 where N is a multiple of 4 and both are 16-byte aligned, element by element otherwise. A
stage's copies are straight code (copy_setup, vector_copies, block_copies): a block has one thread a
column, so the renderer knows each thread's share, and a copy is an address and a cp.async.

With a convolution's geometry it is the implicit-im2col N:M kernel: B's column is an output pixel,
and each thread of a block copies its one pixel's input at each staged row's window entry (the int2
table of render.conv.window_entries: an offset from the window's corner and its place in the
window, whose bit in the pixel's window mask says whether it lies inside the image; a window of more
than 64 places keeps a row and a column mask), zero in the padding or past the last pixel: 4 bytes a
cp.async in fp32; a 16-bit input is loaded and stored (cp.async copies 4 bytes at least), so its copy
is not overlapped with the multiply as the fp32 one is. Each output goes to NCHW Y, a half one rounded once from the fp32
epilogue. The slots' loop is the GEMM's."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from lospmm.kernel.design import KernelDesign
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.geometry import ConvGeometry
from lospmm.kernel.includes import included
from lospmm.kernel.layout import LaunchLayout
from lospmm.kernel.nm import NMTiling, nm_operands
from lospmm.kernel.render.common import kernel_name
from lospmm.kernel.render.conv import (WINDOW_INSIDE, checked_conv_weight, mask_name, mask_type, pixel_output, pixel_window,
                                       window_entries, window_mask_lines)
from lospmm.kernel.render.numbers import epilogue_scalar
from lospmm.kernel.spec import KernelSource, KernelSpec

LANE = "xyzw"


def nm_kernel(matrix: sp.csr_matrix, tiling: NMTiling, design: KernelDesign,
              epilogue: Epilogue = Epilogue(), conv: ConvGeometry | None = None) -> KernelSource:
    """The N:M kernel of `matrix` (which must hold tiling's pattern: ValueError naming the group
    that does not) in `tiling`'s blocking, storing through `epilogue`; with `conv`, the convolution's
    implicit-im2col N:M kernel (in the design's number format)."""
    a = sp.csr_matrix(matrix, dtype=np.float32)
    a.sort_indices()
    t = tiling
    if conv is not None:
        if not design.serves_conv:
            raise ValueError(f"design {design.label}: no implicit-im2col N:M kernel (the sparse tensor cores' "
                             f"convolutions are im2col GEMMs)")
        checked_conv_weight(a.shape[1], conv)
        if epilogue.bias and len(epilogue.bias) != a.shape[0]:
            raise ValueError(f"bias has {len(epilogue.bias)} values for {a.shape[0]} output channels")
    operands = nm_operands(a, t)  # refuses an A without the pattern before anything is rendered
    spec, sizes = untiled_spec("lospmm_nm", a, t, design, epilogue, operands, conv=conv)
    return KernelSource(spec, (_source(spec, t, sizes, epilogue),))


def untiled_spec(prefix: str, a: sp.csr_matrix, tiling, design: KernelDesign, epilogue: Epilogue,
                 operands: dict, *name_parts, conv: ConvGeometry | None = None) -> tuple[KernelSpec, dict[str, int]]:
    """The spec of a kernel that keeps A as module data in `tiling`'s blocking (a block a row block and
    a thread a column of it; with `conv`, an output pixel), and the size of each of its module globals
    (from `operands`)."""
    m, k = a.shape
    geometry = () if conv is None else ("conv", tuple(vars(conv).values()))
    name = kernel_name(prefix, m, k, a.indptr.tobytes(), a.indices.tobytes(), a.data.tobytes(),
                       tuple(tiling.facts().items()), *name_parts, *geometry, *epilogue.name_parts())
    layout = LaunchLayout(tiling.row_blocks(m), tiling.threads, 1, 1, "tile-x")
    spec = KernelSpec(name, "gemm" if conv is None else "conv", m, k, tiling.block_rows, layout,
                      tiling.row_blocks(m), design, epilogue, conv, nm=tiling, nnz=int(a.nnz))
    return spec, {symbol: operands[role].size for role, symbol in spec.module_symbols.items() if role in operands}


def _source(spec: KernelSpec, t: NMTiling, sizes: dict[str, int], epilogue: Epilogue) -> str:
    """The kernel's text in its number format: fp32 (B, C and the sums in float), or a half format
    (B and C 16-bit; sums packed, one fma.rn.f16x2 / .bf16x2 per slot and pair of columns, or in fp32
    on the unpacked pair, fmaf in slot order as the exact model sums; the epilogue in fp32, one
    rounding at the pack)."""
    name, m, k = spec.name, spec.m, spec.k
    number = spec.number
    half, packed, dtype = number.is_half, number.is_half and number.packed, spec.dtype
    ctype = "lospmm_h16" if half else "float"
    symbols = spec.module_symbols
    bm, bn, tm, tn, kc, kept, g = t.block_rows, t.block_columns, t.thread_rows, t.thread_columns, t.chunk, t.kept, \
        t.index_rows
    staged = t.staged  # rows of B a stage holds; the zero row a spare slot reads follows them
    threads, per_row = t.threads, bn // tn
    span = 4 * per_row  # between a thread's column vectors
    per_slot = bm // g  # index entries per slot
    per_copy = 8 if half else 4  # elements of B in one 16-byte copy
    globals_ = [f"__device__ __align__(16) float {symbols['values']}[{sizes[symbols['values']]}];\n",
                f"__device__ __align__(16) unsigned char {symbols['index']}[{sizes[symbols['index']]}];\n"]
    if t.gathers:
        globals_.append(f"__device__ __align__(16) unsigned char {symbols['rows']}[{sizes[symbols['rows']]}];\n")
    if epilogue.bias:
        globals_.append(f"__device__ float {symbols['bias']}[{m}];\n")
    # the row of B staged row r holds: the chunk's column r, or the block's list's r-th entry (past the
    # list's end the chunk's width: nothing to copy, the row stays zero)
    row_of = [f"const unsigned char* listed = {symbols['rows']} + slab * {t.rows_slab};\n"] if t.gathers else []

    def row_test(r: str, bounded: bool = True) -> str:
        """Staged row `r`'s row of B (kr) and whether it holds one (in): a listed row, where the block's
        list has not ended (its entries are rows of the chunk, so never past K); else the chunk's row r,
        where it is not past K (`bounded`: a stage that can run past K, a ragged last chunk)."""
        if t.gathers:
            return f"const int lr = listed[{r}], kr = k0 + lr; const bool in = lr < {kc}"
        return f"const int kr = k0 + {r}" + (f"; const bool in = kr < {k}" if bounded else "")

    geometry = spec.conv
    window = f"{name}_window"  # a convolution's column entries: two ints each (render.conv.window_entries)
    if geometry is not None:
        if threads != bn:  # each thread copies its one pixel's column of every staged row
            raise ValueError(f"N:M conv kernel {t.label}: {threads} threads for {bn} columns a block")
        # one mask of the pixel's window places inside the image (render.conv.window_mask_lines, none where
        # the pixel is past N), tested with one shift a gather; no padding: every window is inside
        # (ConvGeometry.windows_inside), no test; past 64 places, its row and column masks apart
        flat = not geometry.windows_inside and mask_type(geometry) is not None
        mask = mask_type(geometry) or "unsigned"
        globals_.append(f"__device__ __align__(8) const int {window}[{2 * k}] = "
                        f"{{{', '.join(map(str, window_entries(geometry, range(k), spec.element_bytes, flat)))}}};\n")
        head = (f"__device__ __forceinline__ void stage_{name}({ctype}* Bs, float* As, unsigned char* Is, "
                f"const {ctype}* __restrict__ X, const {ctype}* xp, const unsigned rows_ok, const unsigned cols_ok, "
                f"const {mask} window_ok, const bool live, const int k0, "
                f"const long long slab) {{\n")
        # the thread's pixel's input at each staged row's window entry; zero in the padding, past the
        # last pixel, or past K (tested only where a stage can run past K, or a list can end early)
        fill = (f"    Bs[r * {bn} + tid] = inside ? *(const lospmm_h16*)((const char*)xp + e.x) : (lospmm_h16)0;  "
                f"// a 16-bit input: no asynchronous copy that small\n" if half else
                f"    lospmm_cp4(Bs + r * {bn} + tid, inside ? (const void*)((const char*)xp + e.x) : (const void*)X, "
                f"inside ? 4 : 0);\n")
        bounded = t.gathers or k % kc != 0
        row = [f"    {row_test('r', bounded)};\n"]
        if geometry.windows_inside:
            test = "live"
        elif flat:  # live is in the mask
            test = "((window_ok >> e.y) & 1)"
        else:
            test = "live && " + WINDOW_INSIDE.format("e.y")
        copy_b = ["#pragma unroll\n", f"  for (int r = 0; r < {staged}; ++r) {{\n", *row,
                  f"    const int2 e = reinterpret_cast<const int2*>({window})[{'in ? kr : 0' if bounded else 'kr'}];\n",
                  f"    const bool inside = {'in && ' if bounded else ''}{test};\n",
                  fill,
                  "  }\n"]
    else:
        element_copy = (
            ["    #pragma unroll 1\n", f"    for (int i = tid; i < {staged * bn}; i += {threads}) {{  // a 16-bit element: no asynchronous copy that small\n",
             f"      const int r = i / {bn}, q = i % {bn}, col = col0 + q; {row_test('r')} && col < N;\n",
             f"      Bs[r * {bn} + q] = in ? B[(long long)kr * N + col] : (lospmm_h16)0;\n", "    }\n"]
            if half else
            ["    #pragma unroll 1\n", f"    for (int i = tid; i < {staged * bn}; i += {threads}) {{\n",
             f"      const int r = i / {bn}, q = i % {bn}, col = col0 + q; {row_test('r')} && col < N;\n",
             f"      lospmm_cp4(Bs + r * {bn} + q, in ? B + (long long)kr * N + col : B, in ? 4 : 0);\n", "    }\n"])
        head = (f"__device__ __forceinline__ void stage_{name}({ctype}* Bs, float* As, unsigned char* Is, "
                f"const {ctype}* __restrict__ B, const int N, const int k0, const int col0, const long long slab, "
                f"const bool vec, const {ctype}* bcol, const unsigned kbytes, const int live) {{\n")
        copy_b = ["  if (vec) {\n", *(f"    {line}" for line in vector_copies(
            staged, k, kc, bn, bn, threads, per_copy, ctype, t.gathers)),
                  "  } else {\n", *element_copy, "  }\n"]
    stage = "".join([
        head,
        "  const int tid = threadIdx.x;\n",
        *(f"  {line}" for line in row_of),
        *copy_b,
        f"  const float* av = {symbols['values']} + slab * {kept * bm};\n",
        *block_copies(kept * bm // 4, threads, "As", "av", 4),
        f"  const unsigned char* ai = {symbols['index']} + slab * {t.slab};\n",
        *block_copies(t.slab // 16, threads, "Is", "ai", 16),
        "}\n"])
    # the sums: per row and column a float, or per row and pair of columns a packed pair
    columns = tn // 2 if packed else tn
    acc = [[f"c{i}_{j}" for j in range(columns)] for i in range(tm)]
    slot = []
    for q in range(tm // 4):
        slot.append(f"      const float4 a{q} = *(const float4*)(as + p * {bm} + {4 * q});\n")
    for group in range(tm // g):
        slot.append(f"      {{ const {ctype}* br = bs + is[p * {per_slot} + {group}] * {bn};\n")
        for q in range(tn // 4):
            if half:  # four columns: two packed pairs
                slot.append(f"        const uint2 b{q} = *(const uint2*)(br + {q * span});\n")
                if not packed:
                    slot.append(f"        float b{q}_0, b{q}_1, b{q}_2, b{q}_3; lospmm_unpack_{dtype}(b{q}.x, b{q}_0, b{q}_1); "
                                f"lospmm_unpack_{dtype}(b{q}.y, b{q}_2, b{q}_3);\n")
            else:
                slot.append(f"        const float4 b{q} = *(const float4*)(br + {q * span});\n")
        for i in range(group * g, (group + 1) * g):
            value = f"a{i // 4}.{LANE[i % 4]}"
            if packed:
                slot.append(f"        {{ const unsigned ai = lospmm_bits({value}); "
                            + " ".join(f"{acc[i][j]} = lospmm_fma_{dtype}(ai, b{j // 2}.{'xy'[j % 2]}, {acc[i][j]});"
                                       for j in range(columns)) + " }\n")
            elif half:  # fmaf(b, a, sum): the exact model's order of operands and of slots
                slot.append("        " + " ".join(f"{acc[i][j]} = fmaf(b{j // 4}_{j % 4}, {value}, {acc[i][j]});"
                                                  for j in range(columns)) + "\n")
            else:
                slot.append("        " + " ".join(f"{acc[i][j]} += {value} * b{j // 4}.{LANE[j % 4]};"
                                                  for j in range(columns)) + "\n")
        slot.append("      }\n")
    stores = []
    if geometry is None:  # C's rows: a thread's four columns at a time, vector stores where aligned
        for i in range(tm):
            stores.append(f"  {{ const int r = row0 + {i};\n    if (r < {m}) {{\n"
                          f"      {ctype}* cr = C + (long long)r * N;\n")
            bias = f" + {symbols['bias']}[r]" if epilogue.bias else ""
            for q in range(tn // 4):
                stores.append(f"      {{ const int col = col0 + tx * 4 + {q * span};\n")
                if half:
                    if packed and epilogue.empty:  # the packed sums as they are
                        pairs = [acc[i][2 * q], acc[i][2 * q + 1]]
                    else:
                        if packed:
                            stores.append(f"        float x0, x1, x2, x3; lospmm_unpack_{dtype}({acc[i][2 * q]}, x0, x1); "
                                          f"lospmm_unpack_{dtype}({acc[i][2 * q + 1]}, x2, x3);\n")
                            floats = ["x0", "x1", "x2", "x3"]
                        else:
                            floats = [acc[i][4 * q + lane] for lane in range(4)]
                        for lane in range(4):
                            stores.append(f"        const float y{lane} = {floats[lane]}{bias};\n")
                        values = [epilogue_scalar(epilogue, f"y{lane}") for lane in range(4)]
                        stores.append(f"        const unsigned p0 = lospmm_pack_{dtype}({values[0]}, {values[1]}), "
                                      f"p1 = lospmm_pack_{dtype}({values[2]}, {values[3]});\n")
                        pairs = ["p0", "p1"]
                    halves = [f"({pairs[lane // 2]} {'& 0xffffu' if lane % 2 == 0 else '>> 16'})" for lane in range(4)]
                    stores.append(f"        if (vec) {{ if (col < N) *(uint2*)(cr + col) = make_uint2({pairs[0]}, {pairs[1]}); }}\n"
                                  "        else {" + "".join(f" if (col + {lane} < N) cr[col + {lane}] = (lospmm_h16){halves[lane]};"
                                                            for lane in range(4)) + " }\n      }\n")
                    continue
                for lane in range(4):
                    stores.append(f"        const float x{lane} = {acc[i][4 * q + lane]}{bias};\n")
                values = [epilogue_scalar(epilogue, f"x{lane}") for lane in range(4)]
                stores.append(f"        if (vec) {{ if (col < N) *(float4*)(cr + col) = make_float4({', '.join(values)}); }}\n"
                              "        else {" + "".join(f" if (col + {lane} < N) cr[col + {lane}] = {values[lane]};"
                                                        for lane in range(4)) + " }\n      }\n")
            stores.append("    }\n  }\n")
    else:  # each of the thread's columns an output pixel of NCHW Y: its rows pixels apart
        pixels = geometry.pixels
        for j in range(tn):
            stores.append(f"  {{ const int n = col0 + tx * 4 + {(j // 4) * span + j % 4};\n    if (n < N) {{\n"
                          f"      {ctype}* y = {pixel_output(geometry, m, 'n')};\n")
            for i in range(tm):
                bias = f" + {symbols['bias']}[row0 + {i}]" if epilogue.bias else ""
                if packed:  # the column's half of its packed pair, exactly as a float
                    total = (f"float lo, hi; lospmm_unpack_{dtype}({acc[i][j // 2]}, lo, hi); "
                             f"const float x = {'hi' if j % 2 else 'lo'}{bias};")
                else:
                    total = f"const float x = {acc[i][j]}{bias};"
                # a half output: the epilogue in fp32, then one rounding to the dtype (the low half of a pack)
                value = (f"(lospmm_h16)(lospmm_pack_{dtype}({epilogue_scalar(epilogue, 'x')}, 0.0f) & 0xffffu)" if half
                         else epilogue_scalar(epilogue, 'x'))
                stores.append(f"      if (row0 + {i} < {m}) {{ {total} y[(long long)(row0 + {i}) * {pixels}] = {value}; }}\n")
            stores.append("    }\n  }\n")
    chunks, row_blocks = t.chunks(k), t.row_blocks(m)
    zero = "0u" if packed else "0.0f"
    if geometry is None:
        # vector accesses: B's 16-byte copies and C's stores of a thread's 4 columns; a half row of N
        # is 16-byte aligned when N is a multiple of 8
        vec = f"N % {per_copy} == 0 && (unsigned long long)B % 16 == 0 && (unsigned long long)C % 16 == 0"
        signature = f"(const {ctype}* __restrict__ B, {ctype}* __restrict__ C, const int N)"
        setup = [f"  const bool vec = {vec};\n", *copy_setup(bn, per_copy, ctype, spec.element_bytes, t.gathers)]
        staged_from = "B, N, {k0}, col0, {slab}, vec, bcol, kbytes, live"
    else:  # the thread's copy column is output pixel col0 + tid: its window found once
        signature = f"(const {ctype}* __restrict__ X, {ctype}* __restrict__ Y, const int batch)"
        setup = [f"  const int N = batch * {geometry.pixels}, n = col0 + tid;\n", "  const bool live = n < N;\n",
                 pixel_window(geometry, m, ctype=ctype),
                 *([window_mask_lines(geometry), f"  const {mask} window_ok = live ? "
                    f"{mask_name(geometry)} : 0;\n"] if flat
                   else [f"  const {mask} window_ok = 0;\n"])]
        staged_from = "X, xp, rows_ok, cols_ok, window_ok, live, {k0}, {slab}"
    body = "".join([
        f"LOSPMM_KERNEL void __launch_bounds__({threads}) {name}{signature} {{\n",
        f"  __shared__ __align__(16) {ctype} Bs[2][{(staged + 1) * bn}];\n",
        f"  __shared__ __align__(16) float As[2][{kept * bm}];\n",
        f"  __shared__ __align__(16) unsigned char Is[2][{t.slab}];\n",
        f"  const int tid = threadIdx.x, tx = tid % {per_row}, ty = tid / {per_row};\n",
        f"  const int row_block = blockIdx.x, col0 = blockIdx.y * {bn}, row0 = row_block * {bm} + ty * {tm};\n",
        *setup,
        f"  for (int i = tid; i < {2 * bn}; i += {threads}) Bs[i / {bn}][{staged * bn} + i % {bn}] = ({ctype})0;  "
        f"// the zero row a spare slot reads\n",
        *(f"  {'unsigned' if packed else 'float'} {', '.join(f'{c} = {zero}' for c in row)};\n" for row in acc),
        f"  stage_{name}(Bs[0], As[0], Is[0], {staged_from.format(k0='0', slab='row_block')});\n",
        "  lospmm_cp_commit();\n",
        f"  for (int c = 0; c < {chunks}; ++c) {{\n",
        f"    if (c + 1 < {chunks}) {{\n",
        f"      stage_{name}(Bs[(c + 1) & 1], As[(c + 1) & 1], Is[(c + 1) & 1], "
        f"{staged_from.format(k0=f'(c + 1) * {kc}', slab=f'(long long)(c + 1) * {row_blocks} + row_block')});\n",
        "      lospmm_cp_commit();\n      lospmm_cp_wait_one();\n    } else {\n      lospmm_cp_wait_all();\n    }\n",
        "    __syncthreads();\n",
        f"    const {ctype}* bs = Bs[c & 1] + tx * 4;\n",
        f"    const float* as = As[c & 1] + ty * {tm};\n",
        f"    const unsigned char* is = Is[c & 1] + ty * {tm // g};\n",
        "#pragma unroll\n",
        f"    for (int p = 0; p < {kept}; ++p) {{\n", *slot, "    }\n",
        "    __syncthreads();\n  }\n",
        *stores, "}\n"])
    where = "" if geometry is None else (
        f" conv Cin={geometry.cin} {geometry.h}x{geometry.w} window {geometry.kh}x{geometry.kw} stride={geometry.stride} "
        f"pad={geometry.pad} dilation={geometry.dilation} -> {geometry.h_out}x{geometry.w_out}")
    header = (f"// lospmm N:M kernel {name}: M={m} K={k} nnz={spec.nnz} {t.label} threads={threads}{where} "
              f"design={spec.design.code_label}{' epilogue=' + epilogue.label if not epilogue.empty else ''}\n")
    return "".join([included("preamble.cuh"), included("vector.cuh"), *([included("half.cuh")] if half else []),
                    *([included("conv.cuh")] if geometry is not None else []),
                    included("nm.cuh"), header, *globals_, stage, body])


def copy_setup(bn: int, per_copy: int, ctype: str, element_bytes: int, gathers: bool = False,
               col0: str = "col0") -> list[str]:
    """The kernel's lines that find its threads' 16-byte copies of B once (vector_copies reads them): the
    column vector cq of its block's columns a thread copies (a block's columns are 16-byte vectors
    `per_copy` elements wide, `bn` // `per_copy` a row), `bcol` where its first staged row's vector
    starts in B (a gathering stage's rows are listed: then row 0), `kbytes` a row of B in bytes and
    `live` a copy's size; a thread whose vector lies past N copies zeros (live 0), from B itself. N is a
    multiple of `per_copy` on the vector path, so a vector is wholly inside or past N. `col0`: the
    kernel's name for its block's first column."""
    per_row = bn // per_copy
    first_row = "" if gathers else f"(long long)(tid / {per_row}) * N + "
    return [f"  const int cq = tid % {per_row} * {per_copy};\n",
            f"  const bool col_in = {col0} + cq < N;\n",
            f"  const {ctype}* bcol = col_in ? B + {first_row}{col0} + cq : B;\n",
            # a row of B in bytes, in 32 bits: N below 2^30 (2^31 for 16-bit B), as the launch's int N is
            f"  const unsigned kbytes = col_in ? (unsigned)N * {element_bytes}u : 0u;\n",
            "  const int live = col_in ? 16 : 0;\n"]


def vector_copies(staged: int, k: int, chunk: int, bn: int, pitch: int, threads: int, per_copy: int, ctype: str,
                  gathers: bool = False) -> list[str]:
    """A stage's 16-byte copies of B's rows into `Bs` (rows `pitch` elements apart), as straight code
    on what copy_setup found once: thread tid copies the column vector cq of staged rows
    tid / F + P·j (F vectors a row of `bn` columns, P = threads / F rows a pass, j = 0, 1, …) — the
    chunk's rows from k0, or where the stage `gathers`, the rows its block's list (`listed`) names. A
    copy is then an address and a cp.async; the loop this replaced (a division, a remainder and the
    bounds per copy) took 28-31 instructions a copy in sm_90 SASS. Rows past K (the last stage of a K
    that is no multiple of `chunk`) and a list's unused entries (`chunk`) copy zeros, from an address
    inside B; a pass past the staged rows (when they are no multiple of P) is not copied."""
    per_row = bn // per_copy
    if bn % per_copy or threads % per_row:
        raise ValueError(f"a stage's 16-byte copies: {bn} columns a block are not whole vectors of {per_copy}, or "
                         f"{threads} threads do not copy whole rows of them")
    passes = threads // per_row
    copies = -(-staged // passes)
    ragged = k % chunk != 0
    lines = [f"const int r0 = tid / {per_row};\n",
             f"{ctype}* dst = Bs + r0 * {pitch} + tid % {per_row} * {per_copy};\n"]
    if gathers:
        lines.append("const unsigned char* lp = listed + r0;\n")
    else:
        lines.append("const char* p = (const char*)bcol + (unsigned long long)(unsigned)k0 * kbytes;\n")
        if ragged:
            lines.append(f"const int left = {k} - k0 - r0;  // rows of B left at the thread's first staged row\n")
    for j in range(copies):
        row = passes * j
        # only the last pass can run past the staged rows
        guard = f"if (r0 + {row} < {staged}) " if j == copies - 1 and staged % passes else ""
        if gathers:  # a list names only A's columns (nm_operands): a listed row is inside K
            lines.append(f"{guard}{{ const int l{j} = lp[{row}]; const bool in{j} = l{j} < {chunk}; "
                         f"lospmm_cp16(dst + {row * pitch}, (const char*)bcol + (unsigned long long)(unsigned)(in{j} ? k0 + l{j} : 0) * kbytes, "
                         f"in{j} ? live : 0); }}\n")
        elif ragged:
            lines.append(f"{guard}lospmm_cp16(dst + {row * pitch}, {row} < left ? (const void*)(p + {row}ull * kbytes) : (const void*)B, "
                         f"{row} < left ? live : 0);\n")
        else:
            lines.append(f"{guard}lospmm_cp16(dst + {row * pitch}, p + {row}ull * kbytes, live);\n")
    return lines


def block_copies(count: int, threads: int, dst: str, src: str, unit: int, src_unit: int = 0) -> list[str]:
    """`count` 16-byte copies from `src` to `dst` shared by the block's threads, as straight code (the
    trip count is the renderer's to know): copy i at `dst` + unit·i from `src` + src_unit·i (elements
    of each pointer's type; src_unit 0: `unit`)."""
    full, rest = divmod(count, threads)
    src_unit = src_unit or unit

    def copy(j: int) -> str:
        return f"lospmm_cp16({dst} + {unit} * (tid + {threads * j}), {src} + {src_unit} * (tid + {threads * j}), 16);\n"
    return [f"  {copy(j)}" for j in range(full)] + ([f"  if (tid < {rest}) {copy(full)}"] if rest else [])
