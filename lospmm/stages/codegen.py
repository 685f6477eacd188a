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

Designs (`KernelDesign`, issue 20: on the H100 time followed the straight-line code all blocks walk,
so a tile's code should be fetched once and executed many times): the grid's order (tiles along x,
today's, or column blocks along x, so that blocks dispatched together share a tile's code); a block
walking several column blocks of its tile (a grid-stride loop around the tile's code); 2 or 4
output columns per thread (float2/float4 loads of B: one load feeds that many multiply-adds of one
literal); B addresses chained from the previous load (one IMAD.WIDE per load instead of an
IMAD.WIDE and a 64-bit add); and A's values streamed from data by one loop (code O(1) per kernel)
instead of baked into code. How a kernel is launched is one `LaunchLayout`, kept with the source
and in kernel.json; every launcher reads it.

The same text compiles with NVRTC and, under `hostemu.SHIM`, with the host C++ compiler: the host
check compiles `source`, the units' concatenation, so it runs exactly the text compiled unit by unit.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

from lospmm.stages.extract import conv_output_size
if TYPE_CHECKING:  # annotations only: the loader imports this module and need not load numba
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
# The designs' loads and stores (vector and chained), in the units of a kernel of another design than
# the baseline only: the baseline's text stays the text measured before designs existed.
DESIGN_PREAMBLE = r"""#if !defined(LOSPMM_HOST_EMULATION) && !defined(LOSPMM_DESIGN_PREAMBLE)
#define LOSPMM_DESIGN_PREAMBLE
__device__ __forceinline__ float2 lospmm_ld2(const float* base, int off4, int n) {
  float2 v;
  asm("{ .reg .u64 a; mad.wide.s32 a, %2, %3, %4; ld.global.nc.v2.f32 {%0, %1}, [a]; }" : "=f"(v.x), "=f"(v.y) : "r"(off4), "r"(n), "l"(base));
  return v;
}
__device__ __forceinline__ float4 lospmm_ld4(const float* base, int off4, int n) {
  float4 v;
  asm("{ .reg .u64 a; mad.wide.s32 a, %4, %5, %6; ld.global.nc.v4.f32 {%0, %1, %2, %3}, [a]; }" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(off4), "r"(n), "l"(base));
  return v;
}
// chained loads: p moves DELTA4 / 4 rows of B (DELTA4 a literal) and v is read there; ptxas makes
// the multiply and the 64-bit add one IMAD.WIDE, so a load costs two instructions, not four
#define LOSPMM_LDC(v, p, n, DELTA4) \
  asm("{ .reg .s64 t; mul.wide.s32 t, %2, " #DELTA4 "; add.s64 %1, %1, t; ld.global.nc.f32 %0, [%1]; }" : "=f"(v), "+l"(p) : "r"(n))
#define LOSPMM_LDC2(v, p, n, DELTA4) \
  asm("{ .reg .s64 t; mul.wide.s32 t, %3, " #DELTA4 "; add.s64 %2, %2, t; ld.global.nc.v2.f32 {%0, %1}, [%2]; }" \
      : "=f"(v.x), "=f"(v.y), "+l"(p) : "r"(n))
#define LOSPMM_LDC4(v, p, n, DELTA4) \
  asm("{ .reg .s64 t; mul.wide.s32 t, %5, " #DELTA4 "; add.s64 %4, %4, t; ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4]; }" \
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w), "+l"(p) : "r"(n))
// the same with the step in a register (the streamed design reads it from data)
#define LOSPMM_LDCR(v, p, n, delta4) \
  asm("{ .reg .s64 t; mul.wide.s32 t, %2, %3; add.s64 %1, %1, t; ld.global.nc.f32 %0, [%1]; }" : "=f"(v), "+l"(p) : "r"(n), "r"(delta4))
#define LOSPMM_LDCR2(v, p, n, delta4) \
  asm("{ .reg .s64 t; mul.wide.s32 t, %3, %4; add.s64 %2, %2, t; ld.global.nc.v2.f32 {%0, %1}, [%2]; }" \
      : "=f"(v.x), "=f"(v.y), "+l"(p) : "r"(n), "r"(delta4))
#define LOSPMM_LDCR4(v, p, n, delta4) \
  asm("{ .reg .s64 t; mul.wide.s32 t, %5, %6; add.s64 %4, %4, t; ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4]; }" \
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w), "+l"(p) : "r"(n), "r"(delta4))
__device__ __forceinline__ void lospmm_st2(float* base, int row, int n, float2 v) {
  asm volatile("{ .reg .s64 r, m, a; cvt.s64.s32 r, %0; cvt.s64.s32 m, %1; mul.lo.s64 a, r, m; shl.b64 a, a, 2; add.s64 a, a, %2; st.global.v2.f32 [a], {%3, %4}; }" :: "r"(row), "r"(n), "l"(base), "f"(v.x), "f"(v.y) : "memory");
}
__device__ __forceinline__ void lospmm_st4(float* base, int row, int n, float4 v) {
  asm volatile("{ .reg .s64 r, m, a; cvt.s64.s32 r, %0; cvt.s64.s32 m, %1; mul.lo.s64 a, r, m; shl.b64 a, a, 2; add.s64 a, a, %2; st.global.v4.f32 [a], {%3, %4, %5, %6}; }" :: "r"(row), "r"(n), "l"(base), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
#endif
"""


@dataclass(frozen=True)
class KernelDesign:
    """How a full kernel (and its proxies) walks its tiles. Defaults are the kernel measured on the
    H100 in earlier sessions (`baseline`), kept as the default until the device says which design wins.

    order: "tile-x" (blockIdx.x is the tile: blocks dispatched together run different tiles' code)
        or "column-x" (blockIdx.x is the column block: consecutive blocks share one tile's code).
    column_walks: column blocks one block walks. Above 1 the tile's code is a grid-stride loop,
        fetched once per block and executed up to this many times; the grid has
        ceil(column blocks / column_walks) blocks per tile.
    columns_per_thread: 1, 2 or 4 output columns per thread, read and written as float/float2/float4,
        so one B load feeds that many multiply-adds of one literal. N must be a multiple of it
        (`LaunchLayout.launch_columns`: the launchers pad B and C), B and C aligned to its width.
    loads: "based" (each B address from the thread's column: IMAD.WIDE and a 64-bit add) or
        "chained" (from the previous load's address: one IMAD.WIDE).
    a_values: "baked" (A's values are literals in straight-line code, one function per tile) or
        "streamed" (one loop reads each tile's non-empty columns and values from data in the
        cubin: code O(1) in the kernel's size, compile time too).
    dtype: "fp32" (B, C and the literals in float) or "fp16" / "bf16" (codegen_half: B and C in the
        dtype, each thread's two columns one packed pair, so columns_per_thread is 2, one `fma.rn.f16x2`
        per nonzero); a half design has the baseline's grid (tile-x, one walk) and baked values so far.
    accumulate: a half design's sum: "packed" (in the dtype; "" is read as it) or "f32" (B's pair
        converted to floats, two FFMAs per nonzero); "" for fp32.
    promote_every: a packed half sum moved into an fp32 pair every this many nonzeros of a row (0: never)."""

    order: str = "tile-x"
    column_walks: int = 1
    columns_per_thread: int = 1
    loads: str = "based"
    a_values: str = "baked"
    dtype: str = "fp32"
    accumulate: str = ""
    promote_every: int = 0

    def __post_init__(self):
        choices = {"order": ORDERS, "loads": LOADS, "a_values": A_VALUES, "dtype": DTYPES}
        for field_name, allowed in choices.items():
            if getattr(self, field_name) not in allowed:
                raise ValueError(f"design {field_name} must be one of {', '.join(allowed)}, "
                                 f"got {getattr(self, field_name)!r}")
        if self.columns_per_thread not in VECTOR_WIDTHS:
            raise ValueError(f"design columns_per_thread must be one of {VECTOR_WIDTHS}, got {self.columns_per_thread}")
        if self.column_walks < 1:
            raise ValueError(f"design column_walks must be >= 1, got {self.column_walks}")
        if self.half:
            if (self.columns_per_thread, self.order, self.column_walks, self.a_values) != (2, "tile-x", 1, "baked"):
                raise ValueError(f"a {self.dtype} design holds one packed pair per thread (v=2) in the baseline's grid "
                                 f"(tile-x, one walk) with baked values, so far; got {self.label}")
            if self.accumulate not in ("", "packed", "f32"):
                raise ValueError(f"design accumulate {self.accumulate!r}: choose packed or f32")
            if not self.accumulate:  # one spelling per design: equal designs are equal keys
                object.__setattr__(self, "accumulate", "packed")
            if self.promote_every < 0 or (self.promote_every and self.accumulate == "f32"):
                raise ValueError("design promote_every is a count >= 1 of a packed accumulation's nonzeros (0: never)")
        elif self.accumulate or self.promote_every:
            raise ValueError("an fp32 design sums in fp32: accumulate and promote_every are a half design's")

    @property
    def half(self) -> bool:
        """B and C in fp16 or bf16 (codegen_half's kernels)."""
        return self.dtype != "fp32"

    @property
    def element_bytes(self) -> int:
        """Bytes of one element of B and C."""
        return 2 if self.half else 4

    @property
    def looped(self) -> bool:
        return self.column_walks > 1

    @property
    def code_key(self) -> tuple:
        """What of the design shapes the code: the number of walks is a launch fact, only whether
        there is a loop is in the text (a kernel looped for 4 walks runs any number). An fp32
        design's key is what it was before half designs existed."""
        key = (self.order, self.looped, self.columns_per_thread, self.loads, self.a_values)
        return key + (self.dtype, self.accumulate, self.promote_every) if self.half else key

    @property
    def _number_label(self) -> str:
        if not self.half:
            return ""
        return (f"{self.dtype}," + ("acc=f32," if self.accumulate == "f32" else "")
                + (f"promote={self.promote_every}," if self.promote_every else ""))

    @property
    def code_label(self) -> str:
        """The part of the label the code shows (a source's header): the walks' count is a launch fact."""
        return (f"{self._number_label}{self.a_values},{self.loads},{self.order},"
                f"{'looped' if self.looped else 'one walk'},v={self.columns_per_thread}")

    @property
    def label(self) -> str:
        """The design as `design_named` reads it back, e.g. "baked,chained,column-x,walks=4,v=4" or
        "fp16,acc=f32,baked,chained,tile-x,walks=1,v=2"."""
        return (f"{self._number_label}{self.a_values},{self.loads},{self.order},walks={self.column_walks},"
                f"v={self.columns_per_thread}")

    def facts(self) -> dict:
        return {"label": self.label, **vars(self)}


ORDERS = ("tile-x", "column-x")
DTYPES = ("fp32", "fp16", "bf16")
MAX_GRID_Y = 65535
LOADS = ("based", "chained")
A_VALUES = ("baked", "streamed")
VECTOR_WIDTHS = (1, 2, 4)
BASELINE = KernelDesign()


def design_named(text: str) -> KernelDesign:
    """A design from its label's tokens in any order, each optional (the default's value otherwise):
    `baked|streamed`, `based|chained`, `tile-x|column-x`, `walks=W`, `v=1|2|4`, and a half
    design's `fp16|bf16`, `acc=packed|f32`, `promote=K` (a half design is v=2 unless told);
    "baseline" is the default. ValueError naming the token it cannot read."""
    values: dict = {}
    for token in (t.strip() for t in text.split(",")):
        if token in ("", "baseline"):
            continue
        if token in DTYPES:
            values["dtype"] = token
        elif token.startswith("acc=") and token[4:] in ("packed", "f32"):
            values["accumulate"] = token[4:]
        elif token.startswith("promote=") and token[8:].isdigit():
            values["promote_every"] = int(token[8:])
        elif token in A_VALUES:
            values["a_values"] = token
        elif token in LOADS:
            values["loads"] = token
        elif token in ORDERS:
            values["order"] = token
        elif token.startswith(("walks=", "v=")) and token.split("=", 1)[1].isdigit():
            key, value = token.split("=", 1)
            values["column_walks" if key == "walks" else "columns_per_thread"] = int(value)
        else:
            raise ValueError(f"design {text!r}: cannot read {token!r} (tokens: baked|streamed, based|chained, "
                             f"tile-x|column-x, walks=W, v=1|2|4, fp16|bf16, acc=packed|f32, promote=K)")
    if values.get("dtype", "fp32") != "fp32":
        values.setdefault("columns_per_thread", 2)
    return KernelDesign(**values)


@dataclass(frozen=True)
class CodegenParams:
    """Defaults: prefetch=1 (B values loaded one column ahead, Alg. 2's b); shard_nnz=SHARD_NNZ
    (multiply-adds per compiled unit at most; a bigger tile is a unit of its own), chosen from
    benchmarks/shard_compile.py; design=BASELINE (see KernelDesign); n1_at_launch=False (True: a full
    kernel reads its block size from blockDim, as a proxy does, so one cubin serves every N1 of its
    M1 — what a measurement of every kept candidate launches; the emitted kernels bake N1 in)."""

    prefetch: int = 1
    shard_nnz: int = 4096
    design: KernelDesign = BASELINE
    n1_at_launch: bool = False

    def __post_init__(self):
        if self.prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {self.prefetch}")
        if self.shard_nnz < 1:
            raise ValueError(f"shard_nnz must be >= 1, got {self.shard_nnz}")


@dataclass(frozen=True)
class LaunchLayout:
    """How a kernel is launched over N output columns: the one description the runtime, the loader,
    the host emulation, lospmm.torch and the GPU benchmarks read (kernel.json's `launch`).

    row_blocks: blocks along A (its tiles, plus a full kernel's zeroing blocks); threads: per block
    (0 for a proxy, whose N1 under test is given at launch); each thread computes
    columns_per_thread columns and each block walks column_walks column blocks; order says which
    grid axis holds the tiles."""

    row_blocks: int
    threads: int
    columns_per_thread: int = 1
    column_walks: int = 1
    order: str = "tile-x"

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"launch order must be one of {', '.join(ORDERS)}, got {self.order!r}")

    def block(self, threads: int | None = None) -> int:
        block = threads or self.threads
        if block < 1:
            raise ValueError("a proxy's launch needs its N1 (threads per block)")
        return block

    def launch_columns(self, n: int) -> int:
        """The N the kernel is launched with for n columns: a multiple of columns_per_thread (B and
        C padded with columns beyond n when it is not n)."""
        v = self.columns_per_thread
        return -(-n // v) * v

    def column_blocks(self, n: int, threads: int | None = None) -> int:
        return -(-self.launch_columns(n) // (self.block(threads) * self.columns_per_thread))

    def grid(self, n: int, threads: int | None = None) -> tuple[int, int, int]:
        """The launch grid for n columns (a proxy takes the N1 under test as `threads`)."""
        walkers = -(-self.column_blocks(n, threads) // self.column_walks)
        grid = (self.row_blocks, walkers, 1) if self.order == "tile-x" else (walkers, self.row_blocks, 1)
        if grid[1] > MAX_GRID_Y:  # the hardware's limit on y (x takes 2^31 - 1)
            along = "column blocks" if self.order == "tile-x" else "blocks along A"
            raise ValueError(f"{grid[1]} {along} exceed the grid's y limit of {MAX_GRID_Y} ({self.order}; "
                             f"{'more walks or a wider N1' if self.order == 'tile-x' else 'use tile-x or a taller M1'})")
        return grid

    def facts(self) -> dict:
        return dict(vars(self))

    def grid_formula(self, columns: str) -> dict:
        """kernel.json's `grid`, for readers in C++: each axis as a number or a formula of `columns`."""
        per_block = f"{self.threads * self.columns_per_thread}"
        walkers = (f"ceil({columns} / {per_block})" if self.column_walks == 1
                   else f"ceil(ceil({columns} / {per_block}) / {self.column_walks})")
        x, y = (self.row_blocks, walkers) if self.order == "tile-x" else (walkers, self.row_blocks)
        return {"x": x, "y": y, "z": 1}

    @classmethod
    def of_facts(cls, facts: dict) -> "LaunchLayout":
        """The layout kernel.json records; a directory written before `launch` existed had the grid's
        x and N1 only (tiles along x, one column per thread, one walk)."""
        if "launch" in facts:
            return cls(**facts["launch"])
        return cls(row_blocks=int(facts["grid"]["x"]), threads=int(facts["n1"]))


@dataclass(frozen=True)
class KernelSource:
    """Generated source plus what a launcher needs; `params` lists the C parameters in order.
    `units` are compiled separately and linked; the entry unit is last."""

    name: str
    kind: str  # "full" | "conv" | "proxy"
    units: tuple[str, ...]
    params: tuple[str, ...]
    m: int
    k: int
    m1: int
    layout: LaunchLayout
    num_tiles: int
    design: KernelDesign = BASELINE

    @property
    def source(self) -> str:
        """The whole kernel as one text: its units in order (what the host check compiles)."""
        return "".join(self.units)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    @property
    def n1(self) -> int:
        """Threads per block (0 for a proxy: given at launch)."""
        return self.layout.threads

    @property
    def grid_x(self) -> int:
        """Blocks along A: tiles, plus zeroing blocks for a full kernel."""
        return self.layout.row_blocks

    def grid(self, n: int, n1: int | None = None) -> tuple[int, int, int]:
        """Launch grid for N output columns (a proxy takes the N1 under test)."""
        return self.layout.grid(n, n1)


def kernel_name(prefix: str, *parts) -> str:
    """An identifier derived from a hash, never from raw layer names."""
    digest = hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
    return f"{prefix}_{digest}"


def float_literal(values: np.ndarray) -> list[str]:
    """Shortest decimal literals that read back as exactly these float32 values."""
    return [np.format_float_scientific(v, unique=True, trim="0") + "f"
            for v in np.asarray(values, dtype=np.float32)]


_VECTOR_TYPE = {1: "float", 2: "float2", 4: "float4"}
_LANES = {1: ("",), 2: (".x", ".y"), 4: (".x", ".y", ".z", ".w")}
_SUFFIX = {1: "", 2: "2", 4: "4"}


def _zero_value(v: int) -> str:
    return "0.0f" if v == 1 else f"{_VECTOR_TYPE[v]}{{{', '.join(['0.0f'] * v)}}}"


def _design_parts(design: KernelDesign) -> tuple:
    """The design's part of a kernel's name: nothing for the baseline, so its names (and compile-cache
    entries) are those of the kernels before designs existed."""
    return () if design.code_key == BASELINE.code_key else design.code_key


def _checked_tile(n1: int) -> None:
    if n1 < 1 or n1 > 1024:
        raise ValueError(f"N1 must be in 1..1024, got {n1}")


ACTIVATIONS = ("", "relu", "gelu")  # gelu: the exact (erf) form, torch's default


@dataclass(frozen=True)
class Epilogue:
    """What a kernel applies to each output before storing it: a bias per output row (channel),
    baked in as literals (empty: none), then an activation (§6.2 fuses Conv2D + ReLU; a linear
    layer's GELU fuses alike). The empty epilogue leaves a kernel's text as it was without one."""

    bias: tuple[float, ...] = ()
    activation: str = ""

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r}: choose one of {', '.join(map(repr, ACTIVATIONS))}")

    @property
    def relu(self) -> bool:
        return self.activation == "relu"

    @property
    def empty(self) -> bool:
        return not self.bias and not self.activation

    def name_parts(self) -> tuple:
        """The epilogue's part of a kernel's name (the conv kernels' parts before activations existed
        for no activation and ReLU, so their names stay)."""
        act = self.relu if self.activation in ("", "relu") else self.activation
        return np.asarray(self.bias, np.float32).tobytes(), act

    def facts(self) -> dict:
        """kernel.json's `epilogue`: what is fused, with the bias's values (float32, exact in JSON), so
        that a device check can apply it and a model whose bias differs is refused."""
        return {"bias": bool(self.bias), "relu": self.relu, "activation": self.activation,
                **({"bias_values": [float(np.float32(x)) for x in self.bias]} if self.bias else {})}

    @classmethod
    def of_facts(cls, facts: dict) -> "Epilogue":
        """The epilogue kernel.json records (none for a kernel directory written before epilogues)."""
        e = facts.get("epilogue") or {}
        if e.get("bias") and "bias_values" not in e:
            raise ValueError(f"{facts.get('layer')}: kernel.json says a bias is fused but not its values "
                             f"(written before bias values were recorded); emit the kernel again")
        return cls(tuple(e.get("bias_values", ())), e.get("activation") or ("relu" if e.get("relu") else ""))

    def _scalar(self, value: str) -> str:
        if self.activation == "relu":
            return f"lospmm_relu({value})"
        if self.activation == "gelu":  # fused as one expression: the value is a register, read three times
            return f"(0.5f * ({value}) * (1.0f + erff(({value}) * 0.70710678118654752f)))"
        return value

    def applied(self, acc: str, row: int, v: int = 1) -> str:
        """The stored value(s) of accumulator `acc` (`v` columns) of output row `row`."""
        bias = f" + {float_literal(np.array([self.bias[row]]))[0]}" if self.bias else ""
        if v == 1:
            return self._scalar(f"{acc}{bias}")
        return f"make_{_VECTOR_TYPE[v]}(" + ", ".join(self._scalar(f"{acc}{lane}{bias}") for lane in _LANES[v]) + ")"

    def of_zero(self, row: int, v: int = 1) -> str:
        """The output of a row with no nonzero, as a literal (`v` columns)."""
        x = np.float64(np.float32(self.bias[row]) if self.bias else 0.0)
        value = float_literal(np.array([activated(np.array([x]), self.activation)[0]]))[0]
        return value if v == 1 else f"{_VECTOR_TYPE[v]}{{{', '.join([value] * v)}}}"

    def reference(self, product: np.ndarray, row_axis: int = 0) -> np.ndarray:
        """The epilogue applied to A·B in float64 (rows of A along `row_axis`): what a kernel is
        checked against."""
        out = np.asarray(product, np.float64)
        if self.bias:
            shape = [1] * out.ndim
            shape[row_axis] = len(self.bias)
            out = out + np.asarray(self.bias, np.float64).reshape(shape)
        return activated(out, self.activation)


def activated(values: np.ndarray, activation: str) -> np.ndarray:
    """An activation of ACTIVATIONS in float64 (the reference)."""
    if activation == "relu":
        return np.maximum(values, 0.0)
    if activation == "gelu":
        from scipy.special import erf

        return 0.5 * values * (1.0 + erf(values / np.sqrt(2.0)))
    return values


def full_kernel_source(matrix: sp.csr_matrix, tiles: Tiles, n1: int,
                       params: CodegenParams = CodegenParams(), epilogue: Epilogue = Epilogue()) -> KernelSource:
    """Alg. 2 for every A_tile of `tiles`, blocks of `n1` threads, in `params.design`, each output
    stored through `epilogue` (bias and activation fused; the empty one: the plain product)."""
    a = sp.csr_matrix(matrix)
    a.sort_indices()
    _checked_tile(n1)
    design = params.design
    if epilogue.bias and len(epilogue.bias) != a.shape[0]:
        raise ValueError(f"bias has {len(epilogue.bias)} values for {a.shape[0]} output rows")
    if params.n1_at_launch and (design.a_values == "streamed" or design.half):
        raise ValueError(f"design {design.label}: N1 at launch is the baked fp32 kernels' so far")
    if design.a_values == "streamed":
        if not epilogue.empty:
            raise ValueError(f"design {design.label}: the streamed kernel fuses no epilogue yet")
        return streamed_kernel_source(a, tiles, n1, params)
    if design.half:
        raise ValueError(f"design {design.label}: a half kernel is codegen_half's (sources.kernel_source)")
    m, k = a.shape
    v = design.columns_per_thread
    name = kernel_name("lospmm_full", m, k, a.indptr.tobytes(), a.indices.tobytes(), a.data.tobytes(),
                       tiles.rows.tobytes(), tiles.tile_ptr.tobytes(), "at launch" if params.n1_at_launch else n1,
                       params.prefetch, params.shard_nnz,
                       *_design_parts(design), *(() if epilogue.empty else ("epilogue", *epilogue.name_parts())))
    header = (f"// lospmm full kernel {name}: M={m} K={k} nnz={a.nnz} M1={tiles.m1} "
              f"N1={'at launch' if params.n1_at_launch else n1} "
              f"tiles={tiles.num_tiles} prefetch={params.prefetch}"
              + (f" design={design.code_label}" if design != BASELINE else "")
              + (f" bias={bool(epilogue.bias)} activation={epilogue.activation or 'none'}" if not epilogue.empty else ""))
    functions = [_tile_function(a, t, tiles.tile(t), params.prefetch, design, epilogue) for t in range(tiles.num_tiles)]
    zero_blocks = _zero_blocks(tiles.empty_rows, max(tiles.m1, 1))
    store = f"lospmm_st{_SUFFIX[v]}"
    zero_functions = [("(float* __restrict__ Cn, const int N)",
                       "".join(f"  {store}(Cn, {r}, N, "
                               f"{_zero_value(v) if epilogue.empty else epilogue.of_zero(int(r), v)});\n" for r in rows))
                      for rows in zero_blocks]
    tile_axis, column_axis = _axes(design)
    per_block = (("blockDim.x" if v == 1 else f"(blockDim.x * {v})") if params.n1_at_launch else n1 * v)
    head = [f"LOSPMM_KERNEL void {name}(const float* __restrict__ B, float* __restrict__ C, const int N) {{\n"]
    head.append(_first_column(design, str(per_block)) + "  if (n >= N) return;\n")
    if design.looped:
        head.append(f"  const int stride = gridDim.{column_axis} * {per_block};\n")
        tile_args, zero_call = "B, C, N, n, stride", "for (int c = n; c < N; c += stride) zero_{z}(C + c, N)"
    else:
        head.append("  const float* Bn = B + n;\n  float* Cn = C + n;\n")
        tile_args, zero_call = "Bn, Cn, N", "zero_{z}(Cn, N)"
    preamble = _preamble(design)
    entry = _entry_unit(header, tiles.num_tiles, _tile_signature(design), zero_functions, "".join(head), tile_args,
                        zero_call, tile_axis, preamble)
    units = _units("tile", functions, _tile_costs(a, tiles), params.shard_nnz, preamble) + [entry]
    layout = LaunchLayout(tiles.num_tiles + len(zero_blocks), 0 if params.n1_at_launch else n1, v, design.column_walks,
                          design.order)
    return KernelSource(name, "full", tuple(units), ("const float* B", "float* C", "int N"), m, k,
                        tiles.m1, layout, tiles.num_tiles, design)


def _first_column(design: KernelDesign, per_block: str, variable: str = "n") -> str:
    """The kernel's first lines: a thread's first column (`variable`) from the column block's grid
    axis, blocks of `per_block` columns; with V > 1 columns per thread, first a trap on an N that is
    no multiple of V (never read past a row: the launcher pads N, LaunchLayout.launch_columns)."""
    v = design.columns_per_thread
    thread = "threadIdx.x" if v == 1 else f"threadIdx.x * {v}"
    return ((f"  if (N % {v} != 0) __trap();\n" if v > 1 else "")
            + f"  const int {variable} = blockIdx.{_axes(design)[1]} * {per_block} + {thread};\n")


def _axes(design: KernelDesign) -> tuple[str, str]:
    """(the tile's grid axis, the column block's)."""
    return ("x", "y") if design.order == "tile-x" else ("y", "x")


def _tile_signature(design: KernelDesign) -> str:
    if design.looped:
        return "(const float* __restrict__ B, float* __restrict__ C, const int N, int n, const int stride)"
    return "(const float* __restrict__ Bn, float* __restrict__ Cn, const int N)"


def _walked(design: KernelDesign, body: list[str]) -> list[str]:
    """A tile's body as its function runs it: once on the thread's columns, or (a looped design)
    once per column block the block walks."""
    if not design.looped:
        return body
    return ["  do {\n", "  const float* Bn = B + n;\n", "  float* Cn = C + n;\n", *body,
            "  n += stride;\n", "  } while (n < N);\n"]


def _b_loader(design: KernelDesign):
    """load(j, column, previous column): the statement that defines b{j}, the B value(s) of `column`."""
    v = design.columns_per_thread
    kind, suffix = _VECTOR_TYPE[v], _SUFFIX[v]
    if design.loads == "chained":
        return lambda j, column, previous: (f"  {kind} b{j}; LOSPMM_LDC{suffix}(b{j}, p, N, "
                                            f"{4 * (column - previous)});\n")
    return lambda j, column, previous: f"  const {kind} b{j} = lospmm_ld{suffix}(Bn, {4 * column}, N);\n"


def _tile_function(a: sp.csr_matrix, t: int, rows: np.ndarray, prefetch: int,
                   design: KernelDesign = BASELINE, epilogue: Epilogue = Epilogue()) -> str:
    v = design.columns_per_thread
    store = f"lospmm_st{_SUFFIX[v]}"
    body = [*(["  const float* p = Bn;\n"] if design.loads == "chained" else []),
            *_tile_body(a, rows, prefetch, _b_loader(design), v),
            *(f"  {store}(Cn, {r}, N, {epilogue.applied(f'acc{i}', int(r), v)});\n" for i, r in enumerate(rows))]
    return "".join([f"LOSPMM_TILE void tile_{t}{_tile_signature(design)} {{\n", *_walked(design, body),
                    "  LOSPMM_TILE_END\n}\n"])


def streamed_kernel_source(matrix: sp.csr_matrix, tiles: Tiles, n1: int, params: CodegenParams) -> KernelSource:
    """The `streamed` design: A's tiles as data in the cubin, each block's non-empty columns (a byte
    offset, or with chained loads the step from the previous one) and per column the M1 values of
    its rows (0 where a row has none), read by one loop; rows of A with no nonzero are blocks with
    no column. One unit of O(1) code whatever the layer's size; the block size is blockDim.x."""
    a = sp.csr_matrix(matrix)
    a.sort_indices()
    _checked_tile(n1)
    design = params.design
    m, k = a.shape
    m1, v = max(tiles.m1, 1), design.columns_per_thread
    blocks = [tiles.tile(t) for t in range(tiles.num_tiles)] + _zero_blocks(tiles.empty_rows, m1)
    colptr, offsets, values, rows = [0], [], [], []
    for block_rows in blocks:
        sub = a[block_rows].tocsc()
        cols = np.flatnonzero(np.diff(sub.indptr))
        dense = np.zeros((len(cols), m1), np.float32)
        dense[:, :len(block_rows)] = sub[:, cols].toarray().T
        steps = np.diff(cols, prepend=0) if design.loads == "chained" else cols
        offsets.extend((4 * steps).tolist())
        values.append(dense.ravel())
        colptr.append(colptr[-1] + len(cols))
        rows.extend([*map(int, block_rows), *([-1] * (m1 - len(block_rows)))])
    name = kernel_name("lospmm_stream", m, k, a.indptr.tobytes(), a.indices.tobytes(), a.data.tobytes(),
                       tiles.rows.tobytes(), tiles.tile_ptr.tobytes(), n1, *design.code_key)
    tile_axis, column_axis = _axes(design)
    kind, suffix, lanes = _VECTOR_TYPE[v], _SUFFIX[v], _LANES[v]
    load = (f"{kind} b; LOSPMM_LDCR{suffix}(b, p, N, __ldg(cols + j));" if design.loads == "chained"
            else f"const {kind} b = lospmm_ld{suffix}(Bn, __ldg(cols + j), N);")
    data = "".join(f"__device__ const {ctype} {array}_{name}[] = {{{', '.join(items) or '0'}}};\n"
                   for ctype, array, items in (
                       ("int", "lospmm_colptr", map(str, colptr)), ("int", "lospmm_cols", map(str, offsets)),
                       ("float", "lospmm_vals", float_literal(np.concatenate(values)) if values else []),
                       ("int", "lospmm_rows", map(str, rows))))
    per_block = "blockDim.x" if v == 1 else f"(blockDim.x * {v})"  # the block size is a launch argument
    source = "".join([
        PREAMBLE, DESIGN_PREAMBLE,
        f"// lospmm streamed kernel {name}: M={m} K={k} nnz={a.nnz} M1={m1} N1={n1} tiles={tiles.num_tiles} "
        f"design={design.code_label}\n", data,
        f"LOSPMM_KERNEL void {name}(const float* __restrict__ B, float* __restrict__ C, const int N) {{\n",
        _first_column(design, per_block, "n0"),
        f"  const int stride = {f'gridDim.{column_axis} * {per_block}' if design.looped else 'N'};\n",
        f"  const int block = blockIdx.{tile_axis};\n",
        f"  const int begin = __ldg(lospmm_colptr_{name} + block), end = __ldg(lospmm_colptr_{name} + block + 1);\n",
        f"  const int* __restrict__ cols = lospmm_cols_{name};\n",
        f"  const int* __restrict__ rows = lospmm_rows_{name} + block * {m1};\n",
        "  for (int n = n0; n < N; n += stride) {\n",
        "    const float* Bn = B + n;\n    float* Cn = C + n;\n",
        *(["    const float* p = Bn;\n"] if design.loads == "chained" else []),
        f"    {kind} " + ", ".join(f"acc{i} = {_zero_value(v)}" for i in range(m1)) + ";\n",
        f"    const float* __restrict__ vals = lospmm_vals_{name} + (long long)begin * {m1};\n",
        "#pragma unroll 4\n",
        f"    for (int j = begin; j < end; ++j, vals += {m1}) {{\n      {load}\n",
        *(f"      {{ const float a = __ldg(vals + {i}); "
          + " ".join(f"acc{i}{lane} += b{lane} * a;" for lane in lanes) + " }\n" for i in range(m1)),
        "    }\n",
        *(f"    {{ const int r = __ldg(rows + {i}); if (r >= 0) lospmm_st{suffix}(Cn, r, N, acc{i}); }}\n"
          for i in range(m1)),
        "  }\n}\n"])
    layout = LaunchLayout(len(blocks), n1, v, design.column_walks, design.order)
    return KernelSource(name, "full", (source,), ("const float* B", "float* C", "int N"), m, k, tiles.m1, layout,
                        tiles.num_tiles, design)


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


def conv_kernel_source(matrix: sp.csr_matrix, tiles: Tiles, n1: int, geometry: ConvGeometry,
                       epilogue: Epilogue = Epilogue(), params: CodegenParams = CodegenParams()) -> KernelSource:
    """Alg. 2 for a convolution without im2col: each B value is read from the NCHW input X
    (zero outside it: the padding) and each output written to NCHW Y, with the epilogue fused.
    Parameters (X, Y, batch); launch with grid(geometry.n(batch)). Same tiles, units and shards as
    full_kernel_source: the search's shapes are the im2col GEMM's. Of the designs, only the grid's
    order applies so far (its loads already take one instruction from the pixel's pointer)."""
    a = sp.csr_matrix(matrix)
    a.sort_indices()
    m, k = a.shape
    design = params.design
    if params.n1_at_launch:
        raise ValueError("an implicit-im2col conv kernel bakes its N1 in (N1 at launch is the GEMM kernels')")
    if design != KernelDesign(order=design.order):
        raise ValueError(f"design {design.label}: an implicit-im2col conv kernel takes only the grid's order "
                         f"(tile-x or column-x) so far")
    if k != geometry.k:
        raise ValueError(f"weight has K={k} columns, the conv geometry needs cin·kh·kw = {geometry.k}")
    if epilogue.bias and len(epilogue.bias) != m:
        raise ValueError(f"bias has {len(epilogue.bias)} values for {m} output channels")
    _checked_tile(n1)
    g = geometry
    hwo, chw = g.h_out * g.w_out, g.cin * g.h * g.w
    name = kernel_name("lospmm_conv", m, k, a.indptr.tobytes(), a.indices.tobytes(), a.data.tobytes(),
                       tiles.rows.tobytes(), tiles.tile_ptr.tobytes(), n1, params.prefetch, params.shard_nnz,
                       tuple(vars(g).values()), *epilogue.name_parts(), *_design_parts(design))
    header = (f"// lospmm conv kernel {name}: Cout={m} Cin={g.cin} {g.h}x{g.w} window {g.kh}x{g.kw} "
              f"stride={g.stride} pad={g.pad} dilation={g.dilation} -> {g.h_out}x{g.w_out}, nnz={a.nnz} "
              f"M1={tiles.m1} N1={n1} tiles={tiles.num_tiles} bias={bool(epilogue.bias)} relu={epilogue.relu}"
              + (f" activation={epilogue.activation}" if epilogue.activation not in ("", "relu") else "")
              + (f" design={design.code_label}" if design != BASELINE else ""))
    functions = [_conv_tile_function(a, t, tiles.tile(t), params.prefetch, g, epilogue) for t in range(tiles.num_tiles)]
    zero_blocks = _zero_blocks(tiles.empty_rows, max(tiles.m1, 1))
    tile_axis, column_axis = _axes(design)
    entry = _entry_unit(
        header, tiles.num_tiles, "(const float* __restrict__ Xb, float* __restrict__ Yb, const int iy0, const int ix0)",
        [("(float* __restrict__ Yb)", "".join(f"  lospmm_st(Yb, {r}, {hwo}, {epilogue.of_zero(int(r))});\n"
                                             for r in rows)) for rows in zero_blocks],
        f"LOSPMM_KERNEL void {name}(const float* __restrict__ X, float* __restrict__ Y, const int batch) {{\n"
        f"  const int n = blockIdx.{column_axis} * {n1} + threadIdx.x;\n"
        f"  if (n >= batch * {hwo}) return;\n"
        f"  const int b = n / {hwo};\n"
        f"  const int p = n - b * {hwo};\n"
        f"  const int oy = p / {g.w_out};\n"
        f"  const int ox = p - oy * {g.w_out};\n"
        f"  const float* Xb = X + (long long)b * {chw};\n"
        f"  float* Yb = Y + (long long)b * {m * hwo} + p;\n"
        f"  const int iy0 = oy * {g.stride} - {g.pad};\n"
        f"  const int ix0 = ox * {g.stride} - {g.pad};\n", "Xb, Yb, iy0, ix0", "zero_{z}(Yb)", tile_axis)
    units = _units("tile", functions, _tile_costs(a, tiles), params.shard_nnz) + [entry]
    layout = LaunchLayout(tiles.num_tiles + len(zero_blocks), n1, order=design.order)
    return KernelSource(name, "conv", tuple(units), ("const float* X", "float* Y", "int batch"), m, k,
                        tiles.m1, layout, tiles.num_tiles, design)


def _conv_tile_function(a: sp.csr_matrix, t: int, rows: np.ndarray, prefetch: int, g: ConvGeometry,
                        epilogue: Epilogue) -> str:
    def load(j: int, column: int, previous: int) -> str:
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


def _preamble(design: KernelDesign) -> str:
    """The helpers a kernel of `design` uses: the baseline's alone for the baseline (and a
    convolution's grid orders), the designs' loads and stores besides for any other."""
    return PREAMBLE if design.code_key == BASELINE.code_key or design == KernelDesign(order=design.order) \
        else PREAMBLE + DESIGN_PREAMBLE


def _units(prefix: str, functions: list[str], costs: list[int], shard_nnz: int, preamble: str = PREAMBLE) -> list[str]:
    # A unit's text depends on its own functions only, so a kernel in which one tile changed shares
    # every other unit (and its compile-cache entry) with the kernel before the change.
    return [preamble + f"// lospmm unit: {prefix}_{g[0]}..{prefix}_{g[-1]}\n" + "".join(functions[i] for i in g)
            for g in shard_groups(costs, shard_nnz)]


def _tile_body(a: sp.csr_matrix, rows: np.ndarray, prefetch: int, load, v: int = 1) -> list[str]:
    """A tile's accumulators (`v` columns each), its B loads (`load(j, column, previous column)`:
    the statement that defines b{j}) issued `prefetch` columns ahead of their use, and one
    multiply-add per nonzero and column."""
    sub = a[rows].tocsc()
    sub.sort_indices()
    cols = np.flatnonzero(np.diff(sub.indptr))
    lits = float_literal(sub.data)
    lanes = _LANES[v]
    out = [f"  {_VECTOR_TYPE[v]} " + ", ".join(f"acc{i} = {_zero_value(v)}" for i in range(len(rows))) + ";\n"]
    loads = [load(j, int(c), int(cols[j - 1]) if j else 0) for j, c in enumerate(cols)]
    out.extend(loads[:prefetch])
    for j, c in enumerate(cols):
        if j + prefetch < len(loads):
            out.append(loads[j + prefetch])
        lo, hi = sub.indptr[c], sub.indptr[c + 1]
        out.append("  " + " ".join(f"acc{sub.indices[p]}{lane} += b{j}{lane} * {lits[p]};"
                                   for p in range(lo, hi) for lane in lanes) + "\n")
    return out


def _tile_costs(a: sp.csr_matrix, tiles: Tiles) -> list[int]:
    nnz = np.diff(a.indptr)
    return [int(nnz[tiles.tile(t)].sum()) for t in range(tiles.num_tiles)]


def _entry_unit(header: str, num_tiles: int, tile_signature: str, zero_functions: list[tuple[str, str]],
                kernel_head: str, tile_args: str, zero_call: str, tile_axis: str = "x", preamble: str = PREAMBLE) -> str:
    """The entry unit: the tile functions' declarations, the zeroing blocks' functions (signature,
    body), and the kernel (`kernel_head`: its signature and per-thread set-up) dispatching on the
    block's tile index (`blockIdx.<tile_axis>`); `zero_call` calls zero_{z}."""
    cases = [f"    case {t}: tile_{t}({tile_args}); break;\n" for t in range(num_tiles)]
    cases += [f"    case {num_tiles + z}: {zero_call.format(z=z)}; break;\n" for z in range(len(zero_functions))]
    return "".join([
        preamble, header, " (entry unit)\n",
        *(f"LOSPMM_TILE void tile_{t}{tile_signature};\n" for t in range(num_tiles)),
        *(f"__device__ __forceinline__ void zero_{z}{signature} {{\n{body}}}\n"
          for z, (signature, body) in enumerate(zero_functions)),
        kernel_head, f"  switch (blockIdx.{tile_axis}) {{\n{''.join(cases)}    default: break;\n  }}\n}}\n"])


def _zero_blocks(empty_rows: np.ndarray, per_block: int) -> list[np.ndarray]:
    return [empty_rows[i:i + per_block] for i in range(0, len(empty_rows), per_block)]


def proxy_kernel_source(m: int, k: int, clusters, params: CodegenParams = CodegenParams()) -> KernelSource:
    """The M1 proxy of §5.1: one kernel for every N1 (block size, grid and the tile -> cluster map
    are launch arguments), one block function per cluster, NNC_p iterations of one B load and CPL
    multiply-adds each, results stored to rows tile·M1 + i of C (rows past M skipped): the row index
    is made from the block index after the multiply-adds, so no register holds it through them
    (a table of each tile's rows, read at the end, made ptxas keep its pointer and the rows live and
    spill 40-250 bytes per thread where the full kernel spills none). It follows the design's grid
    order, walks, columns per thread and loads (a streamed kernel is its own proxy: its code does
    not grow with the layer)."""
    m1 = clusters.m1
    design = params.design
    if design.a_values != "baked":
        raise ValueError(f"design {design.label}: a streamed kernel has no proxy (time the kernel itself)")
    if design.half:
        raise ValueError(f"design {design.label}: a half proxy is codegen_half's (sources.proxy_source)")
    v = design.columns_per_thread
    lanes, store = _LANES[v], f"lospmm_st{_SUFFIX[v]}"
    name = kernel_name("lospmm_proxy", m, k, m1, clusters.nnc_p.tobytes(), clusters.cpl.tobytes(),
                       b"".join(c.tobytes() for c in clusters.columns), params.prefetch, params.shard_nnz,
                       "rows from the block index", *_design_parts(design))
    header = (f"// lospmm proxy {name}: M={m} K={k} M1={m1} clusters={clusters.num_clusters} "
              f"NNC_p={clusters.nnc_p.tolist()} CPL={clusters.cpl.tolist()}"
              + (f" design={design.code_label}" if design != BASELINE else ""))
    signature = _tile_signature(design)
    load = _b_loader(design)
    functions = []
    for c in range(clusters.num_clusters):
        cols, cpl = clusters.columns[c], int(clusters.cpl[c])
        body = ["  const float* p = Bn;\n"] if design.loads == "chained" else []
        body.append(f"  {_VECTOR_TYPE[v]} " + ", ".join(f"acc{i} = {_zero_value(v)}" for i in range(m1)) + ";\n")
        loads = [load(j, int(col), int(cols[j - 1]) if j else 0) for j, col in enumerate(cols)]
        body.extend(loads[:params.prefetch])
        for j in range(len(cols)):
            if j + params.prefetch < len(loads):
                body.append(loads[j + params.prefetch])
            # distinct constants keep the multiply-adds from being folded together
            body.append("  " + " ".join(f"acc{(j * cpl + q) % m1}{lane} += b{j}{lane} * {1 + ((j * cpl + q) % 97) / 128:.7f}f;"
                                        for q in range(cpl) for lane in lanes) + "\n")
        body.append(f"  {{ const int r0 = blockIdx.{_axes(design)[0]} * {m1};\n")
        body.extend(f"  if (r0 + {i} < {m}) {store}(Cn, r0 + {i}, N, acc{i});\n" for i in range(m1))
        body.append("  }\n")
        functions.append("".join([f"LOSPMM_TILE void proxy_{c}{signature} {{\n", *_walked(design, body),
                                  "  LOSPMM_TILE_END\n}\n"]))
    costs = [len(clusters.columns[c]) * int(clusters.cpl[c]) for c in range(clusters.num_clusters)]
    tile_axis, column_axis = _axes(design)
    args = "B, C, N, n, stride" if design.looped else "Bn, Cn, N"
    cases = "".join(f"    case {c}: proxy_{c}({args}); break;\n" for c in range(clusters.num_clusters))
    per_block = "blockDim.x" if v == 1 else f"(blockDim.x * {v})"
    preamble = _preamble(design)
    entry = (preamble + header + " (entry unit)\n"
             + "".join(f"LOSPMM_TILE void proxy_{c}{signature};\n" for c in range(clusters.num_clusters))
             + f"LOSPMM_KERNEL void {name}(const float* __restrict__ B, float* __restrict__ C, const int N, "
             f"const int* __restrict__ cluster_of) {{\n"
             + _first_column(design, per_block) + "  if (n >= N) return;\n"
             + (f"  const int stride = gridDim.{column_axis} * {per_block};\n" if design.looped
                else "  const float* Bn = B + n;\n  float* Cn = C + n;\n")
             + f"  switch (cluster_of[blockIdx.{tile_axis}]) {{\n{cases}    default: break;\n  }}\n}}\n")
    units = _units("proxy", functions, costs, params.shard_nnz, preamble) + [entry]
    return KernelSource(name, "proxy", tuple(units),
                        ("const float* B", "float* C", "int N", "const int* cluster_of"),
                        m, k, m1, proxy_layout(len(clusters.cluster_of), design), len(clusters.cluster_of), design)


def conv_design(design: KernelDesign) -> KernelDesign:
    """The part of `design` an implicit-im2col conv kernel has: the grid's order (its loads already
    take one instruction from the pixel's pointer; walks and vector columns are not written yet)."""
    return KernelDesign(order=design.order)


def design_of_facts(facts: dict) -> KernelDesign:
    """The design kernel.json records (the baseline for a directory written before designs)."""
    design = dict(facts.get("design", {}))
    design.pop("label", None)
    return KernelDesign(**design)


def proxy_layout(num_tiles: int, design: KernelDesign = BASELINE) -> LaunchLayout:
    """How a proxy of `num_tiles` blocks along A is launched in `design` (its N1 given at launch)."""
    return LaunchLayout(num_tiles, 0, design.columns_per_thread, design.column_walks, design.order)
