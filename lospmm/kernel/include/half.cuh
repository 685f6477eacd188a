//! Device helpers of half kernels (fp16/bf16 as 16-bit patterns, two columns as one packed pair),
//! in their units only. The host emulation's shim defines the same names in C++ with exact rounding.
#if !defined(LOSPMM_HOST_EMULATION) && !defined(LOSPMM_HALF_PREAMBLE)
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
