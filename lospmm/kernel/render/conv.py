"""The implicit-im2col convolution kernel (§6.2): Alg. 2's tiles and units, but each B value is read
from the NCHW input X at its window offset (a literal byte offset from the pixel's pointer, zero
where the window leaves the image: two bit masks per tile function hold which window rows and
columns are inside, made into one mask of the window's entries so that a load tests one literal bit
(include/window.cuh); without padding every window is inside the image, and a load is one `__ldg`
with no test), and each output goes to NCHW Y through the epilogue. The input size, window,
stride, padding and dilation are fixed at emit time; the batch is a run-time argument. In fp32
of the designs the grid's order, the column walks (a looped kernel's tile function walks its
column blocks, each output pixel's window found again per walk) and the columns per thread (V
output pixels a thread, n1 apart so that a warp's loads of each lane stay consecutive: each lane
finds its own window and loads its own input, one literal feeds V multiply-adds, and the tile's
code, fetched once a warp, serves V times the pixels); its loads already take one instruction from
the pixel's pointer. In fp16/bf16 (a half design's pair) a thread's two output pixels are its two
lanes: each lane's 16-bit input goes into its half of the pair B value, one packed multiply-add
(or two fp32 ones) per nonzero as the GEMM's, and each lane's half of the stored pair to its
pixel (the epilogue in fp32, rounded once). A streamed design's conv kernel is render.streamed's,
a sliced one's render.sliced's, a staged one's render.staged's."""

from __future__ import annotations

import scipy.sparse as sp

from lospmm.kernel.design import BASELINE, conv_design
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.geometry import ConvGeometry
from lospmm.kernel.includes import included
from lospmm.kernel.layout import LaunchLayout
from lospmm.kernel.render.common import (CodegenParams, axes, checked_tile, design_parts, entry_unit, kernel_name,
                                         straight_line, tile_columns, tile_costs, units, zero_blocks)
from lospmm.kernel.render.numbers import Fp32Code, HalfCode, epilogue_applied, epilogue_zero_literal, number_code
from lospmm.kernel.spec import KernelSource, KernelSpec


def conv_kernel(matrix: sp.csr_matrix, tiles, n1: int, geometry: ConvGeometry, epilogue: Epilogue = Epilogue(),
                params: CodegenParams = CodegenParams()) -> KernelSource:
    """Parameters (X, Y, batch); launch with grid(geometry.n(batch)). Same tiles, units and shards as
    the GEMM kernel: the search's shapes are the im2col GEMM's. A half design's A must hold its
    dtype's values already (numbers.rounded_matrix)."""
    design = params.design
    if params.n1_at_launch:
        raise ValueError("an implicit-im2col conv kernel bakes its N1 in (N1 at launch is the GEMM kernels')")
    if design.a_values != "baked" or design.loads != "based" or design != conv_design(design):
        raise ValueError(f"design {design.label}: an implicit-im2col conv kernel takes only the grid's order "
                         f"(tile-x or column-x), walks, columns per thread and number format (a streamed, "
                         f"sliced or staged one is its renderer's)")
    code = number_code(design)  # one column a thread (baseline), V lanes, or a half design's pair
    a = code.matrix(matrix)
    a.sort_indices()
    m, k = a.shape
    checked_conv_weight(k, geometry)
    if epilogue.bias and len(epilogue.bias) != m:
        raise ValueError(f"bias has {len(epilogue.bias)} values for {m} output channels")
    checked_tile(n1)
    g = geometry
    hwo = g.pixels
    name = kernel_name("lospmm_conv", m, k, a.indptr.tobytes(), a.indices.tobytes(), code.value_bytes(a),
                       tiles.rows.tobytes(), tiles.tile_ptr.tobytes(), n1, params.prefetch, params.shard_nnz,
                       tuple(vars(g).values()), *epilogue.name_parts(), *design_parts(design))
    header = (f"// lospmm conv kernel {name}: Cout={m} Cin={g.cin} {g.h}x{g.w} window {g.kh}x{g.kw} "
              f"stride={g.stride} pad={g.pad} dilation={g.dilation} -> {g.h_out}x{g.w_out}, nnz={a.nnz} "
              f"M1={tiles.m1} N1={n1} tiles={tiles.num_tiles} bias={bool(epilogue.bias)} relu={epilogue.relu}"
              + (f" activation={epilogue.activation}" if epilogue.activation not in ("", "relu") else "")
              + (f" design={design.code_label}" if design != BASELINE else ""))
    v = design.columns_per_thread
    zeros = zero_blocks(tiles.empty_rows, max(tiles.m1, 1))
    tile_axis, column_axis = axes(design)
    if v > 1:  # V output pixels a thread, each its own window and loads, every literal feeding V multiply-adds
        preamble = (code.preamble() + ("" if g.windows_inside else included("window.cuh"))
                    + (included("half_conv.cuh") if design.half else ""))
        functions = [_lanes_tile_function(a, code, t, tiles.tile(t), params.prefetch, g, epilogue, design.looped, m,
                                          n1) for t in range(tiles.num_tiles)]
    else:
        preamble = included("preamble.cuh") + ("" if g.windows_inside else included("window.cuh"))
        functions = [_tile_function(a, code, t, tiles.tile(t), params.prefetch, g, epilogue, design.looped, m)
                     for t in range(tiles.num_tiles)]
    if design.looped or v > 1:  # each thread's pixels from n, n1·V a block: the tile function finds each window
        if v > 1:
            zero_bodies = [_walked(design.looped, lane_zero_stores(code, g, m, n1, v, rows, epilogue)) for rows in zeros]
        else:
            zero_bodies = [
                "  do {\n"
                f"    const int b = n / {hwo};\n    float* Yb = Y + (long long)b * {m * hwo} + (n - b * {hwo});\n"
                + "".join(f"    lospmm_st(Yb, {r}, {hwo}, {epilogue_zero_literal(epilogue, int(r))});\n" for r in rows)
                + "    n += stride;\n  } while (n < total);\n" for rows in zeros]
        ctype = code.ctype
        entry = entry_unit(
            preamble, header, tiles.num_tiles,
            f"(const {ctype}* __restrict__ X, {ctype}* __restrict__ Y, int n, const int stride, const int total)",
            [(f"({ctype}* __restrict__ Y, int n, const int stride, const int total)", body) for body in zero_bodies],
            f"LOSPMM_KERNEL void {name}(const {ctype}* __restrict__ X, {ctype}* __restrict__ Y, const int batch) {{\n"
            f"  const int n = blockIdx.{column_axis} * {n1 * v} + threadIdx.x;\n"
            f"  const int total = batch * {hwo};\n"
            f"  if (n >= total) return;\n"
            f"  const int stride = gridDim.{column_axis} * {n1 * v};\n", "X, Y, n, stride, total",
            "zero_{z}(Y, n, stride, total)", tile_axis)
    else:
        entry = entry_unit(
        preamble, header, tiles.num_tiles, "(const float* __restrict__ Xb, float* __restrict__ Yb, const int iy0, const int ix0)",
        [("(float* __restrict__ Yb)", "".join(f"  lospmm_st(Yb, {r}, {hwo}, {epilogue_zero_literal(epilogue, int(r))});\n"
                                             for r in rows)) for rows in zeros],
        f"LOSPMM_KERNEL void {name}(const float* __restrict__ X, float* __restrict__ Y, const int batch) {{\n"
        f"  const int n = blockIdx.{column_axis} * {n1} + threadIdx.x;\n"
        f"  if (n >= batch * {hwo}) return;\n" + pixel_window(g, m, window=False), "Xb, Yb, iy0, ix0", "zero_{z}(Yb)",
        tile_axis)
    layout = LaunchLayout(tiles.num_tiles + len(zeros), n1, v, design.column_walks, design.order)
    spec = KernelSpec(name, "conv", m, k, tiles.m1, layout, tiles.num_tiles, design, epilogue, g, nnz=int(a.nnz))
    return KernelSource(spec, tuple(units("tile", functions, tile_costs(a, tiles), params.shard_nnz, preamble)
                                    + [entry]))


def checked_conv_weight(k: int, geometry: ConvGeometry) -> None:
    """ValueError where A's K columns are not the convolution's cin·kh·kw (every conv renderer's first check)."""
    if k != geometry.k:
        raise ValueError(f"weight has K={k} columns, the conv geometry needs cin·kh·kw = {geometry.k}")


def lane_zero_stores(code, g: ConvGeometry, m: int, n1: int, lanes: int, rows, epilogue: Epilogue) -> list[str]:
    """A zeroing block's lines in a conv kernel of `lanes` pixels a thread (n1 apart): each lane that is a
    pixel stores `rows`' outputs of a zero (their epilogue's)."""
    return [f"  if (n + {lane * n1} < total) "
            f"{code.pixel_zero_store(pixel_output(g, m, f'(n + {lane * n1})'), int(r), epilogue, g.pixels)}\n"
            for r in rows for lane in range(lanes)]


def _tile_function(a: sp.csr_matrix, code: Fp32Code, t: int, rows, prefetch: int, g: ConvGeometry,
                   epilogue: Epilogue, looped: bool = False, m: int = 0) -> str:
    def load(j: int, column: int, previous: int) -> str:
        off = g.window_offset(column)[0]
        if g.windows_inside:  # no padding: the window is inside the image, its load needs no test
            return f"  const float b{j} = __ldg(xp + {off});\n"
        word, bit = window_bit(g, column)
        return f"  float b{j}; LOSPMM_LDXM(b{j}, xp, {4 * off}, ok{word}, {bit});\n"

    sub, cols = tile_columns(a, rows)
    values = code.tile_values(sub.data)
    nonzeros = [[(int(sub.indices[p]), values[p]) for p in range(sub.indptr[c], sub.indptr[c + 1])] for c in cols]
    body, _ = straight_line(code, [int(c) for c in cols], nonzeros, len(rows), prefetch, load)
    if looped:  # per walk: the pixel, its image and its window, then the tile's body
        return "".join([
            f"LOSPMM_TILE void tile_{t}(const float* __restrict__ X, float* __restrict__ Y, int n, const int stride, "
            f"const int total) {{\n",
            "  do {\n",
            pixel_window(g, m, bounds=not g.windows_inside),
            "" if g.windows_inside else window_mask_lines(g),
            *body,
            *(f"  lospmm_st(Yb, {r}, {g.pixels}, {epilogue_applied(epilogue, f'acc{i}', int(r))});\n"
              for i, r in enumerate(rows)),
            "  n += stride;\n  } while (n < total);\n",
            "  LOSPMM_TILE_END\n}\n"])
    return "".join([
        f"LOSPMM_TILE void tile_{t}(const float* __restrict__ Xb, float* __restrict__ Yb, const int iy0, "
        f"const int ix0) {{\n",
        f"  const float* xp = Xb + (iy0 * {g.w} + ix0);  // the window's top-left input pixel\n",
        *(() if g.windows_inside else (
            f"  const unsigned rows_ok = lospmm_window_bits(iy0, {g.dilation}, {g.kh}, {g.h});\n",
            f"  const unsigned cols_ok = lospmm_window_bits(ix0, {g.dilation}, {g.kw}, {g.w});\n",
            window_mask_lines(g))),
        *body,
        *(f"  lospmm_st(Yb, {r}, {g.pixels}, {epilogue_applied(epilogue, f'acc{i}', int(r))});\n"
          for i, r in enumerate(rows)),
        "  LOSPMM_TILE_END\n}\n"])


def _lane_pixel(g: ConvGeometry, m: int, n1: int | str, lane: int, ctype: str = "float") -> list[str]:
    """The lines that find a vector conv kernel's output pixel of `lane` (the thread's pixel n plus
    lane·n1): whether it is one (live_L) and, as pixel_window finds pixel n's (its names suffixed _L),
    its image, place, output and window (none for a lane past the last pixel: it loads nothing). Where
    every window is inside the image (no padding) its loads have no test: a lane past the last pixel
    reads pixel n's window instead (n is one), and stores nothing. `n1`: the lanes' spacing, a number
    or a C expression (a streamed kernel's block size is blockDim.x)."""
    offset = lane * n1 if isinstance(n1, int) else f"{lane} * {n1}"
    if g.windows_inside:
        return [f"  const bool live_{lane} = n + {offset} < total;\n",
                f"  const int n_{lane} = live_{lane} ? n + {offset} : n;\n",
                pixel_window(g, m, ctype=ctype, lane=lane, bounds=False)]
    return [f"  const int n_{lane} = n + {offset};\n", f"  const bool live_{lane} = n_{lane} < total;\n",
            pixel_window(g, m, ctype=ctype, lane=lane), window_mask_lines(g, f"_{lane}")]


def lane_windows(g: ConvGeometry, m: int, n1: int | str, lanes: int) -> str:
    """The lines that find each of a vector conv kernel's `lanes` output pixels (n plus lane·n1) and
    its window (_lane_pixel)."""
    return "".join(line for lane in range(lanes) for line in _lane_pixel(g, m, n1, lane))


def _walked(looped: bool, body: list[str]) -> str:
    """A vector conv kernel's body as its function runs it: once, or (looped) once per column block
    the block walks."""
    if not looped:
        return "".join(body)
    return "".join(["  do {\n", *body, "  n += stride;\n  } while (n < total);\n"])


def _lanes_tile_function(a: sp.csr_matrix, code: Fp32Code | HalfCode, t: int, rows, prefetch: int, g: ConvGeometry,
                         epilogue: Epilogue, looped: bool, m: int, n1: int) -> str:
    """Tile t of a conv kernel of V lanes a thread (fp32's columns, a half design's pair): each lane's
    window, each column's V window loads into one value (a lane past the last pixel loads zeros), the
    multiply-adds of its literals in the number format `code`, each lane's outputs to NCHW Y."""
    v = code.v

    def load(j: int, column: int, previous: int) -> str:
        return code.window_load(j, g.window_offset(column)[0], *window_bit(g, column), g.windows_inside)

    sub, cols = tile_columns(a, rows)
    values = code.tile_values(sub.data)
    nonzeros = [[(int(sub.indices[p]), values[p]) for p in range(sub.indptr[c], sub.indptr[c + 1])] for c in cols]
    body, finish = straight_line(code, [int(c) for c in cols], nonzeros, len(rows), prefetch, load)
    windows = [line for lane in range(v) for line in _lane_pixel(g, m, n1, lane, code.ctype)]
    stores = [code.pixel_stores(f, int(r), epilogue, g.pixels) for f, r in zip(finish, rows)]
    ctype = code.ctype
    return "".join([
        f"LOSPMM_TILE void tile_{t}(const {ctype}* __restrict__ X, {ctype}* __restrict__ Y, int n, const int stride, "
        f"const int total) {{\n",
        _walked(looped, [*windows, *body, *stores]),
        "  LOSPMM_TILE_END\n}\n"])


def window_mask_lines(g: ConvGeometry, suffix: str = "", indent: str = "  ") -> str:
    """The lines that make a pixel's window mask from its row and column masks (rows_ok, cols_ok; names
    suffixed `suffix`): bit ky·kw + kx set where that entry lies inside the image, in one 32-bit word
    ok0 (two, ok0 and ok1, past 32 entries; past 64, as many words as it takes, each made from the
    window rows whose entries reach into it), so that each load tests one literal bit (window_bit)."""
    rows, cols = f"rows_ok{suffix}", f"cols_ok{suffix}"
    if mask_name(g) is None:  # an 11×11 first layer's 121 entries: four words
        lines = []
        for word in range(-(-g.kh * g.kw // 32)):
            lines.append(f"{indent}unsigned ok{word}{suffix} = 0u;\n")
            for ky in range(g.kh):
                shift = ky * g.kw - 32 * word  # where the row's first entry falls in this word
                if -g.kw < shift < 32:
                    part = f"{cols} << {shift}" if shift >= 0 else f"{cols} >> {-shift}"
                    lines.append(f"{indent}if ({rows} & {1 << ky}u) ok{word}{suffix} |= {part};\n")
        return "".join(lines)
    if mask_name(g) == "ok0":
        return (f"{indent}unsigned ok0{suffix} = 0u;\n"
                + "".join(f"{indent}if ({rows} & {1 << ky}u) ok0{suffix} |= {cols} << {ky * g.kw};\n" for ky in range(g.kh)))
    return (f"{indent}unsigned long long okm{suffix} = 0ull;\n"
            + "".join(f"{indent}if ({rows} & {1 << ky}u) okm{suffix} |= (unsigned long long){cols} << {ky * g.kw};\n"
                      for ky in range(g.kh))
            + f"{indent}const unsigned ok0{suffix} = (unsigned)okm{suffix}, ok1{suffix} = (unsigned)(okm{suffix} >> 32);\n")


def window_bit(g: ConvGeometry, column: int) -> tuple[int, int]:
    """A column's entry in its pixel's window mask (window_mask_lines): (the word, its bit as a literal)."""
    _, ky, kx = g.window_offset(column)
    entry = ky * g.kw + kx
    return entry // 32, 1 << (entry % 32)


# a window entry's test in C: whether its window row and column (`{}`: row | column << 16) lie inside
# the image for the pixel's masks (rows_ok, cols_ok), as 1u or 0u
WINDOW_INSIDE = "((rows_ok >> ({0} & 0xffff)) & (cols_ok >> ({0} >> 16)) & 1u)"


def window_entries(g: ConvGeometry, columns, element_bytes: int = 4, flat: bool = False) -> list[int]:
    """The entries of A's `columns` as a streamed, staged or N:M conv kernel reads them, two ints each:
    the input's byte offset from the window's top-left pixel (elements of `element_bytes`), its window
    row | its window column << 16, or with `flat` its place in the window, row · kw + column (its bit in
    the pixel's window mask, window_mask_lines)."""
    return [x for c in columns for off, ky, kx in [g.window_offset(int(c))]
            for x in (element_bytes * off, ky * g.kw + kx if flat else ky | kx << 16)]


def mask_type(g: ConvGeometry) -> str | None:
    """The C type of a pixel's whole window mask (window_mask_lines: one bit a place of the window): ok0,
    or okm past 32 places; None for a window of more than 64."""
    places = g.kh * g.kw
    return "unsigned" if places <= 32 else "unsigned long long" if places <= 64 else None


def mask_name(g: ConvGeometry) -> str | None:
    """The name window_mask_lines gives that whole mask: ok0 (one word), okm past 32 places; None past 64."""
    places = g.kh * g.kw
    return "ok0" if places <= 32 else "okm" if places <= 64 else None


def pixel_output(g: ConvGeometry, m: int, pixel: str) -> str:
    """The C address of output pixel `pixel`'s first channel in NCHW Y (M channels; its rows g.pixels apart)."""
    return f"Y + (long long)({pixel} / {g.pixels}) * {m * g.pixels} + {pixel} % {g.pixels}"


def pixel_window(g: ConvGeometry, m: int, indent: str = "  ", window: bool = True, ctype: str = "float",
                 lane: int | None = None, bounds: bool = True) -> str:
    """The lines that find output pixel `n`'s image b and place p, its input Xb and output Yb (M
    channels, elements of C type `ctype`), its window's top-left corner (iy0, ix0: outside the image
    where the window overhangs the padding) and, with `window`, that corner's input pixel xp and (with
    `bounds`) which of its window rows and columns lie inside (rows_ok, cols_ok). With `lane` L, a
    vector conv kernel's lane's: pixel n_L, every name suffixed _L, and no window rows inside where
    live_L is false."""
    s = "" if lane is None else f"_{lane}"
    rows = f"lospmm_window_bits(iy0{s}, {g.dilation}, {g.kh}, {g.h})"
    lines = [f"const int b{s} = n{s} / {g.pixels};", f"const int p{s} = n{s} - b{s} * {g.pixels};",
             f"const int oy{s} = p{s} / {g.w_out};", f"const int ox{s} = p{s} - oy{s} * {g.w_out};",
             f"const {ctype}* Xb{s} = X + (long long)b{s} * {g.cin * g.h * g.w};",
             f"{ctype}* Yb{s} = Y + (long long)b{s} * {m * g.pixels} + p{s};",
             f"const int iy0{s} = oy{s} * {g.stride} - {g.pad};", f"const int ix0{s} = ox{s} * {g.stride} - {g.pad};"]
    if window:
        lines += [f"const {ctype}* xp{s} = Xb{s} + (iy0{s} * {g.w} + ix0{s});"]
    if window and bounds:
        lines += [f"const unsigned rows_ok{s} = {rows if lane is None else f'live{s} ? {rows} : 0u'};",
                  f"const unsigned cols_ok{s} = lospmm_window_bits(ix0{s}, {g.dilation}, {g.kw}, {g.w});"]
    return "".join(f"{indent}{line}\n" for line in lines)
