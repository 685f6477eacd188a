//! The baked conv kernels' window load (render/conv.py), in their units only, after preamble.cuh: one
//! mask a pixel says which of its window's kh·kw entries lie inside the image (bit ky·kw + kx, made
//! once from the row and column masks: window_mask_lines), so that each load tests one literal bit of
//! it (one LOP3 to a predicate) where LOSPMM_LDX tested a row bit and a column bit. The host
//! emulation's shim defines the same names in C++.
#if !defined(LOSPMM_HOST_EMULATION) && !defined(LOSPMM_WINDOW_PREAMBLE)
#define LOSPMM_WINDOW_PREAMBLE
// v = the input element at byte offset OFF4 (a literal) from xp if bit BIT (a literal) of ok is set, else 0
#define LOSPMM_LDXM(v, xp, OFF4, ok, BIT) \
  asm("{ .reg .pred in; .reg .b32 t; and.b32 t, %2, " #BIT "; setp.ne.u32 in, t, 0; mov.f32 %0, 0f00000000; " \
      "@in ld.global.nc.f32 %0, [%1+" #OFF4 "]; }" : "=f"(v) : "l"(xp), "r"(ok))
#endif
