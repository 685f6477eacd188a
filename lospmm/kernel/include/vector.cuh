//! The designs' loads and stores (vector and chained), in the units of a kernel of another design
//! than the baseline only: the baseline's text stays the text measured before designs existed.
#if !defined(LOSPMM_HOST_EMULATION) && !defined(LOSPMM_DESIGN_PREAMBLE)
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
