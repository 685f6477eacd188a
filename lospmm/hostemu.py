"""Run generated CUDA source on the CPU: the text NVRTC compiles, included after a shim header,
built with the host C++ compiler and run over every block and thread.

Each pointer argument is copied into a heap buffer of exactly its size (so AddressSanitizer,
`sanitize=True`, catches any out-of-bounds read or write) and every output buffer is filled with
NaN first, so an element the kernel never writes fails the comparison.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from lospmm.stages.codegen import KernelSource

SHIM = r"""// lospmm host-emulation shim: CUDA built-ins as plain C++ for a CPU loop over blocks/threads.
#include <cstddef>
#include <cstdint>
#define LOSPMM_HOST_EMULATION 1
#define LOSPMM_KERNEL extern "C"
struct lospmm_dim3 { unsigned x, y, z; };
static lospmm_dim3 blockIdx, threadIdx, blockDim, gridDim;
#define __global__
#define __device__ static
#define __forceinline__ inline
#define __noinline__
#define LOSPMM_TILE static
#define LOSPMM_TILE_END
#define __launch_bounds__(...)
#define __ldg(p) (*(p))
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
// a kernel's own refusal (N not a multiple of its columns per thread) and a misaligned vector access
// exit with a message and a code of their own: a deterministic failure, not a crash to retry
#define __trap() (fprintf(stderr, "__trap: N is not a multiple of the kernel's columns per thread\n"), exit(24))
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
// a vector access the device would fault on (not aligned to its width) aborts here too
static inline const float* lospmm_aligned(const float* p, unsigned bytes) {
  if ((uintptr_t)p % bytes) { fprintf(stderr, "misaligned %u-byte access at %p\n", bytes, (const void*)p); exit(25); }
  return p;
}
static inline float lospmm_ld(const float* base, int off4, int n) { return base[(long long)(off4 / 4) * n]; }
static inline float2 lospmm_ld2(const float* base, int off4, int n) {
  const float* q = lospmm_aligned(base + (long long)(off4 / 4) * n, 8); return float2{q[0], q[1]};
}
static inline float4 lospmm_ld4(const float* base, int off4, int n) {
  const float* q = lospmm_aligned(base + (long long)(off4 / 4) * n, 16); return float4{q[0], q[1], q[2], q[3]};
}
#define LOSPMM_LDC(v, p, n, DELTA4) (p += (long long)((DELTA4) / 4) * (n), v = *(p))
#define LOSPMM_LDC2(v, p, n, DELTA4) (p += (long long)((DELTA4) / 4) * (n), v = float2{lospmm_aligned(p, 8)[0], (p)[1]})
#define LOSPMM_LDC4(v, p, n, DELTA4) \
  (p += (long long)((DELTA4) / 4) * (n), v = float4{lospmm_aligned(p, 16)[0], (p)[1], (p)[2], (p)[3]})
#define LOSPMM_LDCR(v, p, n, delta4) LOSPMM_LDC(v, p, n, delta4)
#define LOSPMM_LDCR2(v, p, n, delta4) LOSPMM_LDC2(v, p, n, delta4)
#define LOSPMM_LDCR4(v, p, n, delta4) LOSPMM_LDC4(v, p, n, delta4)
static inline void lospmm_st(float* base, int row, int n, float v) { base[(long long)row * n] = v; }
static inline void lospmm_st2(float* base, int row, int n, float2 v) {
  float* q = const_cast<float*>(lospmm_aligned(base + (long long)row * n, 8)); q[0] = v.x; q[1] = v.y;
}
static inline void lospmm_st4(float* base, int row, int n, float4 v) {
  float* q = const_cast<float*>(lospmm_aligned(base + (long long)row * n, 16)); q[0] = v.x; q[1] = v.y; q[2] = v.z; q[3] = v.w;
}
static inline float lospmm_relu(float v) { return v > 0.0f ? v : 0.0f; }
// half kernels (codegen_half): fp16 / bf16 as 16-bit patterns, every rounding to nearest even done
// once from the exact value, as the device's fma.rn.f16x2 / .bf16x2 and cvt.rn do
typedef unsigned short lospmm_h16;
static inline double lospmm_small_to_double(unsigned short h, int mbits, int bias) {
  const int e = (h >> mbits) & ((1 << (15 - mbits)) - 1), m = h & ((1 << mbits) - 1);
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == (1 << (15 - mbits)) - 1) return m ? NAN : sign * INFINITY;
  if (e == 0) return sign * std::ldexp((double)m, 1 - bias - mbits);
  return sign * std::ldexp((double)(m | (1 << mbits)), e - bias - mbits);
}
static inline unsigned short lospmm_double_to_small(double x, int mbits, int bias) {
  const unsigned short sign = std::signbit(x) ? 0x8000 : 0;
  const int emax_field = (1 << (15 - mbits)) - 1;
  const unsigned short inf = (unsigned short)(emax_field << mbits);
  double a = std::fabs(x);
  if (a != a) return sign | inf | (1 << (mbits - 1));
  if (a == 0.0) return sign;
  if (std::isinf(a)) return sign | inf;
  int e; const double m = std::frexp(a, &e);  // a = m·2^e, m in [0.5, 1)
  int exponent = e - 1;
  if (exponent < 1 - bias) {  // subnormal: a multiple of 2^(1-bias-mbits); rounding up to 2^mbits is the smallest normal
    return sign | (unsigned short)std::nearbyint(std::ldexp(a, bias - 1 + mbits));
  }
  double q = std::nearbyint(std::ldexp(m, mbits + 1));  // 2^mbits .. 2^(mbits+1)
  if (q == (double)(1 << (mbits + 1))) { q = (double)(1 << mbits); ++exponent; }
  if (exponent + bias >= emax_field) return sign | inf;
  return sign | (unsigned short)((exponent + bias) << mbits) | (unsigned short)((int)q - (1 << mbits));
}
static inline double lospmm_fp16_value(unsigned short h) { return lospmm_small_to_double(h, 10, 15); }
static inline double lospmm_bf16_value(unsigned short h) { return lospmm_small_to_double(h, 7, 127); }
static inline unsigned lospmm_ldh2(const lospmm_h16* base, int off2, int n) {
  const lospmm_h16* q = (const lospmm_h16*)lospmm_aligned((const float*)(const void*)(base + (long long)(off2 / 2) * n), 4);
  return (unsigned)q[0] | ((unsigned)q[1] << 16);
}
#define LOSPMM_LDCH2(v, p, n, DELTA2) (p += (long long)((DELTA2) / 2) * (n), v = lospmm_ldh2(p, 0, n))
static inline void lospmm_sth2(lospmm_h16* base, int row, int n, unsigned v) {
  lospmm_h16* q = (lospmm_h16*)(void*)lospmm_aligned((const float*)(const void*)(base + (long long)row * n), 4);
  q[0] = (lospmm_h16)(v & 0xffffu); q[1] = (lospmm_h16)(v >> 16);
}
// p + c rounded to odd in double: the product of two halves is exact in double, but their sum may not
// be (bf16's exponent range is wide); rounded to odd, it rounds to the dtype (≤ 51 bits) as the exact
// sum would, once, as fma.rn does
static inline double lospmm_sum_to_odd(double p, double c) {
  const double s = p + c, bb = s - p, e = (p - (s - bb)) + (c - bb);  // TwoSum: s + e == p + c exactly
  if (e == 0.0 || std::isinf(s)) return s;
  unsigned long long bits; memcpy(&bits, &s, sizeof bits);
  return (bits & 1ull) ? s : std::nextafter(s, e > 0 ? INFINITY : -INFINITY);
}
#define LOSPMM_HALF_FMA(NAME, MBITS, BIAS)                                                            \
  static inline unsigned NAME(unsigned lit, unsigned b, unsigned acc) {                               \
    unsigned out = 0;                                                                                 \
    for (int s = 0; s < 32; s += 16) {                                                                \
      const double v = lospmm_sum_to_odd(lospmm_small_to_double((lit >> s) & 0xffff, MBITS, BIAS) *   \
                                         lospmm_small_to_double((b >> s) & 0xffff, MBITS, BIAS),      \
                                         lospmm_small_to_double((acc >> s) & 0xffff, MBITS, BIAS));   \
      out |= (unsigned)lospmm_double_to_small(v, MBITS, BIAS) << s;                                   \
    }                                                                                                 \
    return out;                                                                                       \
  }
LOSPMM_HALF_FMA(lospmm_fma_fp16, 10, 15)
LOSPMM_HALF_FMA(lospmm_fma_bf16, 7, 127)
static inline void lospmm_unpack_fp16(unsigned v, float& lo, float& hi) {
  lo = (float)lospmm_fp16_value(v & 0xffff); hi = (float)lospmm_fp16_value(v >> 16);
}
static inline void lospmm_unpack_bf16(unsigned v, float& lo, float& hi) {
  lo = (float)lospmm_bf16_value(v & 0xffff); hi = (float)lospmm_bf16_value(v >> 16);
}
static inline unsigned lospmm_pack_fp16(float lo, float hi) {
  return (unsigned)lospmm_double_to_small(lo, 10, 15) | ((unsigned)lospmm_double_to_small(hi, 10, 15) << 16);
}
static inline unsigned lospmm_pack_bf16(float lo, float hi) {
  return (unsigned)lospmm_double_to_small(lo, 7, 127) | ((unsigned)lospmm_double_to_small(hi, 7, 127) << 16);
}
static inline unsigned lospmm_window_bits(int start, int step, int count, int limit) {
  unsigned bits = 0;
  for (int i = 0; i < count; ++i) bits |= ((unsigned)(start + i * step) < (unsigned)limit ? 1u : 0u) << i;
  return bits;
}
#define LOSPMM_LDX(v, xp, OFF4, rows, cols, RBIT, CBIT) \
  v = (((rows) & (RBIT)) && ((cols) & (CBIT))) ? (xp)[(OFF4) / 4] : 0.0f
"""

_HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <cmath>
template <class T> static T* read_array(FILE* f, long long* count) {
  if (fread(count, sizeof(long long), 1, f) != 1) { fprintf(stderr, "short input\n"); exit(3); }
  T* p = static_cast<T*>(malloc(sizeof(T) * (*count > 0 ? *count : 1)));
  if (*count > 0 && fread(p, sizeof(T), *count, f) != (size_t)*count) { fprintf(stderr, "short input\n"); exit(3); }
  return p;
}
int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* in = fopen(argv[1], "rb");
  if (!in) return 2;
  unsigned dims[4];
  if (fread(dims, sizeof(unsigned), 4, in) != 4) return 3;
@READ@
  fclose(in);
  gridDim = {dims[0], dims[1], 1};
  blockDim = {dims[2], 1, 1};
  for (unsigned by = 0; by < dims[1]; ++by)
    for (unsigned bx = 0; bx < dims[0]; ++bx) {
      blockIdx = {bx, by, 0};
      for (unsigned tx = 0; tx < dims[2]; ++tx) {
        threadIdx = {tx, 0, 0};
        @KERNEL@(@ARGS@);
      }
    }
  FILE* out = fopen(argv[2], "wb");
  if (!out) return 2;
@WRITE@
  fclose(out);
  return 0;
}
"""


class EmulationError(RuntimeError):
    """The host build failed, or the kernel crashed or touched memory out of bounds. `transient`:
    the compiler or the program was killed by a signal (out of memory, say), not failed."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class _Param:
    ctype: str
    name: str

    @property
    def pointer(self) -> bool:
        return "*" in self.ctype

    @property
    def output(self) -> bool:
        return self.pointer and not self.ctype.startswith("const")

    @property
    def base(self) -> str:
        return self.ctype.replace("const", "").replace("*", "").strip()


def _params(kernel: KernelSource) -> list[_Param]:
    out = []
    for decl in kernel.params:
        ctype, name = decl.rsplit(" ", 1)
        out.append(_Param(ctype.strip(), name.strip()))
    return out


def host_program(kernel: KernelSource) -> str:
    """The C++ translation unit: shim, the kernel text unchanged, and a driver main()."""
    reads, writes = [], []
    for p in _params(kernel):
        if p.pointer:
            reads.append(f"  long long n_{p.name}; {p.base}* {p.name} = read_array<{p.base}>(in, &n_{p.name});")
            if p.output:  # poisoned: an element never written fails the check (0x7fff: NaN in fp16 and bf16)
                poison = "0x7fff" if p.base == "lospmm_h16" else "NAN"
                reads.append(f"  for (long long i = 0; i < n_{p.name}; ++i) {p.name}[i] = {poison};")
                writes.append(f"  fwrite({p.name}, sizeof({p.base}), n_{p.name}, out);")
        else:
            reads.append(f"  long long n_{p.name}; {p.base}* {p.name}_box = read_array<{p.base}>(in, &n_{p.name}); "
                         f"const {p.base} {p.name} = {p.name}_box[0];")
    harness = (_HARNESS.replace("@READ@", "\n".join(reads)).replace("@WRITE@", "\n".join(writes))
               .replace("@KERNEL@", kernel.name).replace("@ARGS@", ", ".join(p.name for p in _params(kernel))))
    return SHIM + "\n" + kernel.source + "\n" + harness


def run_on_host(kernel: KernelSource, args: Mapping[str, np.ndarray | int], grid: tuple[int, int, int],
                block: int, sanitize: bool = False, cxx: str | None = None,
                build_dir: str | None = None) -> dict[str, np.ndarray]:
    """Build `kernel` for the host and run it; returns each output pointer argument's final array.

    `args` maps parameter names to arrays (pointers) or ints; output arrays give only the size."""
    params = _params(kernel)
    missing = [p.name for p in params if p.name not in args]
    if missing:
        raise ValueError(f"missing kernel arguments: {missing}")
    exe = _build(kernel, sanitize, cxx, build_dir)
    with tempfile.TemporaryDirectory(prefix="lospmm-emu-") as tmp:
        inp, outp = Path(tmp) / "in.bin", Path(tmp) / "out.bin"
        with open(inp, "wb") as f:
            f.write(np.array([grid[0], grid[1], block, 0], dtype=np.uint32).tobytes())
            for p in params:
                arr = np.atleast_1d(np.asarray(args[p.name], dtype=_dtype(p.base)))
                f.write(np.int64(arr.size).tobytes())
                f.write(np.ascontiguousarray(arr).tobytes())
        env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=23"}
        proc = subprocess.run([str(exe), str(inp), str(outp)], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise EmulationError(f"{kernel.name}: host run failed (exit {proc.returncode}): {proc.stderr[-3000:]}",
                                 transient=proc.returncode < 0)
        data = outp.read_bytes()
    out, offset = {}, 0
    for p in params:
        if p.output:
            size = np.atleast_1d(args[p.name]).size
            dt = _dtype(p.base)
            out[p.name] = np.frombuffer(data, dtype=dt, count=size, offset=offset).copy()
            offset += size * np.dtype(dt).itemsize
    return out


def _dtype(base: str):
    return {"float": np.float32, "int": np.int32, "unsigned": np.uint32, "lospmm_h16": np.uint16}[base]


def _build(kernel: KernelSource, sanitize: bool, cxx: str | None, build_dir: str | None) -> Path:
    cxx = cxx or os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or "c++"
    program = host_program(kernel)
    # -O0: the generated kernels are long straight-line functions; g++ -O1 builds them 3-4x slower
    # (59k nonzeros: 19.3 s vs 5.2 s with ASan) and the check runs a small N, so speed of the
    # built program does not matter.
    flags = ["-O0", "-std=c++17", "-w"] + (["-fsanitize=address", "-fno-omit-frame-pointer"] if sanitize else [])
    key = hashlib.sha256((program + " ".join([cxx, *flags])).encode()).hexdigest()[:24]
    root = Path(build_dir or Path(tempfile.gettempdir()) / "lospmm-hostemu")
    exe = root / f"{key}.bin"
    if exe.exists():
        try:
            os.utime(exe)  # recently used: the last to go when the cache is pruned
        except OSError:
            pass
        return exe
    root.mkdir(parents=True, exist_ok=True)
    src = root / f"{key}.cpp"
    src.write_text(program, encoding="utf-8")
    tmp_exe = root / f".{key}.{os.getpid()}.tmp"
    proc = subprocess.run([cxx, *flags, "-o", str(tmp_exe), str(src)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise EmulationError(f"{kernel.name}: host build failed (exit {proc.returncode}): {proc.stderr[-3000:]}",
                             transient=proc.returncode < 0)
    os.replace(tmp_exe, exe)
    src.unlink(missing_ok=True)  # the program text is the key's input, not needed once built
    pruned_cache(root)
    return exe


HOST_CACHE_BYTES = 2 << 30  # the host-build cache's size limit: every checked kernel leaves a binary


def pruned_cache(root: Path, max_bytes: int = HOST_CACHE_BYTES) -> int:
    """Delete the least recently used builds under `root` until they take at most `max_bytes`
    (over sessions an unbounded cache filled a shared disk); returns the bytes freed."""
    entries = []
    for f in root.glob("*.bin"):
        try:
            st = f.stat()
        except OSError:  # another process pruned it
            continue
        entries.append((st.st_mtime, st.st_size, f))
    total, freed = sum(size for _, size, _ in entries), 0
    for _, size, f in sorted(entries, key=lambda e: e[0]):
        if total - freed <= max_bytes:
            break
        f.unlink(missing_ok=True)
        freed += size
    return freed


def checked_against_scipy(kernel: KernelSource, matrix, n: int, seed: int = 0, sanitize: bool = False,
                          rtol: float = 1e-4, epilogue=None) -> float:
    """Run a full kernel on a fresh random B (K×n) and return max |C - ref| / max(1, |ref|max), ref
    = A·B with the kernel's `epilogue` (codegen.Epilogue: bias and activation) applied.

    Raises EmulationError if any element is unwritten (still NaN) or the error exceeds `rtol`."""
    rng = np.random.default_rng(seed)
    b = rng.standard_normal((kernel.k, n)).astype(np.float32)
    c = gemm_on_host(kernel, b, sanitize=sanitize)
    ref = matrix.astype(np.float64) @ b.astype(np.float64)
    return _checked_error(kernel, c, ref if epilogue is None else epilogue.reference(ref), rtol, row_axis=0)


def gemm_on_host(kernel: KernelSource, b: np.ndarray, sanitize: bool = False) -> np.ndarray:
    """C = A·B by a GEMM kernel on the host, launched as its layout says: B's N columns padded with
    zeros to the N it is launched with (a multiple of its columns per thread), C cut back to N. B
    and C share B's element type (float32; uint16 bits for a half kernel)."""
    n = b.shape[1]
    launched = kernel.layout.launch_columns(n)
    padded = np.zeros((kernel.k, launched), b.dtype)
    padded[:, :n] = b
    c = run_on_host(kernel, {"B": padded.ravel(), "C": np.empty(kernel.m * launched, b.dtype), "N": launched},
                    kernel.layout.grid(n), kernel.layout.block(), sanitize=sanitize)["C"]
    return c.reshape(kernel.m, launched)[:, :n]


def _checked_error(kernel: KernelSource, out: np.ndarray, ref: np.ndarray, rtol: float, row_axis: int) -> float:
    """max |out - ref| / max(1, |ref|max); EmulationError if an element of `out` was never written
    (still NaN; naming the rows of A, along `row_axis`) or the error exceeds `rtol`."""
    if np.isnan(out).any():
        rows = np.unique(np.nonzero(np.isnan(out))[row_axis])
        raise EmulationError(f"{kernel.name}: {np.isnan(out).sum()} output elements never written "
                             f"(rows {rows[:10].tolist()}…)")
    err = float(np.max(np.abs(out - ref)) / max(1.0, float(np.max(np.abs(ref))))) if out.size else 0.0
    if err > rtol:
        raise EmulationError(f"{kernel.name}: max relative error {err:.3g} exceeds {rtol}")
    return err


def proxy_check(kernel: KernelSource, cluster_of: np.ndarray, n: int, n1: int) -> str:
    """Run a proxy on the host under AddressSanitizer with zero B and N = `n` columns in blocks of
    `n1`: "asan-ok", or "failed: ..." with the reason (a proxy's output is meaningless, its memory
    accesses are not)."""
    try:
        n = kernel.layout.launch_columns(n)
        run_on_host(kernel, {"B": np.zeros(kernel.k * n, np.float32), "C": np.zeros(kernel.m * n, np.float32),
                             "N": n, "cluster_of": cluster_of},
                    kernel.layout.grid(n, n1), n1, sanitize=True)
        return "asan-ok"
    except Exception as e:
        return f"failed: {e}"[:2000]


def reference_conv2d(x: np.ndarray, weight: np.ndarray, geometry, epilogue=None) -> np.ndarray:
    """A plain numpy Conv2D (NCHW, groups = 1, float64): the reference the conv kernels are checked
    against, written from the definition (padding, then one strided window per kernel offset)."""
    g = geometry
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (g.pad, g.pad), (g.pad, g.pad)))
    out = np.zeros((x.shape[0], weight.shape[0], g.h_out, g.w_out))
    for ky in range(g.kh):
        for kx in range(g.kw):
            y0, x0 = ky * g.dilation, kx * g.dilation
            window = xp[:, :, y0:y0 + g.stride * (g.h_out - 1) + 1:g.stride, x0:x0 + g.stride * (g.w_out - 1) + 1:g.stride]
            out += np.einsum("oc,bchw->bohw", weight[:, :, ky, kx].astype(np.float64), window)
    return out if epilogue is None else epilogue.reference(out, row_axis=1)


def checked_conv_against_reference(kernel: KernelSource, matrix, geometry, epilogue=None, batch: int = 2,
                                   seed: int = 0, sanitize: bool = False, rtol: float = 1e-4) -> float:
    """Run a conv kernel on a random NCHW input of `batch` images and return its max relative error
    against reference_conv2d; EmulationError if an output is unwritten or the error exceeds `rtol`."""
    g = geometry
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, g.cin, g.h, g.w)).astype(np.float32)
    y = run_on_host(kernel, {"X": x.ravel(), "Y": np.empty(batch * kernel.m * g.h_out * g.w_out, np.float32),
                             "batch": batch}, kernel.layout.grid(g.n(batch)), kernel.layout.block(), sanitize=sanitize)["Y"]
    y = y.reshape(batch, kernel.m, g.h_out, g.w_out)
    weight = matrix.toarray().reshape(kernel.m, g.cin, g.kh, g.kw)
    ref = reference_conv2d(x, weight, g, epilogue)
    return _checked_error(kernel, y, ref, rtol, row_axis=1)  # NCHW: A's rows are the output channels


def half_gemm_on_host(kernel: KernelSource, b_bits: np.ndarray, sanitize: bool = False) -> np.ndarray:
    """C = A·B by a half kernel (codegen_half) on the host: B's bits (uint16, K×n) padded with zero
    columns to an even N, C's bits (uint16, M×n) cut back."""
    return gemm_on_host(kernel, np.asarray(b_bits, np.uint16), sanitize)


def checked_half_kernel(kernel: KernelSource, matrix, n: int, dtype: str, seed: int = 0, sanitize: bool = False,
                        bound: float | None = None, absolute: float = 0.0,
                        epilogue=None) -> tuple[float, np.ndarray, np.ndarray]:
    """Run a half kernel on a fresh random B (rounded to `dtype`) and return (its normalised error
    against the float64 product of the same rounded A and B through the kernel's `epilogue`, less
    `absolute` — codegen_half.normalised_error —, B's bits, C's bits). EmulationError if an output
    is unwritten (NaN), differs from the kernel's exact model (codegen_half.kernel_reference: bit
    for bit, within one value after a GELU), or the error exceeds `bound` (when given:
    codegen_half.error_bound's γ, `absolute` its η)."""
    from lospmm.stages.codegen import Epilogue
    from lospmm.stages.codegen_half import from_dtype_bits, normalised_error, output_problem, precision_of, random_b_bits

    b_bits = random_b_bits(kernel.k, n, dtype, seed)
    c_bits = half_gemm_on_host(kernel, b_bits, sanitize=sanitize)
    c = from_dtype_bits(c_bits, dtype)
    if np.isnan(c).any():
        rows = np.unique(np.nonzero(np.isnan(c))[0])
        raise EmulationError(f"{kernel.name}: {int(np.isnan(c).sum())} output elements never written "
                             f"(rows {rows[:10].tolist()}…)")
    epilogue = epilogue or Epilogue()
    problem = output_problem(c_bits, matrix, b_bits, precision_of(kernel.design), epilogue)
    if problem:
        raise EmulationError(f"{kernel.name}: {problem}")
    error = normalised_error(c, matrix, from_dtype_bits(b_bits, dtype), absolute, epilogue, dtype)
    if bound is not None and error > bound:
        raise EmulationError(f"{kernel.name}: normalised error {error:.3g} exceeds {bound}")
    return error, b_bits, c_bits
