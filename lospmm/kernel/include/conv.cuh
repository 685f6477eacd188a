//! The streamed conv kernel's load (render/streamed.py): the input at a byte offset read from data, from the
//! window's top-left pixel xp, where the column's window row and column lie inside the image, else 0
//! (the padding): one predicated load, as LOSPMM_LDX with its offset in a register. Its entries are
//! read as int2 pairs (offset, window), which the host emulation defines here.
#ifndef LOSPMM_CONV_PREAMBLE
#define LOSPMM_CONV_PREAMBLE
#if defined(LOSPMM_HOST_EMULATION)
struct alignas(8) int2 { int x, y; };
#define LOSPMM_LDXR(v, xp, off, inside) \
  v = (inside) ? *reinterpret_cast<const float*>(reinterpret_cast<const char*>(xp) + (off)) : 0.0f
#else
#define LOSPMM_LDXR(v, xp, off, inside) \
  asm("{ .reg .pred in; .reg .s64 a; setp.ne.u32 in, %3, 0; cvt.s64.s32 a, %2; add.s64 a, a, %1; " \
      "mov.f32 %0, 0f00000000; @in ld.global.nc.f32 %0, [a]; }" : "=f"(v) : "l"(xp), "r"(off), "r"(inside))
#endif
#endif
