"""Half-precision full kernels (issue 23): C = A·B with B and C in fp16 or bf16, A's nonzeros
baked in as literals of the same dtype.

Each thread computes two adjacent output columns held as one packed pair (a 32-bit register), so
one `fma.rn.f16x2` (or `.bf16x2`) — with the literal pair as the instruction's immediate, one SASS
HFMA2 — does the two multiply-adds of a nonzero: half the instructions per useful FLOP of the fp32
kernel at two columns per thread, and half the bytes of B and C. N is even (the launcher pads it).

The accumulation is a choice (Precision.accumulate), to be settled by measurement on the device:
- `packed`: the pair accumulates in the dtype (one instruction per nonzero; the error grows with the
  row's nonzeros);
- `f32`: B's pair converted to two floats once per load, two fp32 FMAs per nonzero with the literal
  rounded to the dtype, one conversion at the store (the error of an fp32 accumulation);
- `packed` with `promote_every=k`: the packed sum added into an fp32 pair every k nonzeros of a row.

A's values are rounded to the dtype before anything else (`rounded_matrix`): a value that rounds to
zero is not baked (`RoundingReport` counts it and the subnormals), and the check's reference is
computed from the same rounded A and B, so nothing is silently left out of the check.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from lospmm.stages.codegen import (BASELINE, PREAMBLE, CodegenParams, Epilogue, KernelDesign, activated, KernelSource, LaunchLayout,
                                   _checked_tile, _entry_unit, _tile_costs, _units, _zero_blocks, kernel_name,
                                   proxy_layout)

DTYPES = ("fp16", "bf16")
ACCUMULATIONS = ("packed", "f32")


@dataclass(frozen=True)
class Precision:
    """A half kernel's number format. Defaults: dtype="fp16", accumulate="packed" (the pair sums in
    the dtype), promote_every=0 (packed sums never moved into fp32; k > 0: every k nonzeros of a row)."""

    dtype: str = "fp16"
    accumulate: str = "packed"
    promote_every: int = 0

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: a half kernel is one of {', '.join(DTYPES)}")
        if self.accumulate not in ACCUMULATIONS:
            raise ValueError(f"accumulate {self.accumulate!r}: choose one of {', '.join(ACCUMULATIONS)}")
        if self.promote_every < 0 or (self.promote_every and self.accumulate != "packed"):
            raise ValueError("promote_every is a count >= 1 of a packed accumulation's nonzeros (0: never)")

    @property
    def label(self) -> str:
        return f"{self.dtype}-{self.accumulate}" + (f"-promote{self.promote_every}" if self.promote_every else "")

    def facts(self) -> dict:
        return {"dtype": self.dtype, "accumulate": self.accumulate, "promote_every": self.promote_every}


def precision_of(design: KernelDesign) -> Precision | None:
    """A half design's number format (None for an fp32 design)."""
    if not design.half:
        return None
    return Precision(design.dtype, design.accumulate, design.promote_every)


def half_design(precision: Precision, design: KernelDesign = BASELINE) -> KernelDesign:
    """The half form of an fp32 `design` in `precision`: its loads, one packed pair per thread (v=2),
    the baseline's grid. ValueError naming the design when it has no half form (another grid, vector
    width or streamed values) or is a half design of another precision already."""
    if design.half:
        if precision_of(design) != precision:
            raise ValueError(f"design {design.label} is not {precision.label}")
        return design
    if design.code_key not in (BASELINE.code_key, replace(BASELINE, loads="chained").code_key):
        raise ValueError(f"design {design.label}: a half kernel holds one packed pair per thread in the baseline's "
                         f"grid (tile-x, one walk), with based or chained loads, so far")
    return replace(design, dtype=precision.dtype, accumulate=precision.accumulate,
                   promote_every=precision.promote_every, columns_per_thread=2)


# --- rounding to the dtype (numpy; the host emulation's shim does the same in C) -----------------------


def to_dtype_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64/float32 values rounded to nearest even in fp16 or bf16, as uint16 bit patterns."""
    x = np.asarray(values, np.float64)
    if dtype == "fp16":
        with np.errstate(over="ignore"):  # an overflow is ±inf, which rounded_matrix counts and refuses
            return x.astype(np.float16).view(np.uint16)  # numpy rounds double to half correctly (RNE)
    return _bf16_bits(x)


def from_dtype_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    """uint16 bit patterns of fp16 or bf16 as float64 (exact)."""
    b = np.asarray(bits, np.uint16)
    if dtype == "fp16":
        return b.view(np.float16).astype(np.float64)
    return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even of float64 to bfloat16 in one rounding (not through float32, which
    would round twice): the value's significand scaled to 8 bits and rounded by numpy's rint."""
    out = np.zeros(x.shape, np.uint16)
    sign = np.signbit(x).astype(np.uint16) << 15
    a = np.abs(x)
    nan, inf = np.isnan(a), ~np.isfinite(a) & ~np.isnan(a)
    finite = np.isfinite(a) & (a > 0)
    m, e = np.frexp(np.where(finite, a, 1.0))  # a = m·2^e, m in [0.5, 1)
    normal = finite & (e - 1 >= -126)
    q = np.rint(np.ldexp(m, 8))  # the 8-bit significand, 128..256 (256: rounded up to the next binade)
    exp = (e - 1) + (q == 256)
    q = np.where(q == 256, 128, q)
    big = normal & (exp > 127)
    enc = ((exp + 127).astype(np.int64) << 7) | (q.astype(np.int64) - 128)
    out = np.where(normal & ~big, enc, out)
    sub = finite & ~normal  # multiples of 2^-133; a round up to 128 is the smallest normal's encoding
    out = np.where(sub, np.rint(np.ldexp(np.where(sub, a, 0.0), 133)).astype(np.int64), out)
    out = np.where(big | inf, 0x7F80, out)
    out = np.where(nan, 0x7FC0, out)
    return (out.astype(np.uint16) | sign).astype(np.uint16)


@dataclass(frozen=True)
class RoundingReport:
    """What rounding A to the dtype did: nonzeros that became zero (not baked; the reference sees
    them as zero too), ones that became subnormal, and ones that overflowed to ±inf."""

    nnz: int
    to_zero: int
    subnormal: int
    overflow: int

    def facts(self) -> dict:
        return vars(self).copy()


def rounded_matrix(matrix: sp.csr_matrix, dtype: str) -> tuple[sp.csr_matrix, RoundingReport]:
    """A with every value rounded to `dtype` (float64 values that are exactly representable), its
    zeros after rounding removed, and the count of each kind of loss."""
    a = sp.csr_matrix(matrix, dtype=np.float64, copy=True)
    a.sort_indices()
    bits = to_dtype_bits(a.data, dtype)
    values = from_dtype_bits(bits, dtype)
    tiny = 2.0 ** (-14 if dtype == "fp16" else -126)
    report = RoundingReport(int(a.nnz), int(np.count_nonzero(values == 0)),
                            int(np.count_nonzero((values != 0) & (np.abs(values) < tiny))),
                            int(np.count_nonzero(~np.isfinite(values))))
    if report.overflow:
        raise ValueError(f"{report.overflow} of A's values overflow {dtype} (|w| > its largest finite value)")
    a.data = values
    a.eliminate_zeros()
    return a, report


# --- the kernel ------------------------------------------------------------------------------------

# Device helpers for half kernels, in their units only (the fp32 kernels' text is unchanged). The host
# emulation's shim defines the same names in C++ with exact rounding (hostemu.HALF_SHIM).
HALF_PREAMBLE = r"""#if !defined(LOSPMM_HOST_EMULATION) && !defined(LOSPMM_HALF_PREAMBLE)
#define LOSPMM_HALF_PREAMBLE
typedef unsigned short lospmm_h16;
// the pair of columns (n, n+1) of row `off2 / 2`: one 32-bit load, column n in the low half
__device__ __forceinline__ unsigned lospmm_ldh2(const lospmm_h16* base, int off2, int n) {
  unsigned v;
  asm("{ .reg .u64 a; mad.wide.s32 a, %1, %2, %3; ld.global.nc.b32 %0, [a]; }" : "=r"(v) : "r"(off2), "r"(n), "l"(base));
  return v;
}
// chained: p moves DELTA2 / 2 rows of B (DELTA2 a literal) and the pair is read there (one IMAD.WIDE)
#define LOSPMM_LDCH2(v, p, n, DELTA2) \
  asm("{ .reg .s64 t; mul.wide.s32 t, %2, " #DELTA2 "; add.s64 %1, %1, t; ld.global.nc.b32 %0, [%1]; }" : "=r"(v), "+l"(p) : "r"(n))
__device__ __forceinline__ void lospmm_sth2(lospmm_h16* base, int row, int n, unsigned v) {
  asm volatile("{ .reg .s64 r, m, a; cvt.s64.s32 r, %0; cvt.s64.s32 m, %1; mul.lo.s64 a, r, m; shl.b64 a, a, 1; add.s64 a, a, %2; st.global.b32 [a], %3; }" :: "r"(row), "r"(n), "l"(base), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned lospmm_fma_fp16(unsigned lit, unsigned b, unsigned acc) {
  unsigned d; asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(lit), "r"(b), "r"(acc)); return d;
}
__device__ __forceinline__ unsigned lospmm_fma_bf16(unsigned lit, unsigned b, unsigned acc) {
  unsigned d; asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(lit), "r"(b), "r"(acc)); return d;
}
__device__ __forceinline__ void lospmm_unpack_fp16(unsigned v, float& lo, float& hi) {
  asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }" : "=f"(lo), "=f"(hi) : "r"(v));
}
__device__ __forceinline__ void lospmm_unpack_bf16(unsigned v, float& lo, float& hi) {
  lo = __uint_as_float(v << 16); hi = __uint_as_float(v & 0xffff0000u);
}
__device__ __forceinline__ unsigned lospmm_pack_fp16(float lo, float hi) {
  unsigned d; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo)); return d;
}
__device__ __forceinline__ unsigned lospmm_pack_bf16(float lo, float hi) {
  unsigned d; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo)); return d;
}
#endif
"""


def half_kernel_source(matrix: sp.csr_matrix, tiles, n1: int, precision: Precision | None = None,
                       params: CodegenParams = CodegenParams(), epilogue: Epilogue = Epilogue()) -> KernelSource:
    """Alg. 2 in half precision for every A_tile of `tiles` (tiles of the rounded A: call
    rounded_matrix first, so that values that round to zero are not in the tiles), blocks of `n1`
    threads, two columns per thread. Parameters (B, C, N): B K×N and C M×N in the dtype, N even.
    The number format is `precision`, or the half design's of `params.design` (default fp16 packed);
    the source's design is the half design of both."""
    a = sp.csr_matrix(matrix, dtype=np.float64)
    a.sort_indices()
    _checked_tile(n1)
    if epilogue.bias and len(epilogue.bias) != a.shape[0]:
        raise ValueError(f"bias has {len(epilogue.bias)} values for {a.shape[0]} output rows")
    if params.n1_at_launch:
        raise ValueError("a half kernel bakes its N1 in (N1 at launch is the fp32 kernels' so far)")
    precision = precision or precision_of(params.design) or Precision()
    design = half_design(precision, params.design)  # ValueError: no half form, or another precision
    bits = to_dtype_bits(a.data, precision.dtype)
    if not np.array_equal(from_dtype_bits(bits, precision.dtype), a.data):
        raise ValueError(f"A holds values that are not {precision.dtype}: round it with rounded_matrix first")
    m, k = a.shape
    name = kernel_name("lospmm_half", m, k, a.indptr.tobytes(), a.indices.tobytes(), bits.tobytes(),
                       tiles.rows.tobytes(), tiles.tile_ptr.tobytes(), n1, params.prefetch, params.shard_nnz,
                       precision.label, design.loads,
                       *(() if epilogue.empty else ("epilogue", *epilogue.name_parts())))
    header = (f"// lospmm half kernel {name}: M={m} K={k} nnz={a.nnz} M1={tiles.m1} N1={n1} tiles={tiles.num_tiles} "
              f"prefetch={params.prefetch} {precision.label} loads={design.loads}"
              + (f" bias={bool(epilogue.bias)} activation={epilogue.activation or 'none'}" if not epilogue.empty else ""))
    signature = "(const lospmm_h16* __restrict__ Bn, lospmm_h16* __restrict__ Cn, const int N)"
    functions = [_half_tile_function(a, t, tiles.tile(t), params.prefetch, precision, signature, design.loads,
                                     epilogue) for t in range(tiles.num_tiles)]
    zero_functions = [("(lospmm_h16* __restrict__ Cn, const int N)",
                       "".join(f"  lospmm_sth2(Cn, {r}, N, {_zero_pair(epilogue, int(r), precision.dtype)});\n"
                               for r in rows))
                      for rows in _zero_blocks(tiles.empty_rows, max(tiles.m1, 1))]
    head = (f"LOSPMM_KERNEL void {name}(const lospmm_h16* __restrict__ B, lospmm_h16* __restrict__ C, const int N) {{\n"
            f"  if (N % 2 != 0) __trap();\n"
            f"  const int n = blockIdx.y * {2 * n1} + threadIdx.x * 2;\n"
            f"  if (n >= N) return;\n"
            f"  const lospmm_h16* Bn = B + n;\n  lospmm_h16* Cn = C + n;\n")
    preamble = PREAMBLE + HALF_PREAMBLE
    entry = _entry_unit(header, tiles.num_tiles, signature, zero_functions, head, "Bn, Cn, N", "zero_{z}(Cn, N)",
                        "x", preamble)
    units = _units("tile", functions, _tile_costs(a, tiles), params.shard_nnz, preamble) + [entry]
    layout = LaunchLayout(tiles.num_tiles + len(zero_functions), n1, design.columns_per_thread)
    return KernelSource(name, "full", tuple(units), ("const lospmm_h16* B", "lospmm_h16* C", "int N"), m, k,
                        tiles.m1, layout, tiles.num_tiles, design)


def _pair_literal(bits: int) -> str:
    return f"0x{(bits << 16) | bits:08x}u"


def _zero_pair(epilogue: Epilogue, row: int, dtype: str) -> str:
    """The stored pair of a row with no nonzero: 0, or its epilogue's value (the activated bias)."""
    if epilogue.empty:
        return "0u"
    x = np.float64(np.float32(epilogue.bias[row]) if epilogue.bias else 0.0)
    return _pair_literal(int(to_dtype_bits(activated(np.array([x]), epilogue.activation), dtype)[0]))


def _half_body(columns: list[int], nonzeros: list[list[tuple[int, int]]], num_rows: int, prefetch: int,
               precision: Precision, loads_from: str) -> tuple[list[str], list[tuple[str, str]]]:
    """A half tile's straight-line code: `num_rows` accumulators, the B pair of each of `columns`
    loaded `prefetch` columns ahead, and per column its nonzeros (row, the value's dtype bits) as
    packed (or fp32) multiply-adds. Returns the lines and, per row, (lines that finish its sum, the
    packed pair to store)."""
    dtype = precision.dtype
    packed = precision.accumulate == "packed"
    promote = precision.promote_every
    out = ["  const lospmm_h16* p = Bn;\n"] if loads_from == "chained" else []
    if packed:
        out.append("  unsigned " + ", ".join(f"acc{i} = 0u" for i in range(num_rows)) + ";\n")
    if not packed or promote:
        out.append("  float " + ", ".join(f"lo{i} = 0.0f, hi{i} = 0.0f" for i in range(num_rows)) + ";\n")

    def load(j: int, c: int) -> str:
        if loads_from == "chained":  # from the previous column's address: one IMAD.WIDE and the load
            step = c - (columns[j - 1] if j else 0)
            return f"  unsigned b{j}; LOSPMM_LDCH2(b{j}, p, N, {2 * step});\n"
        return f"  const unsigned b{j} = lospmm_ldh2(Bn, {2 * c}, N);\n"

    loads = [load(j, c) + ("" if packed else f"  float bl{j}, bh{j}; lospmm_unpack_{dtype}(b{j}, bl{j}, bh{j});\n")
             for j, c in enumerate(columns)]
    out.extend(loads[:prefetch])
    counts = np.zeros(num_rows, np.int64)
    for j in range(len(columns)):
        if j + prefetch < len(loads):
            out.append(loads[j + prefetch])
        statements = []
        for i, bits in nonzeros[j]:
            if packed:
                statements.append(f"acc{i} = lospmm_fma_{dtype}({_pair_literal(bits)}, b{j}, acc{i});")
                counts[i] += 1
                if promote and counts[i] % promote == 0:
                    statements.append(_promoted(i, dtype))
            else:
                lit = np.format_float_scientific(np.float32(from_dtype_bits(np.array([bits]), dtype)[0]), unique=True,
                                                 trim="0") + "f"
                statements.append(f"lo{i} = fmaf(bl{j}, {lit}, lo{i}); hi{i} = fmaf(bh{j}, {lit}, hi{i});")
        out.append("  " + " ".join(statements) + "\n")
    finish = []
    for i in range(num_rows):
        if packed and not promote:
            finish.append(("", f"acc{i}", None))
        else:
            pending = "  " + _promoted(i, dtype) + "\n" if packed and counts[i] % promote else ""
            finish.append((pending, None, (f"lo{i}", f"hi{i}")))
    return out, finish


def _store(finish: tuple, row: int, dtype: str, epilogue: Epilogue, target: str = "", guard: str = "") -> str:
    """The lines that store one row's pair (`finish`: _half_body's (pending lines, packed sum, fp32
    pair)) to C's row `target` (default: `row`), through `epilogue` (row `row`'s bias): the pair as
    two floats, the bias added and the activation applied in fp32, rounded once to the dtype at the
    pack. `guard`: a condition the store is under."""
    pending, packed, floats = finish
    where = f"if ({guard}) " if guard else ""
    target = target or str(row)
    if epilogue.empty:
        value = packed if packed else f"lospmm_pack_{dtype}({floats[0]}, {floats[1]})"
        return f"{pending}  {where}lospmm_sth2(Cn, {target}, N, {value});\n"
    lo, hi = floats or ("l", "h")
    unpack = f"float l, h; lospmm_unpack_{dtype}({packed}, l, h); " if packed else ""
    value = f"lospmm_pack_{dtype}({epilogue.applied(lo, row)}, {epilogue.applied(hi, row)})"
    return f"{pending}  {where}{{ {unpack}lospmm_sth2(Cn, {target}, N, {value}); }}\n"


def _half_tile_function(a: sp.csr_matrix, t: int, rows: np.ndarray, prefetch: int, precision: Precision,
                        signature: str, loads_from: str = "based", epilogue: Epilogue = Epilogue()) -> str:
    sub = a[rows].tocsc()
    sub.sort_indices()
    cols = np.flatnonzero(np.diff(sub.indptr))
    bits = to_dtype_bits(sub.data, precision.dtype)
    nonzeros = [[(int(sub.indices[p]), int(bits[p])) for p in range(sub.indptr[c], sub.indptr[c + 1])] for c in cols]
    body, finish = _half_body([int(c) for c in cols], nonzeros, len(rows), prefetch, precision, loads_from)
    stores = [_store(f, int(r), precision.dtype, epilogue) for r, f in zip(rows, finish)]
    return "".join([f"LOSPMM_TILE void tile_{t}{signature} {{\n", *body, *stores, "  LOSPMM_TILE_END\n}\n"])


def _promoted(i: int, dtype: str) -> str:
    """The packed sum of row i added into its fp32 pair, and reset."""
    return (f"{{ float l, h; lospmm_unpack_{dtype}(acc{i}, l, h); lo{i} += l; hi{i} += h; acc{i} = 0u; }}")


def half_proxy_kernel_source(m: int, k: int, clusters, params: CodegenParams) -> KernelSource:
    """The M1 proxy (§5.1, codegen.proxy_kernel_source) of a half design (`params.design`): one block
    function per cluster, NNC_p loads of a B pair and CPL packed multiply-adds each (of distinct
    literal pairs, so none fold), in the design's accumulation and loads; rows tile·M1 + i of C
    from the block index (rows past M skipped). Parameters (B, C, N, cluster_of), N even."""
    design = params.design
    precision = precision_of(design)
    if precision is None:
        raise ValueError(f"design {design.label} is not a half design")
    m1 = clusters.m1
    name = kernel_name("lospmm_half_proxy", m, k, m1, clusters.nnc_p.tobytes(), clusters.cpl.tobytes(),
                       b"".join(c.tobytes() for c in clusters.columns), params.prefetch, params.shard_nnz,
                       precision.label, design.loads)
    header = (f"// lospmm half proxy {name}: M={m} K={k} M1={m1} clusters={clusters.num_clusters} "
              f"NNC_p={clusters.nnc_p.tolist()} CPL={clusters.cpl.tolist()} {precision.label} loads={design.loads}")
    signature = "(const lospmm_h16* __restrict__ Bn, lospmm_h16* __restrict__ Cn, const int N)"
    functions = []
    for c in range(clusters.num_clusters):
        cols, cpl = [int(x) for x in clusters.columns[c]], int(clusters.cpl[c])
        slots = [[(j * cpl + q) % m1 for q in range(cpl)] for j in range(len(cols))]
        values = to_dtype_bits(np.array([[1 + ((j * cpl + q) % 97) / 128 for q in range(cpl)] for j in range(len(cols))],
                                        np.float64).reshape(len(cols), cpl), precision.dtype)
        nonzeros = [[(i, int(values[j, q])) for q, i in enumerate(slots[j])] for j in range(len(cols))]
        body, finish = _half_body(cols, nonzeros, m1, params.prefetch, precision, design.loads)
        stores = ["  { const int r0 = blockIdx.x * " + str(m1) + ";\n",
                  *(_store(f, i, precision.dtype, Epilogue(), f"r0 + {i}", f"r0 + {i} < {m}")
                    for i, f in enumerate(finish)),
                  "  }\n"]
        functions.append("".join([f"LOSPMM_TILE void proxy_{c}{signature} {{\n", *body, *stores,
                                  "  LOSPMM_TILE_END\n}\n"]))
    costs = [len(clusters.columns[c]) * int(clusters.cpl[c]) for c in range(clusters.num_clusters)]
    cases = "".join(f"    case {c}: proxy_{c}(Bn, Cn, N); break;\n" for c in range(clusters.num_clusters))
    preamble = PREAMBLE + HALF_PREAMBLE
    entry = (preamble + header + " (entry unit)\n"
             + "".join(f"LOSPMM_TILE void proxy_{c}{signature};\n" for c in range(clusters.num_clusters))
             + f"LOSPMM_KERNEL void {name}(const lospmm_h16* __restrict__ B, lospmm_h16* __restrict__ C, const int N, "
             f"const int* __restrict__ cluster_of) {{\n"
             + "  if (N % 2 != 0) __trap();\n  const int n = blockIdx.y * (blockDim.x * 2) + threadIdx.x * 2;\n"
             + "  if (n >= N) return;\n  const lospmm_h16* Bn = B + n;\n  lospmm_h16* Cn = C + n;\n"
             + f"  switch (cluster_of[blockIdx.x]) {{\n{cases}    default: break;\n  }}\n}}\n")
    units = _units("proxy", functions, costs, params.shard_nnz, preamble) + [entry]
    return KernelSource(name, "proxy", tuple(units),
                        ("const lospmm_h16* B", "lospmm_h16* C", "int N", "const int* cluster_of"),
                        m, k, m1, proxy_layout(len(clusters.cluster_of), design), len(clusters.cluster_of), design)


# --- the reference and the check -------------------------------------------------------------------


def sum_to_odd(p: np.ndarray, c: np.ndarray) -> np.ndarray:
    """p + c in float64 rounded to odd (TwoSum's error sets the last bit): rounded from there to a
    16-bit dtype (≤ 51 bits fewer), it rounds as the exact sum does — one rounding, as fma.rn."""
    s = p + c
    bb = s - p
    e = (p - (s - bb)) + (c - bb)
    even = (s.view(np.int64) & 1) == 0
    with np.errstate(invalid="ignore"):
        return np.where((e != 0) & even & np.isfinite(s), np.nextafter(s, np.copysign(np.inf, e)), s)


def random_b_bits(k: int, n: int, dtype: str, seed: int) -> np.ndarray:
    """A fresh random B (K×n, standard normal, seeded) rounded to `dtype`, as uint16 bits: the data
    every half check draws, so that a library's error can be measured on the same B."""
    return to_dtype_bits(np.random.default_rng(seed).standard_normal((k, n)), dtype)


def packed_reference(matrix: sp.csr_matrix, b_bits: np.ndarray, dtype: str) -> np.ndarray:
    """What a `packed` kernel computes, bit for bit: each output's nonzeros in ascending column
    order, each multiply-add rounded once to the dtype from the exact value (kernel_reference's
    packed case). Returns uint16 bits, M×N."""
    return kernel_reference(matrix, b_bits, Precision(dtype))


def _f32_fma(x: np.ndarray, y: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fmaf(x, y, c) of float32 values, rounded once: the product is exact in float64, the sum
    rounded to odd there (29 bits to spare) and then to float32."""
    return sum_to_odd(np.float64(x) * np.float64(y), np.asarray(c, np.float64)).astype(np.float32)


def _epilogued(value: np.ndarray, row: int, epilogue: Epilogue) -> np.ndarray:
    """The kernel's epilogue on one row's float32 values, in float32 as the kernel computes it (the
    GELU's erff by a correctly rounded erf: within 2 ulps of CUDA's)."""
    x = np.asarray(value, np.float32)
    if epilogue.bias:
        x = x + np.float32(epilogue.bias[row])
    if epilogue.activation == "relu":  # fmaxf(x, 0): 0 for NaN too
        return np.where(x > 0, x, np.float32(0.0)).astype(np.float32)
    if epilogue.activation == "gelu":
        from scipy.special import erf

        e = erf((x * np.float32(0.70710678118654752)).astype(np.float64)).astype(np.float32)
        return (np.float32(0.5) * x) * (np.float32(1.0) + e)
    return x


def kernel_reference(matrix: sp.csr_matrix, b_bits: np.ndarray, precision: Precision,
                     epilogue: Epilogue = Epilogue()) -> np.ndarray:
    """What a correct half kernel of `precision` stores, bit for bit (uint16, M×N), for the rounded A
    (`matrix`) and B's bits: each row's nonzeros in ascending column order — packed FMAs each rounded
    once to the dtype from the exact value (the product of two halves is exact in float64, the sum
    rounded to odd there: sum_to_odd), or fp32 FMAs on the converted pair, or packed sums moved into
    fp32 every `promote_every` — then the epilogue in fp32 and one rounding to the dtype. Rows with
    no nonzero store the epilogue of zero as the kernel's literal does."""
    return _reference(matrix, b_bits, precision, epilogue)[0]


def _reference(matrix: sp.csr_matrix, b_bits: np.ndarray, precision: Precision,
               epilogue: Epilogue) -> tuple[np.ndarray, np.ndarray]:
    """(kernel_reference's bits, each output's fp32 value before the activation: its sum plus bias)."""
    a = sp.csr_matrix(matrix, dtype=np.float64)
    a.sort_indices()
    dtype, promote = precision.dtype, precision.promote_every
    b = from_dtype_bits(b_bits, dtype)
    out = np.zeros((a.shape[0], b.shape[1]), np.uint16)
    pre = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for r in range(a.shape[0]):
        lo, hi = a.indptr[r], a.indptr[r + 1]
        if lo == hi:
            out[r] = int(_zero_pair(epilogue, r, dtype).removesuffix("u"), 16) & 0xFFFF
            pre[r] = np.float32(epilogue.bias[r]) if epilogue.bias else 0.0
            continue
        if precision.accumulate == "f32":
            total = np.zeros(b.shape[1], np.float32)
            for p in range(lo, hi):
                total = _f32_fma(b[a.indices[p]].astype(np.float32), np.float32(a.data[p]), total)
        else:
            acc, total = np.zeros(b.shape[1]), np.zeros(b.shape[1], np.float32)
            for count, p in enumerate(range(lo, hi), 1):
                acc = from_dtype_bits(to_dtype_bits(sum_to_odd(a.data[p] * b[a.indices[p]], acc), dtype), dtype)
                if promote and count % promote == 0:
                    total, acc = total + acc.astype(np.float32), np.zeros(b.shape[1])
            if not promote:  # the packed sum is stored as it is, or unpacked exactly for the epilogue
                total = acc.astype(np.float32)
            elif (hi - lo) % promote:
                total = total + acc.astype(np.float32)
            if not promote and epilogue.empty:
                out[r], pre[r] = to_dtype_bits(acc, dtype), total
                continue
        pre[r] = _epilogued(total, r, Epilogue(epilogue.bias))
        out[r] = to_dtype_bits(_epilogued(total, r, epilogue).astype(np.float64), dtype)
    return out, pre


def bits_apart(x_bits: np.ndarray, y_bits: np.ndarray) -> np.ndarray:
    """How many representable values of a 16-bit dtype lie between two bit patterns (0: equal; ±0
    are 0 apart)."""
    def ordered(bits):
        v = np.asarray(bits, np.int32)
        return np.where(v & 0x8000, -(v & 0x7FFF), v)

    return np.abs(ordered(x_bits) - ordered(y_bits))


# CUDA's erff is within 2 fp32 ulps (|erff| < 1: 2·2^-24), and 1 + erff rounds once more: the GELU's
# 0.5·x·(1 + erff(x/√2)) may differ from the model's by |x|·2^-23. Where 1 + erff cancels (x below
# about -4) that is several values of the dtype, so a GELU's output is allowed it beside one value.
ERFF_ABSOLUTE = 2.0 ** -23


def output_problem(c_bits: np.ndarray, matrix: sp.csr_matrix, b_bits: np.ndarray, precision: Precision,
                   epilogue: Epilogue = Epilogue()) -> str:
    """"" when a half kernel's output equals kernel_reference's value for value (±0 alike, NaN as
    NaN; after a GELU, within one value of the dtype and erff's own error), else one line: how many
    outputs differ and the first of them."""
    want, pre = _reference(matrix, b_bits, precision, epilogue)
    got_v, want_v = from_dtype_bits(c_bits, precision.dtype), from_dtype_bits(want, precision.dtype)
    same = (got_v == want_v) | (np.isnan(got_v) & np.isnan(want_v))
    if epilogue.activation == "gelu":
        # x, the pre-activation value (sum + bias) as the dtype holds it (within its rounding: doubled below)
        x = np.abs(from_dtype_bits(to_dtype_bits(pre.astype(np.float64), precision.dtype), precision.dtype))
        one_value = (np.spacing(np.abs(want_v).astype(np.float16)).astype(np.float64) if precision.dtype == "fp16"
                     else np.abs(want_v) * 2.0 ** -7)  # bf16: 8 significant bits
        same |= bits_apart(c_bits, want) <= 1
        same |= np.abs(got_v - want_v) <= one_value + 2 * x * ERFF_ABSOLUTE
    wrong = ~same
    if not wrong.any():
        return ""
    r, c = (int(x[0]) for x in np.nonzero(wrong))
    got, exp = (from_dtype_bits(np.array([v]), precision.dtype)[0] for v in (c_bits[r, c], want[r, c]))
    return (f"{int(wrong.sum())} of {wrong.size} outputs differ from the kernel's exact model, the first at row {r}, "
            f"column {c}: {got!r}, expected {exp!r}")


UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
SUBNORMAL_SPACING = {"fp16": 2.0 ** -24, "bf16": 2.0 ** -133}


def error_bound(matrix: sp.csr_matrix, precision: Precision) -> tuple[float, float]:
    """(γ, η): a correct kernel's |C − A·B| ≤ γ·Σ|a·b| + η for every output, from k = the most
    nonzeros of a row + 1 roundings (|error| ≤ γ_k Σ|a·b|) and η = k half-spacings of the
    subnormals (a rounding's absolute error there). An fp32 sum rounds once in the dtype. γ is
    capped at 1 (beyond it the bound says nothing: the exact model, kernel_reference, is the check
    that catches a wrong kernel; this bound is the accuracy figure's)."""
    k = int(np.diff(sp.csr_matrix(matrix).indptr).max(initial=0)) + 1
    u = UNIT_ROUNDOFF[precision.dtype]
    if precision.accumulate == "f32":
        gamma = u + k * 2.0 ** -23
    else:
        gamma = k * u / (1 - k * u) if k * u < 0.5 else 1.0
    return min(gamma, 1.0), k * SUBNORMAL_SPACING[precision.dtype] / 2


# an epilogue's rounding beyond the sum's: its fp32 add and activation (erff within 2 ulps), relative
# to the pre-activation value, and the one rounding to the dtype at the pack, relative to the output
EPILOGUE_FP32_ROUNDING = 2.0 ** -22
GELU_LIPSCHITZ = 1.13  # max |gelu'(x)| ≈ 1.129: a sum's error grows by at most this through the GELU


def normalised_error(c: np.ndarray, matrix: sp.csr_matrix, b: np.ndarray, absolute: float = 0.0,
                     epilogue: Epilogue = Epilogue(), dtype: str = "fp16") -> float:
    """max over outputs of (|C − ref| − `absolute`)⁺ / Σ|a·b| (the sum of the output's products'
    magnitudes, |A|·|B|: the scale of the classic summation bound, at most ‖A's row‖·‖B's column‖),
    ref = A·B in float64 on the same rounded A and B (issue 23's accuracy measure, taken alike for
    ours and cuBLAS; `absolute`: the error a rounding among subnormals may add, error_bound's η).
    Through an `epilogue`, ref is its activation of A·B + bias; each output's allowance adds the
    epilogue's own roundings (fp32 for the bias and activation, one rounding to `dtype` at the
    store) and the sum's error is divided by the activation's Lipschitz bound, so the result is
    held against the same γ."""
    a = sp.csr_matrix(matrix, dtype=np.float64)
    ref = a @ b
    scale = np.asarray(abs(a) @ np.abs(b))
    if not epilogue.empty:
        pre = Epilogue(epilogue.bias).reference(ref)
        ref = epilogue.reference(ref)
        lipschitz = GELU_LIPSCHITZ if epilogue.activation == "gelu" else 1.0
        absolute = lipschitz * absolute + EPILOGUE_FP32_ROUNDING * np.abs(pre) + UNIT_ROUNDOFF[dtype] * np.abs(ref)
        scale = lipschitz * scale
    err = np.maximum(np.abs(np.asarray(c, np.float64) - ref) - absolute, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(scale > 0, err / np.where(scale > 0, scale, 1.0), np.where(err > 0, np.inf, 0.0))
    return float(ratio.max()) if ratio.size else 0.0
