"""The sparse tensor-core kernel (design `nm` with sums `mma`, the N:M form on sparse tensor cores): an
A with at most 2 nonzeros in every 4 columns, laid out lane by lane for mma.sp (lospmm.kernel.sparse_mma),
filled into the module's globals when it is loaded; one unit of O(1) code per blocking and dtype.

Each block computes block_rows × block_columns of C in warps of warp_rows × warp_columns. Per stage
of K its threads copy the stage's rows of B (16-byte cp.async where N is a multiple of 8 and B is
16-byte aligned, element by element otherwise; zeros past K and N) into shared memory, rows padded by
8 elements so that an ldmatrix's 8 rows fall in different banks, and the block's A fragments and
metadata beside them; two stages, the next on its way while this one is multiplied. Per step of 32
columns a warp reads its A fragments (one 16-byte read a lane and m-tile) and metadata, each
n-tile's B fragment with one ldmatrix.x4.trans, and issues an mma.sp per m-tile and n-tile; a
step ends with LOSPMM_WARP_SYNC (nothing on the device: where the host emulation's queued warp
instructions are done, while the step's registers live and before the barrier). Sums are fp32; the epilogue (bias as module data, the activation) in fp32, one rounding at the pack; C is
stored a pair of columns at a time where N is even and C 4-byte aligned."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from lospmm.kernel.design import KernelDesign
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.includes import included
from lospmm.kernel.render.nm import block_copies, copy_setup, untiled_spec, vector_copies
from lospmm.kernel.render.numbers import epilogue_scalar
from lospmm.kernel.sparse_mma import STEP, MMATiling, mma_operands
from lospmm.kernel.spec import KernelSource, KernelSpec


def sparse_mma_kernel(matrix: sp.csr_matrix, tiling: MMATiling, design: KernelDesign,
                      epilogue: Epilogue = Epilogue()) -> KernelSource:
    """The sparse tensor-core kernel of `matrix` (which must keep at most 2 of every 4 columns of a
    row: ValueError naming the row that does not) in `tiling`'s blocking and `design`'s dtype."""
    if not design.half or design.accumulate != "mma":
        raise ValueError(f"design {design.label}: the sparse tensor-core kernel is fp16 or bf16 with mma sums")
    a = sp.csr_matrix(matrix, dtype=np.float32)
    a.sort_indices()
    operands = mma_operands(a, tiling, design.dtype)  # refuses an A the instruction cannot take, before rendering
    spec, sizes = untiled_spec("lospmm_mma", a, tiling, design, epilogue, operands, design.dtype)
    return KernelSource(spec, (_source(spec, tiling, sizes, epilogue),))


def _source(spec: KernelSpec, t: MMATiling, sizes: dict[str, int], epilogue: Epilogue) -> str:
    name, m, k, dtype = spec.name, spec.m, spec.k, spec.dtype
    symbols = spec.module_symbols
    values, index = symbols["values"], symbols["index"]
    bn, pitch, depth, threads = t.block_columns, t.row_pitch, t.depth, t.threads
    a_words, e_words = t.stage_words
    warps_n = t.block_columns // t.warp_columns
    mt, nt = t.warp_rows // 16, t.warp_columns // 8
    globals_ = [f"__device__ __align__(16) float {values}[{sizes[values]}];\n",
                f"__device__ __align__(16) unsigned char {index}[{sizes[index]}];\n"]
    if epilogue.bias:
        globals_.append(f"__device__ float {symbols['bias']}[{m}];\n")
    stage = "".join([
        f"__device__ __forceinline__ void stage_{name}(lospmm_h16* Bs, unsigned* As, unsigned* Es, "
        f"const lospmm_h16* __restrict__ B, const int N, const int k0, const int col0, const long long slab, "
        f"const bool vec, const lospmm_h16* bcol, const unsigned kbytes, const int live) {{\n",
        "  const int tid = threadIdx.x;\n",
        "  if (vec) {  // 8 columns a copy: N is a multiple of 8, so a copy is wholly inside or past N\n",
        *(f"    {line}" for line in vector_copies(depth, k, depth, bn, pitch, threads, 8, "lospmm_h16")),
        "  } else {  // a 16-bit element: no asynchronous copy that small\n",
        "    #pragma unroll 1\n",
        f"    for (int i = tid; i < {depth * bn}; i += {threads}) {{\n",
        f"      const int r = i / {bn}, q = i % {bn}, kr = k0 + r, col = col0 + q;\n",
        f"      Bs[r * {pitch} + q] = kr < {k} && col < N ? B[(long long)kr * N + col] : (lospmm_h16)0;\n",
        "    }\n  }\n",
        f"  const float* av = {values} + slab * {a_words};\n",
        *block_copies(a_words // 4, threads, "As", "av", 4),
        f"  const unsigned char* ev = {index} + slab * {4 * e_words};\n",
        *block_copies(e_words // 4, threads, "Es", "ev", 4, 16),
        "}\n"])
    acc = [[[f"c{i}_{j}_{r}" for r in range(4)] for j in range(nt)] for i in range(mt)]
    step = []
    for i in range(mt):
        step.append(f"      const uint4 a{i} = *(const uint4*)(as + s * {t.mtiles * 128} + {i * 128});\n")
        step.append(f"      const unsigned e{i} = es[s * {t.mtiles * 16} + {i * 16}];\n")
    for j in range(nt):
        step.append(f"      unsigned b{j}_0, b{j}_1, b{j}_2, b{j}_3; LOSPMM_LDSM_X4_T(b{j}_0, b{j}_1, b{j}_2, b{j}_3, "
                    f"bs + s * {STEP * pitch} + {8 * j});\n")
    for i in range(mt):
        for j in range(nt):
            step.append(f"      LOSPMM_MMA_SP_{dtype}({', '.join(acc[i][j])}, a{i}, b{j}_0, b{j}_1, b{j}_2, b{j}_3, e{i});\n")
    stores = []
    for i in range(mt):
        for half in range(2):
            stores.append(f"  {{ const int r = row0 + {16 * i + 8 * half};\n    if (r < {m}) {{\n"
                          f"      lospmm_h16* cr = C + (long long)r * N;\n")
            bias = f" + {symbols['bias']}[r]" if epilogue.bias else ""
            for j in range(nt):
                lo, hi = (epilogue_scalar(epilogue, f"{acc[i][j][2 * half + lane]}{bias}") for lane in range(2))
                stores.append(f"      {{ const int col = col0 + {8 * j}; const unsigned p = lospmm_pack_{dtype}({lo}, {hi});\n"
                              "        if (pair && col + 1 < N) *(unsigned*)(cr + col) = p;\n"
                              "        else { if (col < N) cr[col] = (lospmm_h16)(p & 0xffffu); "
                              "if (col + 1 < N) cr[col + 1] = (lospmm_h16)(p >> 16); }\n      }\n")
            stores.append("    }\n  }\n")
    chunks, row_blocks = t.chunks(k), t.row_blocks(m)
    body = "".join([
        f"LOSPMM_KERNEL void __launch_bounds__({threads}) {name}(const lospmm_h16* __restrict__ B, "
        f"lospmm_h16* __restrict__ C, const int N) {{\n",
        f"  __shared__ __align__(16) lospmm_h16 Bs[2][{depth * pitch}];\n",
        f"  __shared__ __align__(16) unsigned As[2][{a_words}];\n",
        f"  __shared__ __align__(16) unsigned Es[2][{e_words}];\n",
        f"  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wm = warp / {warps_n}, wn = warp % {warps_n};\n",
        f"  const int row_block = blockIdx.x, col_block = blockIdx.y * {bn};\n",
        "  const bool vec = N % 8 == 0 && (unsigned long long)B % 16 == 0;\n",
        *copy_setup(bn, 8, "lospmm_h16", 2, col0="col_block"),
        "  const bool pair = N % 2 == 0 && (unsigned long long)C % 4 == 0;\n",
        *(f"  float {', '.join(f'{c} = 0.0f' for c in tile)};\n" for row in acc for tile in row),
        f"  stage_{name}(Bs[0], As[0], Es[0], B, N, 0, col_block, row_block, vec, bcol, kbytes, live);\n",
        "  lospmm_cp_commit();\n",
        f"  for (int c = 0; c < {chunks}; ++c) {{\n",
        f"    if (c + 1 < {chunks}) {{\n",
        f"      stage_{name}(Bs[(c + 1) & 1], As[(c + 1) & 1], Es[(c + 1) & 1], B, N, (c + 1) * {depth}, col_block, "
        f"(long long)(c + 1) * {row_blocks} + row_block, vec, bcol, kbytes, live);\n",
        "      lospmm_cp_commit();\n      lospmm_cp_wait_one();\n    } else {\n      lospmm_cp_wait_all();\n    }\n",
        "    __syncthreads();\n",
        "    // lane l names row l of the step (ldmatrix's matrix l / 8, its row l % 8) at the warp's columns\n",
        f"    const lospmm_h16* bs = Bs[c & 1] + lane * {pitch} + wn * {t.warp_columns};\n",
        f"    const unsigned* as = As[c & 1] + wm * {mt * 128} + lane * 4;\n",
        "    // selector 0: lanes 4g and 4g + 1 give the metadata of rows g and g + 8\n",
        f"    const unsigned* es = Es[c & 1] + wm * {mt * 16} + (lane / 4) * 2 + (lane & 1);\n",
        "#pragma unroll\n",
        f"    for (int s = 0; s < {t.steps}; ++s) {{\n", *step,
        "      LOSPMM_WARP_SYNC();  // the host emulation's queued instructions done while their registers live\n",
        "    }\n",
        "    __syncthreads();\n  }\n",
        f"  const int row0 = row_block * {t.block_rows} + wm * {t.warp_rows} + lane / 4;\n",
        f"  const int col0 = col_block + wn * {t.warp_columns} + 2 * (lane % 4);\n",
        *stores, "}\n"])
    header = (f"// lospmm sparse tensor-core kernel {name}: M={m} K={k} nnz={spec.nnz} {t.label} threads={threads} "
              f"design={spec.design.code_label}{' epilogue=' + epilogue.label if not epilogue.empty else ''}\n")
    return "".join([included("preamble.cuh"), included("half.cuh"), included("nm.cuh"), included("mma.cuh"),
                    header, *globals_, stage, body])
