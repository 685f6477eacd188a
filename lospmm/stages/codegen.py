"""CUDA C++ source of the full SpMM kernel (Alg. 2, §6.1) and of its proxies (§5.1).

Layout: A is M×K (baked in), B is K×N row-major, C is M×N row-major, both float32; N is a runtime
argument, so one kernel serves any batch. Block (x = A_tile, y = column block) has N1 threads;
a thread owns output column n = y·N1 + threadIdx.x and the M1 rows of its A_tile (the reorder
stage's rows, possibly non-contiguous), kept in registers. The tile's non-empty columns are
visited in order: the B value of column j + P is loaded before the multiply-adds of column j
(prefetch depth P), a column with no nonzero is never loaded, and each nonzero is one
`acc += b * <literal>` (the same FFMA as fmaf, without NVRTC's superlinear front end);
loads and stores go through `lospmm_ld`/`lospmm_st` (inline PTX, see PREAMBLE). Rows of A
with no nonzero are zeroed by extra blocks after the last tile.

Sharding: ptxas's time and memory grow superlinearly with the size of one function, so each tile
(of a proxy: each cluster) is a `__noinline__` device function, and the functions are grouped into
units of at most `shard_nnz` multiply-adds, compiled separately as relocatable code and linked by
nvJitLink into one cubin with one entry point (`KernelSource.units`; the entry unit is last). The
tile functions are `noreturn` (they end the thread with `exit`): a function that never returns
saves no callee-saved registers, which otherwise cost ~30 spill stores and loads around every call.

The same text compiles with NVRTC and, under `hostemu.SHIM`, with the host C++ compiler: the host
check compiles `source`, the units' concatenation, so it runs exactly the text compiled unit by unit.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from lospmm.stages.extract import conv_output_size
from lospmm.stages.reorder import Tiles

# Address arithmetic lives inside inline PTX: with thousands of `B + c * N + n` in straight-line
# code, LLVM's straight-line strength reduction goes superlinear (4000 loads: 184 s in NVVM, 5.9 s
# this way). A load's byte offset is `column * 4`, so one mad.wide forms its address. A store
# computes `(row * N) * 4` in 64 bits instead: written as the loads are, `N * (4 * row)` equals the
# `N * (4 * column)` of any load of column == row and ptxas keeps that product live from the load
# to the store (a tile function of M1 = 16 spilled 136 bytes at the §3.2 prediction); scaling N
# by 4 once instead leaves `N << 2` live through the whole function (4-8 bytes of spill).
PREAMBLE = r"""#if !defined(LOSPMM_HOST_EMULATION) && !defined(LOSPMM_PREAMBLE)
#define LOSPMM_PREAMBLE
#define LOSPMM_KERNEL extern "C" __global__
__device__ __forceinline__ float lospmm_ld(const float* base, int off4, int n) {
  float v;
  asm("{ .reg .u64 a; mad.wide.s32 a, %1, %2, %3; ld.global.nc.f32 %0, [a]; }" : "=f"(v) : "r"(off4), "r"(n), "l"(base));
  return v;
}
__device__ __forceinline__ void lospmm_st(float* base, int row, int n, float v) {
  asm volatile("{ .reg .s64 r, m, a; cvt.s64.s32 r, %0; cvt.s64.s32 m, %1; mul.lo.s64 a, r, m; shl.b64 a, a, 2; add.s64 a, a, %2; st.global.f32 [a], %3; }" :: "r"(row), "r"(n), "l"(base), "f"(v) : "memory");
}
// implicit im2col: bit i of a window mask says whether start + i·step lies in 0..limit-1 (one mask for
// the window's rows, one for its columns, made once per tile function: two registers, where keeping
// each offset's bound check live cost a tile of M1 = 16 over 400 bytes of spill)
__device__ __forceinline__ unsigned lospmm_window_bits(int start, int step, int count, int limit) {
  unsigned bits = 0;
  for (int i = 0; i < count; ++i) bits |= ((unsigned)(start + i * step) < (unsigned)limit ? 1u : 0u) << i;
  return bits;
}
// v = the input element at byte offset OFF4 (a literal) from xp if its row bit and column bit are
// set, else 0 (the padding): one load with an immediate offset from the pixel's pointer
#define LOSPMM_LDX(v, xp, OFF4, rows, cols, RBIT, CBIT) \
  asm("{ .reg .pred in; .reg .b32 t; and.b32 t, %2, " #RBIT "; setp.ne.u32 in, t, 0; and.b32 t, %3, " #CBIT "; " \
      "@in setp.ne.u32 in, t, 0; mov.f32 %0, 0f00000000; @in ld.global.nc.f32 %0, [%1+" #OFF4 "]; }" \
      : "=f"(v) : "l"(xp), "r"(rows), "r"(cols))
__device__ __forceinline__ float lospmm_relu(float v) { return fmaxf(v, 0.0f); }
#define LOSPMM_TILE extern "C" __device__ __noinline__ __attribute__((noreturn))
#define LOSPMM_TILE_END asm volatile("exit;"); __builtin_unreachable();
#endif
"""


@dataclass(frozen=True)
class CodegenParams:
    """Defaults: prefetch=1 (B values loaded one column ahead, Alg. 2's b); shard_nnz=SHARD_NNZ
    (multiply-adds per compiled unit at most; a bigger tile is a unit of its own), chosen from
    benchmarks/shard_compile.py."""

    prefetch: int = 1
    shard_nnz: int = 4096

    def __post_init__(self):
        if self.prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {self.prefetch}")
        if self.shard_nnz < 1:
            raise ValueError(f"shard_nnz must be >= 1, got {self.shard_nnz}")


@dataclass(frozen=True)
class KernelSource:
    """Generated source plus what a launcher needs; `params` lists the C parameters in order.
    `units` are compiled separately and linked; the entry unit is last."""

    name: str
    kind: str  # "full" | "proxy"
    units: tuple[str, ...]
    params: tuple[str, ...]
    m: int
    k: int
    m1: int
    n1: int  # 0 for a proxy: its block size is a launch argument
    grid_x: int  # blocks along A (tiles, plus zeroing blocks for a full kernel)
    num_tiles: int

    @property
    def source(self) -> str:
        """The whole kernel as one text: its units in order (what the host check compiles)."""
        return "".join(self.units)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    def grid(self, n: int, n1: int | None = None) -> tuple[int, int, int]:
        """Launch grid for N output columns (a proxy takes the N1 under test)."""
        n1 = n1 or self.n1
        return (self.grid_x, -(-n // n1), 1)


def kernel_name(prefix: str, *parts) -> str:
    """An identifier derived from a hash, never from raw layer names."""
    digest = hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
    return f"{prefix}_{digest}"


def float_literal(values: np.ndarray) -> list[str]:
    """Shortest decimal literals that read back as exactly these float32 values."""
    return [np.format_float_scientific(v, unique=True, trim="0") + "f"
            for v in np.asarray(values, dtype=np.float32)]


def full_kernel_source(matrix: sp.csr_matrix, tiles: Tiles, n1: int,
                       params: CodegenParams = CodegenParams()) -> KernelSource:
    """Alg. 2 for every A_tile of `tiles`, blocks of `n1` threads."""
    a = sp.csr_matrix(matrix)
    a.sort_indices()
    if n1 < 1 or n1 > 1024:
        raise ValueError(f"N1 must be in 1..1024, got {n1}")
    m, k = a.shape
    name = kernel_name("lospmm_full", m, k, a.indptr.tobytes(), a.indices.tobytes(), a.data.tobytes(),
                       tiles.rows.tobytes(), tiles.tile_ptr.tobytes(), n1, params.prefetch, params.shard_nnz)
    header = (f"// lospmm full kernel {name}: M={m} K={k} nnz={a.nnz} M1={tiles.m1} N1={n1} "
              f"tiles={tiles.num_tiles} prefetch={params.prefetch}")
    functions = [_tile_function(a, t, tiles.tile(t), params.prefetch) for t in range(tiles.num_tiles)]
    zero_blocks = _zero_blocks(tiles.empty_rows, max(tiles.m1, 1))
    entry = _entry_unit(
        header, tiles.num_tiles, "(const float* __restrict__ Bn, float* __restrict__ Cn, const int N)",
        [("(float* __restrict__ Cn, const int N)", "".join(f"  lospmm_st(Cn, {r}, N, 0.0f);\n" for r in rows))
         for rows in zero_blocks],
        # No __launch_bounds__: with it NVRTC ignores --maxrregcount, which §3.2 relies on.
        f"LOSPMM_KERNEL void {name}(const float* __restrict__ B, float* __restrict__ C, const int N) {{\n"
        f"  const int n = blockIdx.y * {n1} + threadIdx.x;\n"
        f"  if (n >= N) return;\n"
        f"  const float* Bn = B + n;\n"
        f"  float* Cn = C + n;\n", "Bn, Cn, N", "Cn, N")
    units = _units("tile", functions, _tile_costs(a, tiles), params.shard_nnz) + [entry]
    return KernelSource(name, "full", tuple(units), ("const float* B", "float* C", "int N"), m, k,
                        tiles.m1, n1, tiles.num_tiles + len(zero_blocks), tiles.num_tiles)


@dataclass(frozen=True)
class ConvGeometry:
    """A Conv2D (groups = 1) as its implicit-im2col kernel reads it (§6.2): an NCHW float32 input of
    cin×h×w per image and a kh×kw window with stride, padding and dilation, all fixed at emit time;
    the batch is a run-time argument. A's column c is (ci·kh + ky)·kw + kx, PyTorch's
    [Cout, Cin, kh, kw] weight flattened (the im2col GEMM's K = cin·kh·kw, N = batch·h_out·w_out)."""

    cin: int
    h: int
    w: int
    kh: int
    kw: int
    stride: int = 1
    pad: int = 0
    dilation: int = 1

    def __post_init__(self):
        for name in ("cin", "h", "w", "kh", "kw", "stride", "dilation"):
            if getattr(self, name) < 1:
                raise ValueError(f"conv {name} must be >= 1, got {getattr(self, name)}")
        if self.pad < 0:
            raise ValueError(f"conv pad must be >= 0, got {self.pad}")
        if self.kh > 32 or self.kw > 32:  # a window row or column is one bit of a 32-bit mask
            raise ValueError(f"conv window {self.kh}×{self.kw}: at most 32×32")
        if self.h_out < 1 or self.w_out < 1:
            raise ValueError(f"conv window {self.kh}×{self.kw} (dilation {self.dilation}) is larger than the "
                             f"padded input {self.h + 2 * self.pad}×{self.w + 2 * self.pad}")

    @property
    def h_out(self) -> int:
        return conv_output_size(self.h, self.kh, self.stride, self.pad, self.dilation)

    @property
    def w_out(self) -> int:
        return conv_output_size(self.w, self.kw, self.stride, self.pad, self.dilation)

    @property
    def k(self) -> int:
        return self.cin * self.kh * self.kw

    def n(self, batch: int) -> int:
        """The im2col GEMM's N for `batch` images."""
        return batch * self.h_out * self.w_out


@dataclass(frozen=True)
class Epilogue:
    """What a conv kernel applies to each output before storing it: a bias per output channel
    (baked in as literals; empty: none), then ReLU (§6.2 fuses Conv2D + ReLU)."""

    bias: tuple[float, ...] = ()
    relu: bool = False

    def applied(self, acc: str, row: int) -> str:
        value = f"{acc} + {float_literal(np.array([self.bias[row]]))[0]}" if self.bias else acc
        return f"lospmm_relu({value})" if self.relu else value

    def of_zero(self, row: int) -> str:
        """The output of a row with no nonzero, as a literal."""
        v = np.float32(self.bias[row]) if self.bias else np.float32(0.0)
        return float_literal(np.array([max(v, np.float32(0.0)) if self.relu else v]))[0]


def conv_kernel_source(matrix: sp.csr_matrix, tiles: Tiles, n1: int, geometry: ConvGeometry,
                       epilogue: Epilogue = Epilogue(), params: CodegenParams = CodegenParams()) -> KernelSource:
    """Alg. 2 for a convolution without im2col: each B value is read from the NCHW input X
    (zero outside it: the padding) and each output written to NCHW Y, with the epilogue fused.
    Parameters (X, Y, batch); launch with grid(geometry.n(batch)). Same tiles, units and shards as
    full_kernel_source: the search's shapes are the im2col GEMM's."""
    a = sp.csr_matrix(matrix)
    a.sort_indices()
    m, k = a.shape
    if k != geometry.k:
        raise ValueError(f"weight has K={k} columns, the conv geometry needs cin·kh·kw = {geometry.k}")
    if epilogue.bias and len(epilogue.bias) != m:
        raise ValueError(f"bias has {len(epilogue.bias)} values for {m} output channels")
    if n1 < 1 or n1 > 1024:
        raise ValueError(f"N1 must be in 1..1024, got {n1}")
    g = geometry
    hwo, chw = g.h_out * g.w_out, g.cin * g.h * g.w
    name = kernel_name("lospmm_conv", m, k, a.indptr.tobytes(), a.indices.tobytes(), a.data.tobytes(),
                       tiles.rows.tobytes(), tiles.tile_ptr.tobytes(), n1, params.prefetch, params.shard_nnz,
                       tuple(vars(g).values()), np.asarray(epilogue.bias, np.float32).tobytes(), epilogue.relu)
    header = (f"// lospmm conv kernel {name}: Cout={m} Cin={g.cin} {g.h}x{g.w} window {g.kh}x{g.kw} "
              f"stride={g.stride} pad={g.pad} dilation={g.dilation} -> {g.h_out}x{g.w_out}, nnz={a.nnz} "
              f"M1={tiles.m1} N1={n1} tiles={tiles.num_tiles} bias={bool(epilogue.bias)} relu={epilogue.relu}")
    functions = [_conv_tile_function(a, t, tiles.tile(t), params.prefetch, g, epilogue) for t in range(tiles.num_tiles)]
    zero_blocks = _zero_blocks(tiles.empty_rows, max(tiles.m1, 1))
    entry = _entry_unit(
        header, tiles.num_tiles, "(const float* __restrict__ Xb, float* __restrict__ Yb, const int iy0, const int ix0)",
        [("(float* __restrict__ Yb)", "".join(f"  lospmm_st(Yb, {r}, {hwo}, {epilogue.of_zero(int(r))});\n"
                                             for r in rows)) for rows in zero_blocks],
        f"LOSPMM_KERNEL void {name}(const float* __restrict__ X, float* __restrict__ Y, const int batch) {{\n"
        f"  const int n = blockIdx.y * {n1} + threadIdx.x;\n"
        f"  if (n >= batch * {hwo}) return;\n"
        f"  const int b = n / {hwo};\n"
        f"  const int p = n - b * {hwo};\n"
        f"  const int oy = p / {g.w_out};\n"
        f"  const int ox = p - oy * {g.w_out};\n"
        f"  const float* Xb = X + (long long)b * {chw};\n"
        f"  float* Yb = Y + (long long)b * {m * hwo} + p;\n"
        f"  const int iy0 = oy * {g.stride} - {g.pad};\n"
        f"  const int ix0 = ox * {g.stride} - {g.pad};\n", "Xb, Yb, iy0, ix0", "Yb")
    units = _units("tile", functions, _tile_costs(a, tiles), params.shard_nnz) + [entry]
    return KernelSource(name, "conv", tuple(units), ("const float* X", "float* Y", "int batch"), m, k,
                        tiles.m1, n1, tiles.num_tiles + len(zero_blocks), tiles.num_tiles)


def _conv_tile_function(a: sp.csr_matrix, t: int, rows: np.ndarray, prefetch: int, g: ConvGeometry,
                        epilogue: Epilogue) -> str:
    def load(j: int, column: int) -> str:
        ci, rest = divmod(column, g.kh * g.kw)
        ky, kx = divmod(rest, g.kw)
        off = ci * g.h * g.w + ky * g.dilation * g.w + kx * g.dilation
        return f"  float b{j}; LOSPMM_LDX(b{j}, xp, {4 * off}, rows_ok, cols_ok, {1 << ky}, {1 << kx});\n"

    hwo = g.h_out * g.w_out
    return "".join([
        f"LOSPMM_TILE void tile_{t}(const float* __restrict__ Xb, float* __restrict__ Yb, const int iy0, "
        f"const int ix0) {{\n",
        f"  const float* xp = Xb + (iy0 * {g.w} + ix0);  // the window's top-left input pixel\n",
        f"  const unsigned rows_ok = lospmm_window_bits(iy0, {g.dilation}, {g.kh}, {g.h});\n",
        f"  const unsigned cols_ok = lospmm_window_bits(ix0, {g.dilation}, {g.kw}, {g.w});\n",
        *_tile_body(a, rows, prefetch, load),
        *(f"  lospmm_st(Yb, {r}, {hwo}, {epilogue.applied(f'acc{i}', int(r))});\n" for i, r in enumerate(rows)),
        "  LOSPMM_TILE_END\n}\n"])


def shard_groups(costs: list[int], shard_nnz: int) -> list[list[int]]:
    """Consecutive functions grouped into units of at most `shard_nnz` multiply-adds (a function
    costing more is a unit of its own). Every function is in exactly one group, in order."""
    groups: list[list[int]] = []
    total = 0
    for i, cost in enumerate(costs):
        if not groups or total + cost > shard_nnz:
            groups.append([])
            total = 0
        groups[-1].append(i)
        total += cost
    return groups


def _units(prefix: str, functions: list[str], costs: list[int], shard_nnz: int) -> list[str]:
    # A unit's text depends on its own functions only, so a kernel in which one tile changed shares
    # every other unit (and its compile-cache entry) with the kernel before the change.
    return [PREAMBLE + f"// lospmm unit: {prefix}_{g[0]}..{prefix}_{g[-1]}\n" + "".join(functions[i] for i in g)
            for g in shard_groups(costs, shard_nnz)]


def _tile_function(a: sp.csr_matrix, t: int, rows: np.ndarray, prefetch: int) -> str:
    return "".join([
        f"LOSPMM_TILE void tile_{t}(const float* __restrict__ Bn, float* __restrict__ Cn, const int N) {{\n",
        *_tile_body(a, rows, prefetch, lambda j, column: f"  const float b{j} = lospmm_ld(Bn, {4 * column}, N);\n"),
        *(f"  lospmm_st(Cn, {r}, N, acc{i});\n" for i, r in enumerate(rows)),
        "  LOSPMM_TILE_END\n}\n"])


def _tile_body(a: sp.csr_matrix, rows: np.ndarray, prefetch: int, load) -> list[str]:
    """A tile's accumulators, its B loads (`load(j, column)`: the statement that defines b{j})
    issued `prefetch` columns ahead of their use, and one multiply-add per nonzero."""
    sub = a[rows].tocsc()
    sub.sort_indices()
    cols = np.flatnonzero(np.diff(sub.indptr))
    lits = float_literal(sub.data)
    out = ["  float " + ", ".join(f"acc{i} = 0.0f" for i in range(len(rows))) + ";\n"]
    loads = [load(j, int(c)) for j, c in enumerate(cols)]
    out.extend(loads[:prefetch])
    for j, c in enumerate(cols):
        if j + prefetch < len(loads):
            out.append(loads[j + prefetch])
        lo, hi = sub.indptr[c], sub.indptr[c + 1]
        out.append("  " + " ".join(f"acc{sub.indices[p]} += b{j} * {lits[p]};" for p in range(lo, hi)) + "\n")
    return out


def _tile_costs(a: sp.csr_matrix, tiles: Tiles) -> list[int]:
    nnz = np.diff(a.indptr)
    return [int(nnz[tiles.tile(t)].sum()) for t in range(tiles.num_tiles)]


def _entry_unit(header: str, num_tiles: int, tile_signature: str, zero_functions: list[tuple[str, str]],
                kernel_head: str, tile_args: str, zero_args: str) -> str:
    """The entry unit: the tile functions' declarations, the zeroing blocks' functions (signature,
    body), and the kernel (`kernel_head`: its signature and per-thread set-up) dispatching on the block."""
    cases = [f"    case {t}: tile_{t}({tile_args}); break;\n" for t in range(num_tiles)]
    cases += [f"    case {num_tiles + z}: zero_{z}({zero_args}); break;\n" for z in range(len(zero_functions))]
    return "".join([
        PREAMBLE, header, " (entry unit)\n",
        *(f"LOSPMM_TILE void tile_{t}{tile_signature};\n" for t in range(num_tiles)),
        *(f"__device__ __forceinline__ void zero_{z}{signature} {{\n{body}}}\n"
          for z, (signature, body) in enumerate(zero_functions)),
        kernel_head, f"  switch (blockIdx.x) {{\n{''.join(cases)}    default: break;\n  }}\n}}\n"])


def _zero_blocks(empty_rows: np.ndarray, per_block: int) -> list[np.ndarray]:
    return [empty_rows[i:i + per_block] for i in range(0, len(empty_rows), per_block)]


def proxy_kernel_source(m: int, k: int, clusters, params: CodegenParams = CodegenParams()) -> KernelSource:
    """The M1 proxy of §5.1: one kernel for every N1 (block size, grid and the tile -> cluster map
    are launch arguments), one block function per cluster, NNC_p iterations of one B load and CPL
    multiply-adds each, results stored to the block's own rows (`tile_rows`, −1 padded)."""
    m1 = clusters.m1
    name = kernel_name("lospmm_proxy", m, k, m1, clusters.nnc_p.tobytes(), clusters.cpl.tobytes(),
                       b"".join(c.tobytes() for c in clusters.columns), params.prefetch, params.shard_nnz)
    header = (f"// lospmm proxy {name}: M={m} K={k} M1={m1} clusters={clusters.num_clusters} "
              f"NNC_p={clusters.nnc_p.tolist()} CPL={clusters.cpl.tolist()}")
    signature = "(const float* __restrict__ Bn, float* __restrict__ Cn, const int N, const int* __restrict__ rows)"
    functions = []
    for c in range(clusters.num_clusters):
        cols, cpl = clusters.columns[c], int(clusters.cpl[c])
        out = [f"LOSPMM_TILE void proxy_{c}{signature} {{\n"]
        out.append("  float " + ", ".join(f"acc{i} = 0.0f" for i in range(m1)) + ";\n")
        loads = [f"  const float b{j} = lospmm_ld(Bn, {4 * int(col)}, N);\n" for j, col in enumerate(cols)]
        out.extend(loads[:params.prefetch])
        for j in range(len(cols)):
            if j + params.prefetch < len(loads):
                out.append(loads[j + params.prefetch])
            # distinct constants keep the multiply-adds from being folded together
            out.append("  " + " ".join(f"acc{(j * cpl + q) % m1} += b{j} * {1 + ((j * cpl + q) % 97) / 128:.7f}f;"
                                       for q in range(cpl)) + "\n")
        out.extend(f"  {{ const int r = rows[{i}]; if (r >= 0) lospmm_st(Cn, r, N, acc{i}); }}\n"
                   for i in range(m1))
        out.append("  LOSPMM_TILE_END\n}\n")
        functions.append("".join(out))
    costs = [len(clusters.columns[c]) * int(clusters.cpl[c]) for c in range(clusters.num_clusters)]
    cases = "".join(f"    case {c}: proxy_{c}(Bn, Cn, N, rows); break;\n" for c in range(clusters.num_clusters))
    entry = (PREAMBLE + header + " (entry unit)\n"
             + "".join(f"LOSPMM_TILE void proxy_{c}{signature};\n" for c in range(clusters.num_clusters))
             + f"LOSPMM_KERNEL void {name}(const float* __restrict__ B, float* __restrict__ C, const int N, "
             f"const int* __restrict__ cluster_of, const int* __restrict__ tile_rows) {{\n"
             f"  const int n = blockIdx.y * blockDim.x + threadIdx.x;\n"
             f"  if (n >= N) return;\n"
             f"  const float* Bn = B + n;\n"
             f"  float* Cn = C + n;\n"
             f"  const int* rows = tile_rows + blockIdx.x * {m1};\n"
             f"  switch (cluster_of[blockIdx.x]) {{\n{cases}    default: break;\n  }}\n}}\n")
    units = _units("proxy", functions, costs, params.shard_nnz) + [entry]
    return KernelSource(name, "proxy", tuple(units),
                        ("const float* B", "float* C", "int N", "const int* cluster_of", "const int* tile_rows"),
                        m, k, m1, 0, len(clusters.cluster_of), len(clusters.cluster_of))


def proxy_tile_rows(tiles: Tiles) -> np.ndarray:
    """The `tile_rows` argument of a proxy: each tile's rows, padded with −1 to M1."""
    out = np.full((tiles.num_tiles, tiles.m1), -1, dtype=np.int32)
    for t in range(tiles.num_tiles):
        rows = tiles.tile(t)
        out[t, :len(rows)] = rows
    return out
