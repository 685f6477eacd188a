//! The sparse tensor-core kernel's warp-wide instructions (render/sparse_mma.py): ldmatrix.x4.trans
//! (a lane's B fragment of a 32 × 8 step from four 8 × 8 matrices in shared memory, each lane naming
//! one row) and mma.sp::ordered_metadata.m16n8k32 with fp32 sums (sparsity selector 0);
//! LOSPMM_WARP_SYNC() (nothing on the device) at the end of each step, in the scope of its registers. The host
//! emulation runs them as the PTX ISA defines them: each lane leaves its operands in an exchange, the
//! block meets at a barrier (every lane of every warp issues the same sequence of them), and each lane
//! computes its own registers from its warp's — A rebuilt from the fragments and their metadata
//! (an index pair that is not ascending and distinct stops the run), each output summed in float64
//! from its sum and products and rounded once to fp32.
#ifndef LOSPMM_MMA_PREAMBLE
#define LOSPMM_MMA_PREAMBLE
#if defined(LOSPMM_HOST_EMULATION)
struct alignas(16) uint4 { unsigned x, y, z, w; };
// A lane's ldmatrix and mma.sp wait in a queue until the warp's values are needed (an ldmatrix after an
// mma, an accumulator used twice, LOSPMM_WARP_SYNC at the end of a step, while the registers the queue
// points at live): then one exchange
// resolves every queued ldmatrix and one more every queued mma.sp, so a block meets twice a step,
// not once an instruction. Every lane issues the same sequence, so the queues agree lane for lane.
enum { LOSPMM_QUEUE = 128 };
struct lospmm_ldsm_request { uintptr_t row; unsigned* out[4]; };
struct lospmm_mma_request { unsigned a[4], e; unsigned* b[4]; float* d[4]; int bf16; };
struct lospmm_lane_queue {
  lospmm_ldsm_request ldsm[LOSPMM_QUEUE]; int ldsm_count;
  lospmm_mma_request mma[LOSPMM_QUEUE]; int mma_count;
};
struct lospmm_lane_mma { unsigned a[4], b[4], e; };
static uintptr_t lospmm_rows_exchanged[2][1024][LOSPMM_QUEUE];
static lospmm_lane_mma lospmm_mma_exchanged[2][1024][LOSPMM_QUEUE];
static thread_local lospmm_lane_queue lospmm_queue;
static thread_local unsigned lospmm_exchange_turn;  // the lanes' turns agree: each meets the block as often
static inline unsigned lospmm_next_turn() { return lospmm_exchange_turn++ & 1u; }
static inline double lospmm_mma_element(unsigned short bits, int bf16) {
  return bf16 ? lospmm_small_to_double(bits, 7, 127) : lospmm_small_to_double(bits, 10, 15);
}
static void lospmm_resolve_ldsm() {  // matrix q's rows are named by lanes 8q..8q+7; transposed, a lane gets rows 2t, 2t + 1 of column g
  lospmm_lane_queue& q = lospmm_queue;
  const unsigned turn = lospmm_next_turn(), tid = threadIdx.x, lane = tid % 32u, g = lane / 4u, t = lane % 4u;
  for (int i = 0; i < q.ldsm_count; ++i) lospmm_rows_exchanged[turn][tid][i] = q.ldsm[i].row;
  lospmm_syncthreads();
  const unsigned warp = tid & ~31u;
  for (int i = 0; i < q.ldsm_count; ++i)
    for (unsigned m = 0; m < 4; ++m) {
      const unsigned short* lo = (const unsigned short*)lospmm_rows_exchanged[turn][warp + 8 * m + 2 * t][i];
      const unsigned short* hi = (const unsigned short*)lospmm_rows_exchanged[turn][warp + 8 * m + 2 * t + 1][i];
      *q.ldsm[i].out[m] = (unsigned)lo[g] | ((unsigned)hi[g] << 16);
    }
  q.ldsm_count = 0;
}
static void lospmm_resolve_mma() {
  lospmm_lane_queue& q = lospmm_queue;
  const unsigned turn = lospmm_next_turn(), tid = threadIdx.x, lane = tid % 32u, g = lane / 4u, t = lane % 4u;
  for (int i = 0; i < q.mma_count; ++i) {
    lospmm_lane_mma& mine = lospmm_mma_exchanged[turn][tid][i];
    for (int r = 0; r < 4; ++r) { mine.a[r] = q.mma[i].a[r]; mine.b[r] = *q.mma[i].b[r]; }
    mine.e = q.mma[i].e;
  }
  lospmm_syncthreads();
  const unsigned warp = tid & ~31u;
  for (int i = 0; i < q.mma_count; ++i) {
    const int bf16 = q.mma[i].bf16;
    // this lane's rows g and g + 8 of A (the lanes of its group 4g..4g+3; metadata from 4g and 4g + 1)
    // and columns 2t, 2t + 1 of B (the lanes of groups 2t and 2t + 1)
    double A[2][32] = {}, B[32][2] = {};
    for (unsigned T = 0; T < 4; ++T) {
      const lospmm_lane_mma& in = lospmm_mma_exchanged[turn][warp + 4u * g + T][i];
      for (unsigned reg = 0; reg < 4; ++reg) {
        const unsigned upper = reg & 1u;  // row g + 8
        for (unsigned h = 0; h < 2; ++h) {
          const unsigned c = 2u * T + h + (reg >= 2 ? 8u : 0u), group = c / 2u;  // compressed column, its group of 4
          // selector 0: lanes 4g and 4g + 1 give rows g (bits 0-15) and g + 8 (16-31), groups 0-3 and 4-7
          const unsigned entry = lospmm_mma_exchanged[turn][warp + 4u * g + group / 4u][i].e;
          const unsigned code = (entry >> (16u * upper + 4u * (group % 4u))) & 0xFu, i0 = code & 3u, i1 = code >> 2;
          if (i0 >= i1) { fprintf(stderr, "mma.sp: metadata pair %u,%u is not ascending\n", i0, i1); exit(27); }
          A[upper][4u * group + (c % 2u ? i1 : i0)] = lospmm_mma_element((in.a[reg] >> (16u * h)) & 0xFFFFu, bf16);
        }
      }
    }
    for (unsigned col = 0; col < 2; ++col)
      for (unsigned T = 0; T < 4; ++T) {  // lane (G, T) holds rows 8j + 2T, 8j + 2T + 1 of column G
        const lospmm_lane_mma& in = lospmm_mma_exchanged[turn][warp + 4u * (2u * t + col) + T][i];
        for (unsigned j = 0; j < 4; ++j) {
          B[8 * j + 2 * T][col] = lospmm_mma_element(in.b[j] & 0xFFFFu, bf16);
          B[8 * j + 2 * T + 1][col] = lospmm_mma_element(in.b[j] >> 16, bf16);
        }
      }
    for (unsigned r = 0; r < 4; ++r) {  // d0, d1: row g, columns 2t, 2t + 1; d2, d3: row g + 8
      double sum = *q.mma[i].d[r];
      for (unsigned k = 0; k < 32; ++k) sum += A[r / 2u][k] * B[k][r & 1u];
      *q.mma[i].d[r] = (float)sum;
    }
  }
  q.mma_count = 0;
}
static inline void lospmm_warp_sync() {  // every queued instruction done: its registers hold their values
  if (lospmm_queue.ldsm_count) lospmm_resolve_ldsm();
  if (lospmm_queue.mma_count) lospmm_resolve_mma();
}
static inline void lospmm_ldsm_x4_t(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, const void* row) {
  if ((uintptr_t)row % 16) { fprintf(stderr, "ldmatrix: a row address not 16-byte aligned\n"); exit(25); }
  lospmm_lane_queue& q = lospmm_queue;
  if (q.mma_count || q.ldsm_count == LOSPMM_QUEUE) lospmm_warp_sync();  // in order: a queued mma may read these registers
  q.ldsm[q.ldsm_count++] = lospmm_ldsm_request{(uintptr_t)row, {&r0, &r1, &r2, &r3}};
}
static inline void lospmm_mma_sp(float& d0, float& d1, float& d2, float& d3, const uint4& a, unsigned& b0, unsigned& b1,
                                 unsigned& b2, unsigned& b3, unsigned e, int bf16) {
  lospmm_lane_queue& q = lospmm_queue;
  bool again = q.mma_count == LOSPMM_QUEUE;  // an accumulator already queued: its sum first
  for (int i = 0; i < q.mma_count && !again; ++i) again = q.mma[i].d[0] == &d0;
  if (again) lospmm_warp_sync();
  q.mma[q.mma_count++] = lospmm_mma_request{{a.x, a.y, a.z, a.w}, e, {&b0, &b1, &b2, &b3}, {&d0, &d1, &d2, &d3}, bf16};
}
#define LOSPMM_WARP_SYNC() lospmm_warp_sync()
#define LOSPMM_LDSM_X4_T(r0, r1, r2, r3, row) lospmm_ldsm_x4_t(r0, r1, r2, r3, row)
#define LOSPMM_MMA_SP_fp16(d0, d1, d2, d3, a, b0, b1, b2, b3, e) lospmm_mma_sp(d0, d1, d2, d3, a, b0, b1, b2, b3, e, 0)
#define LOSPMM_MMA_SP_bf16(d0, d1, d2, d3, a, b0, b1, b2, b3, e) lospmm_mma_sp(d0, d1, d2, d3, a, b0, b1, b2, b3, e, 1)
#else
#define LOSPMM_WARP_SYNC()
// volatile, touching memory: each read stays between its stage's two barriers
#define LOSPMM_LDSM_X4_T(r0, r1, r2, r3, row)                                                               \
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"                   \
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"((unsigned)__cvta_generic_to_shared(row)) : "memory")
#define LOSPMM_MMA_SP(TYPE, d0, d1, d2, d3, a, b0, b1, b2, b3, e)                                            \
  asm("mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32." TYPE "." TYPE ".f32 "                  \
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9, %10, %11}, {%0, %1, %2, %3}, %12, 0x0;"               \
      : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)                                                              \
      : "r"((a).x), "r"((a).y), "r"((a).z), "r"((a).w), "r"(b0), "r"(b1), "r"(b2), "r"(b3), "r"(e))
#define LOSPMM_MMA_SP_fp16(d0, d1, d2, d3, a, b0, b1, b2, b3, e) LOSPMM_MMA_SP("f16", d0, d1, d2, d3, a, b0, b1, b2, b3, e)
#define LOSPMM_MMA_SP_bf16(d0, d1, d2, d3, a, b0, b1, b2, b3, e) LOSPMM_MMA_SP("bf16", d0, d1, d2, d3, a, b0, b1, b2, b3, e)
#endif
#endif
