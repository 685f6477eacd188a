//! The N:M kernel's staging (render/nm.py): asynchronous copies from global into shared memory
//! (cp.async, sm_80 and later: the copy of the next chunk runs while this one is multiplied; a copy
//! of 0 source bytes fills zeros, for B's rows past K and columns past N), and plain loads before
//! sm_80. The host emulation (host_shim.h) copies at once.
#if !defined(LOSPMM_HOST_EMULATION) && !defined(LOSPMM_NM_PREAMBLE)
#define LOSPMM_NM_PREAMBLE
__device__ __forceinline__ void lospmm_cp16(void* shared, const void* global, int bytes) {
#if __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared(shared);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(s), "l"(global), "r"(bytes) : "memory");
#else
  *(float4*)shared = bytes ? *(const float4*)global : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#endif
}
__device__ __forceinline__ void lospmm_cp4(void* shared, const void* global, int bytes) {
#if __CUDA_ARCH__ >= 800
  const unsigned s = (unsigned)__cvta_generic_to_shared(shared);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(s), "l"(global), "r"(bytes) : "memory");
#else
  *(float*)shared = bytes ? *(const float*)global : 0.0f;
#endif
}
__device__ __forceinline__ void lospmm_cp_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// every copy but the last committed group done (the chunk to multiply is in; the next may still be on its way)
__device__ __forceinline__ void lospmm_cp_wait_one() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 1;" ::: "memory");
#endif
}
__device__ __forceinline__ void lospmm_cp_wait_all() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}
// a float's bits (a half N:M kernel's packed pair of A's value, kept in a float array)
__device__ __forceinline__ unsigned lospmm_bits(float x) { return __float_as_uint(x); }
#endif
