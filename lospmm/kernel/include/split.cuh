//! A K split's partial sums (design section_fmas), read back by the thread that stored them with
//! lospmm_st*: a coherent load (not .nc: the read-only path need not see this kernel's stores), ordered
//! after the stores (volatile, memory clobber). Included in a K split's units only, so every other
//! kernel's text is what it was. The host emulation (host_shim.h) defines the same names.
#if !defined(LOSPMM_HOST_EMULATION) && !defined(LOSPMM_SPLIT_PREAMBLE)
#define LOSPMM_SPLIT_PREAMBLE
__device__ __forceinline__ float lospmm_ldp(const float* base, int row, int n) {
  float v;
  asm volatile("{ .reg .s64 r, m, a; cvt.s64.s32 r, %1; cvt.s64.s32 m, %2; mul.lo.s64 a, r, m; shl.b64 a, a, 2; add.s64 a, a, %3; ld.global.f32 %0, [a]; }" : "=f"(v) : "r"(row), "r"(n), "l"(base) : "memory");
  return v;
}
__device__ __forceinline__ float2 lospmm_ldp2(const float* base, int row, int n) {
  float2 v;
  asm volatile("{ .reg .s64 r, m, a; cvt.s64.s32 r, %2; cvt.s64.s32 m, %3; mul.lo.s64 a, r, m; shl.b64 a, a, 2; add.s64 a, a, %4; ld.global.v2.f32 {%0, %1}, [a]; }" : "=f"(v.x), "=f"(v.y) : "r"(row), "r"(n), "l"(base) : "memory");
  return v;
}
__device__ __forceinline__ float4 lospmm_ldp4(const float* base, int row, int n) {
  float4 v;
  asm volatile("{ .reg .s64 r, m, a; cvt.s64.s32 r, %4; cvt.s64.s32 m, %5; mul.lo.s64 a, r, m; shl.b64 a, a, 2; add.s64 a, a, %6; ld.global.v4.f32 {%0, %1, %2, %3}, [a]; }" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(row), "r"(n), "l"(base) : "memory");
  return v;
}
#endif
