//! A sliced tile's partial sums (design k_slices, render/sliced.py): each slice of the tile's columns stores
//! the rows another slice also touches into its slot of shared memory, and after a barrier each row's
//! owner adds the others' to its own. Stores and loads are inline PTX at the lane's 32-bit shared
//! address (through the generic pointer a tile function is passed, ptxas stored with ST.E), volatile
//! with a memory clobber so that none moves across the barrier. A proxy's slots are as many as its N1,
//! given at launch: its partial sums are dynamic shared memory (LOSPMM_PARTIALS), launched with them
//! (stages.pad.proxy_dynamic_shared). The host emulation reads and writes the array at the same offsets,
//! a proxy's in exactly the dynamic shared memory its host run was launched with (host_shim.h).
#ifndef LOSPMM_SLICED_PREAMBLE
#define LOSPMM_SLICED_PREAMBLE
#if defined(LOSPMM_HOST_EMULATION)
#define lospmm_partial_address(p) 0u
static inline float* lospmm_partials() {
  if (!lospmm_dynamic_shared) {
    fprintf(stderr, "a sliced kernel launched with no dynamic shared memory for its partial sums "
                    "(stages.pad.proxy_dynamic_shared)\n");
    exit(27);
  }
  return static_cast<float*>(lospmm_dynamic_shared);
}
#define LOSPMM_PARTIALS(name) float* const name = lospmm_partials()
static inline float* lospmm_slot(float* lane, int offset) {
  return const_cast<float*>(lospmm_aligned(lane + offset / 4, 4));
}
static inline void lospmm_part_st(unsigned, float* lane, int offset, float v) { *lospmm_slot(lane, offset) = v; }
static inline void lospmm_part_st2(unsigned, float* lane, int offset, float2 v) {
  float* q = const_cast<float*>(lospmm_aligned(lane + offset / 4, 8)); q[0] = v.x; q[1] = v.y;
}
static inline void lospmm_part_st4(unsigned, float* lane, int offset, float4 v) {
  float* q = const_cast<float*>(lospmm_aligned(lane + offset / 4, 16)); q[0] = v.x; q[1] = v.y; q[2] = v.z; q[3] = v.w;
}
static inline float lospmm_part_ld(unsigned, float* lane, int offset) { return *lospmm_slot(lane, offset); }
static inline float2 lospmm_part_ld2(unsigned, float* lane, int offset) {
  const float* q = lospmm_aligned(lane + offset / 4, 8); return float2{q[0], q[1]};
}
static inline float4 lospmm_part_ld4(unsigned, float* lane, int offset) {
  const float* q = lospmm_aligned(lane + offset / 4, 16); return float4{q[0], q[1], q[2], q[3]};
}
#else
#define lospmm_partial_address(p) ((unsigned)__cvta_generic_to_shared(p))
#define LOSPMM_PARTIALS(name) extern __shared__ __align__(16) float name[]
__device__ __forceinline__ void lospmm_part_st(unsigned a, float*, int offset, float v) {
  asm volatile("st.shared.f32 [%0], %1;" : : "r"(a + offset), "f"(v) : "memory");
}
__device__ __forceinline__ void lospmm_part_st2(unsigned a, float*, int offset, float2 v) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" : : "r"(a + offset), "f"(v.x), "f"(v.y) : "memory");
}
__device__ __forceinline__ void lospmm_part_st4(unsigned a, float*, int offset, float4 v) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" : : "r"(a + offset), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}
__device__ __forceinline__ float lospmm_part_ld(unsigned a, float*, int offset) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a + offset) : "memory");
  return v;
}
__device__ __forceinline__ float2 lospmm_part_ld2(unsigned a, float*, int offset) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(a + offset) : "memory");
  return v;
}
__device__ __forceinline__ float4 lospmm_part_ld4(unsigned a, float*, int offset) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a + offset)
               : "memory");
  return v;
}
#endif
#endif
