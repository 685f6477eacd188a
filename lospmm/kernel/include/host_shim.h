// lospmm host-emulation shim: CUDA built-ins as plain C++ for a CPU loop over blocks/threads.
#include <cstddef>
#include <cstdint>
#define LOSPMM_HOST_EMULATION 1
#define LOSPMM_KERNEL extern "C"
struct lospmm_dim3 { unsigned x, y, z; };
static lospmm_dim3 blockIdx, blockDim, gridDim;
static thread_local lospmm_dim3 threadIdx;  // a cooperative block runs its threads on threads of their own
// a launch's dynamic shared memory: exactly the bytes it was launched with, on the heap (so AddressSanitizer
// catches a kernel reaching past them), filled with NaN bytes before each block (shared memory starts
// undefined); host_harness.cpp allocates it, a kernel names it with LOSPMM_PARTIALS
static void* lospmm_dynamic_shared = nullptr;
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
static inline float lospmm_ldp(const float* base, int row, int n) { return base[(long long)row * n]; }
static inline float2 lospmm_ldp2(const float* base, int row, int n) {
  const float* q = lospmm_aligned(base + (long long)row * n, 8); return float2{q[0], q[1]};
}
static inline float4 lospmm_ldp4(const float* base, int row, int n) {
  const float* q = lospmm_aligned(base + (long long)row * n, 16); return float4{q[0], q[1], q[2], q[3]};
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
static inline void lospmm_sth(lospmm_h16* base, int row, int n, unsigned v) {
  base[(long long)row * n] = (lospmm_h16)(v & 0xffffu);
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
#define LOSPMM_LDXM(v, xp, OFF4, ok, BIT) v = ((ok) & (BIT)) ? (xp)[(OFF4) / 4] : 0.0f
#define LOSPMM_LDXH2M(v, xp0, xp1, OFF2, ok0, ok1, BIT)                                                     \
  v = (((ok0) & (BIT)) ? (unsigned)(xp0)[(OFF2) / 2] : 0u) | (((ok1) & (BIT)) ? (unsigned)(xp1)[(OFF2) / 2] : 0u) << 16
#define LOSPMM_LDX(v, xp, OFF4, rows, cols, RBIT, CBIT) \
  v = (((rows) & (RBIT)) && ((cols) & (CBIT))) ? (xp)[(OFF4) / 4] : 0.0f
// the N:M kernel (include/nm.cuh): shared memory is a static of the kernel function (blocks run one
// at a time), a copy into it happens at once (a copy of 0 bytes fills zeros), and __syncthreads is the
// block scheduler's barrier (host_harness.cpp: the block's threads run one at a time, each until its
// next barrier, so a missing barrier reads a stage that is not there yet)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
static inline void lospmm_cp16(void* shared, const void* global, int bytes) {
  if ((uintptr_t)shared % 16) { fprintf(stderr, "misaligned 16-byte shared copy\n"); exit(25); }
  if (bytes) memcpy(shared, lospmm_aligned((const float*)global, 16), 16); else memset(shared, 0, 16);
}
static inline void lospmm_cp4(void* shared, const void* global, int bytes) {
  if (bytes) memcpy(shared, global, 4); else memset(shared, 0, 4);
}
static inline void lospmm_cp_commit() {}
static inline unsigned lospmm_bits(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
struct alignas(8) uint2 { unsigned x, y; };
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
static inline void lospmm_cp_wait_one() {}
static inline void lospmm_cp_wait_all() {}
void lospmm_syncthreads();
#define __syncthreads() lospmm_syncthreads()
