"""The kernel source of any design: codegen's fp32 kernels and proxies, codegen_half's for a half
design (fp16/bf16). The search, the compile stage and the benchmarks build through these, so a
half run's proxies and kernels are the ones its constraints and estimate describe."""

from __future__ import annotations

import scipy.sparse as sp

from lospmm.stages.codegen import CodegenParams, Epilogue, KernelSource, full_kernel_source, proxy_kernel_source
from lospmm.stages.codegen_half import half_kernel_source, half_proxy_kernel_source


def kernel_source(matrix: sp.csr_matrix, tiles, n1: int, params: CodegenParams = CodegenParams(),
                  epilogue: Epilogue = Epilogue()) -> KernelSource:
    """The full kernel of `tiles` in `params.design` (a half design's A must hold its dtype's values
    already: codegen_half.rounded_matrix)."""
    if params.design.half:
        return half_kernel_source(matrix, tiles, n1, None, params, epilogue)
    return full_kernel_source(matrix, tiles, n1, params, epilogue)


def proxy_source(m: int, k: int, clusters, params: CodegenParams = CodegenParams()) -> KernelSource:
    """The M1 proxy of `clusters` in `params.design`."""
    if params.design.half:
        return half_proxy_kernel_source(m, k, clusters, params)
    return proxy_kernel_source(m, k, clusters, params)
