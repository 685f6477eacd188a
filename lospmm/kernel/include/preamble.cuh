//! Every kernel's helpers (included, these //! lines left out, at the top of every unit).
//! Address arithmetic lives inside inline PTX: with thousands of `B + c * N + n` in straight-line
//! code, LLVM's straight-line strength reduction goes superlinear (4000 loads: 184 s in NVVM, 5.9 s
//! this way). A load's byte offset is `column * 4`, so one mad.wide forms its address. A store
//! computes `(row * N) * 4` in 64 bits instead: written as the loads are, `N * (4 * row)` equals the
//! `N * (4 * column)` of any load of column == row and ptxas keeps that product live from the load
//! to the store (a tile function of M1 = 16 spilled 136 bytes at the §3.2 prediction); scaling N
//! by 4 once instead leaves `N << 2` live through the whole function (4-8 bytes of spill).
//! Tile functions never return (`exit`): a function that never returns saves no callee-saved
//! registers, which otherwise cost ~30 spill stores and loads around every call.
//! The host emulation (lospmm/kernel/host/shim.h) defines the same names in C++.
#if !defined(LOSPMM_HOST_EMULATION) && !defined(LOSPMM_PREAMBLE)
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
