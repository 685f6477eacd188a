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
    nnz = np.diff(a.indptr)
    costs = [int(nnz[tiles.tile(t)].sum()) for t in range(tiles.num_tiles)]
    signature = "(const float* __restrict__ Bn, float* __restrict__ Cn, const int N)"
    entry = [PREAMBLE, header, " (entry unit)\n"]
    entry += [f"LOSPMM_TILE void tile_{t}{signature};\n" for t in range(tiles.num_tiles)]
    zero_blocks = _zero_blocks(tiles.empty_rows, max(tiles.m1, 1))
    for z, rows in enumerate(zero_blocks):
        stores = "".join(f"  lospmm_st(Cn, {r}, N, 0.0f);\n" for r in rows)
        entry.append(f"__device__ __forceinline__ void zero_{z}(float* __restrict__ Cn, const int N) {{\n"
                     f"{stores}}}\n")
    cases = [f"    case {t}: tile_{t}(Bn, Cn, N); break;\n" for t in range(tiles.num_tiles)]
    cases += [f"    case {tiles.num_tiles + z}: zero_{z}(Cn, N); break;\n" for z in range(len(zero_blocks))]
    entry.append(
        # No __launch_bounds__: with it NVRTC ignores --maxrregcount, which §3.2 relies on.
        f"LOSPMM_KERNEL void {name}(const float* __restrict__ B, float* __restrict__ C, "
        f"const int N) {{\n"
        f"  const int n = blockIdx.y * {n1} + threadIdx.x;\n"
        f"  if (n >= N) return;\n"
        f"  const float* Bn = B + n;\n"
        f"  float* Cn = C + n;\n"
        f"  switch (blockIdx.x) {{\n{''.join(cases)}    default: break;\n  }}\n}}\n"
    )
    units = _units("tile", functions, costs, params.shard_nnz) + ["".join(entry)]
    return KernelSource(name, "full", tuple(units), ("const float* B", "float* C", "int N"), m, k,
                        tiles.m1, n1, tiles.num_tiles + len(zero_blocks), tiles.num_tiles)


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
    sub = a[rows].tocsc()
    sub.sort_indices()
    cols = np.flatnonzero(np.diff(sub.indptr))
    lits = float_literal(sub.data)
    out = [f"LOSPMM_TILE void tile_{t}(const float* __restrict__ Bn, float* __restrict__ Cn, const int N) {{\n"]
    out.append("  float " + ", ".join(f"acc{i} = 0.0f" for i in range(len(rows))) + ";\n")
    loads = [f"  const float b{j} = lospmm_ld(Bn, {4 * c}, N);\n" for j, c in enumerate(cols)]
    out.extend(loads[:prefetch])
    for j, c in enumerate(cols):
        if j + prefetch < len(loads):
            out.append(loads[j + prefetch])
        lo, hi = sub.indptr[c], sub.indptr[c + 1]
        out.append("  " + " ".join(f"acc{sub.indices[p]} += b{j} * {lits[p]};" for p in range(lo, hi)) + "\n")
    out.extend(f"  lospmm_st(Cn, {r}, N, acc{i});\n" for i, r in enumerate(rows))
    out.append("  LOSPMM_TILE_END\n}\n")
    return "".join(out)


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
