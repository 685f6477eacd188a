//! Device helpers of a half implicit-im2col conv kernel (render/conv.py: a thread's pair is two output pixels,
//! each lane's input its own 16-bit load), in its units only, after half.cuh. The host emulation's shim
//! defines the same names in C++.
#if !defined(LOSPMM_HOST_EMULATION) && !defined(LOSPMM_HALF_CONV_PREAMBLE)
#define LOSPMM_HALF_CONV_PREAMBLE
// an implicit-im2col conv kernel's pair: lane 0's and lane 1's inputs (two output pixels, two windows), each
// the 16-bit element at byte offset OFF2 (a literal) from its window's corner where bit BIT (a literal) of its
// window mask is set (ok0: lane 0's, ok1: lane 1's; include/window.cuh), else 0 (the padding), lane 0 in the low
// half: two predicated loads and one pack
#define LOSPMM_LDXH2M(v, xp0, xp1, OFF2, ok0, ok1, BIT) \
  asm("{ .reg .pred p, q; .reg .b32 t, l, h; " \
      "and.b32 t, %3, " #BIT "; setp.ne.u32 p, t, 0; and.b32 t, %4, " #BIT "; setp.ne.u32 q, t, 0; " \
      "mov.b32 l, 0; mov.b32 h, 0; @p ld.global.nc.u16 l, [%1+" #OFF2 "]; @q ld.global.nc.u16 h, [%2+" #OFF2 "]; " \
      "prmt.b32 %0, l, h, 0x5410; }" : "=r"(v) : "l"(xp0), "l"(xp1), "r"(ok0), "r"(ok1))
// one 16-bit output (a conv kernel's lane: its pixel's row `row` of NCHW Y, rows n apart)
__device__ __forceinline__ void lospmm_sth(lospmm_h16* base, int row, int n, unsigned v) {
  asm volatile("{ .reg .s64 r, m, a; .reg .b16 h; cvt.s64.s32 r, %0; cvt.s64.s32 m, %1; mul.lo.s64 a, r, m; shl.b64 a, a, 1; add.s64 a, a, %2; cvt.u16.u32 h, %3; st.global.b16 [a], h; }" :: "r"(row), "r"(n), "l"(base), "r"(v) : "memory");
}
#endif
