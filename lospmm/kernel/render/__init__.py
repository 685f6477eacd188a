"""One way to render: `kernel_source` for a layer's kernel and `proxy_source` for a search proxy,
each dispatching to the renderer of its form — baked GEMM (render.baked), staged GEMM
and convolution (render.staged), streamed GEMM and convolution (render.streamed), N:M GEMM and convolution (render.nm),
N:M GEMM on sparse tensor cores (render.sparse_mma), sliced GEMM and convolution (a tile's K split
across a block's warps, render.sliced), implicit-im2col convolution (render.conv) — with the number format as the
strategy the renderers use (render.numbers). The same text compiles with NVRTC and, under the host
shim, with the host C++ compiler."""

from __future__ import annotations

import scipy.sparse as sp

from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.geometry import ConvGeometry
from lospmm.kernel.nm import NMTiling
from lospmm.kernel.render.baked import baked_kernel, baked_proxy
from lospmm.kernel.render.common import CodegenParams, float_literal, kernel_name, shard_groups
from lospmm.kernel.render.conv import conv_kernel
from lospmm.kernel.render.nm import nm_kernel
from lospmm.kernel.render.sliced import sliced_conv_kernel, sliced_kernel, sliced_proxy
from lospmm.kernel.render.sparse_mma import sparse_mma_kernel
from lospmm.kernel.sparse_mma import MMATiling
from lospmm.kernel.render.staged import staged_kernel, staged_proxy
from lospmm.kernel.render.streamed import streamed_conv_kernel, streamed_kernel, streamed_proxy
from lospmm.kernel.spec import KernelSource

__all__ = ["CodegenParams", "kernel_source", "nm_kernel", "proxy_source", "float_literal", "kernel_name", "shard_groups"]


def kernel_source(matrix: sp.csr_matrix, tiles, n1: int, params: CodegenParams = CodegenParams(),
                  epilogue: Epilogue = Epilogue(), conv: ConvGeometry | None = None,
                  nm: NMTiling | None = None) -> KernelSource:
    """The kernel of `matrix` on `tiles` (reorder.Tiles) in blocks of `n1` threads, in
    `params.design`, storing through `epilogue`: an implicit-im2col convolution kernel when `conv`
    is given (baked in any number format, sliced, staged, streamed or N:M), else a GEMM kernel, baked, staged or streamed as the design says. A half design's A must hold
    its dtype's values already (numbers.rounded_matrix). The nm design renders the N:M kernel in the
    blocking `nm` (its tiles and N1 are not used): the sparse tensor-core kernel for a blocking of
    sparse_mma (mma sums). ValueError naming what no renderer can do."""
    design = params.design
    if (design.a_values == "nm") != (nm is not None):
        raise ValueError(f"design {design.label}: an N:M blocking is given with the nm design, and only with it")
    if nm is not None:
        on_tensor_cores = isinstance(nm, MMATiling)
        if (design.accumulate == "mma") != on_tensor_cores:
            raise ValueError(f"design {design.label}: mma sums take a sparse tensor-core blocking "
                             f"(lospmm.kernel.sparse_mma), and only they; got {nm.label}")
        if on_tensor_cores:
            if conv is not None:
                raise ValueError(f"design {design.label}: the sparse tensor-core kernel is a GEMM kernel (no "
                                 f"implicit-im2col convolution)")
            return sparse_mma_kernel(matrix, nm, design, epilogue)
        return nm_kernel(matrix, nm, design, epilogue, conv)
    if conv is not None:
        if design.a_values == "streamed":
            return streamed_conv_kernel(matrix, tiles, n1, conv, epilogue, params)
        if design.loads == "staged":
            return staged_kernel(matrix, tiles, n1, params, epilogue, conv)
        if design.k_slices > 1:
            return sliced_conv_kernel(matrix, tiles, n1, conv, epilogue, params)
        return conv_kernel(matrix, tiles, n1, conv, epilogue, params)
    if design.loads == "staged":
        return staged_kernel(matrix, tiles, n1, params, epilogue)
    if design.k_slices > 1:
        return sliced_kernel(matrix, tiles, n1, params, epilogue)
    if design.a_values == "streamed":
        if params.n1_at_launch:
            raise ValueError(f"design {design.label}: N1 at launch is the baked fp32 kernels' so far")
        return streamed_kernel(matrix, tiles, n1, params, epilogue)
    return baked_kernel(matrix, tiles, n1, params, epilogue)


def proxy_source(m: int, k: int, clusters, params: CodegenParams = CodegenParams()) -> KernelSource:
    """The M1 proxy (§5.1) of `clusters` (cluster.ProxyClusters) in `params.design`: the baked
    proxy's straight-line code per cluster, the staged proxy's (the same, reading B from the chunks
    its blocks copy), or the streamed loop over the clusters' data; ValueError for a design the
    search has no proxy of (the N:M kernel, which needs no tiles)."""
    if params.design.a_values == "streamed":
        return streamed_proxy(m, k, clusters, params)
    if params.design.loads == "staged":
        return staged_proxy(m, k, clusters, params)
    if params.design.k_slices > 1:
        return sliced_proxy(m, k, clusters, params)
    return baked_proxy(m, k, clusters, params)
