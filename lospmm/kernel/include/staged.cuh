//! The staged kernel's copy of B into shared memory and read from it (render/staged.py). The read: one ld.shared at a literal
//! offset from the lane's address in the staged chunk, as volatile inline PTX touching memory, so that
//! the compiler keeps each read where the code has it — between its chunk's two barriers, never merged
//! with the previous chunk's read of the same offset (plain reads were hoisted ahead of their use, and
//! under the register cap a BERT tile of 12 rows spilled 4-6 KB); the host emulation reads the array.
#ifndef LOSPMM_STAGED_PREAMBLE
#define LOSPMM_STAGED_PREAMBLE
#if defined(LOSPMM_HOST_EMULATION)
#define lospmm_shared_address(p) 0u
#define LOSPMM_LDS(v, lane_address, lane_base, offset) v = (lane_base)[(offset) / 4]
#define LOSPMM_STS(lane_address, lane_base, offset, value) (lane_base)[(offset) / 4] = (value)
#else
#define lospmm_shared_address(p) ((unsigned)__cvta_generic_to_shared(p))
#define LOSPMM_LDS(v, lane_address, lane_base, offset) \
  asm volatile("ld.shared.f32 %0, [%1+" #offset "];" : "=f"(v) : "r"(lane_address) : "memory")
// the copy's store: st.shared at the lane's 32-bit shared address (through the generic pointer a tile
// function is passed, ptxas stored with ST.E, the generic path)
#define LOSPMM_STS(lane_address, lane_base, offset, value) \
  asm volatile("st.shared.f32 [%0], %1;" : : "r"((lane_address) + (offset)), "f"(value) : "memory")
#endif
#endif
