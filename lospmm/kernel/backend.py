"""One way to run a kernel: a backend — `cuda` (the GPU, lospmm.kernel.cuda) or `host` (the CPU host
emulation, lospmm.kernel.host) — makes a compiled or rendered kernel into an object with the same
protocol: `spec`, `run(x)` on numpy arrays (what the check runs: lospmm.kernel.check.checked) and
`time(count)` (measured on a GPU; the host times nothing). The loader, lospmm.torch, the emit
stage's checks and the benchmarks take their kernels from here."""

from __future__ import annotations

from typing import Mapping, Protocol

import numpy as np

from lospmm.kernel.spec import KernelSource, KernelSpec
from lospmm.kernel.timing import Timing

BACKENDS = ("cuda", "host")


class BackendKernel(Protocol):
    backend: str
    spec: KernelSpec

    def run(self, x: np.ndarray, threads: int | None = None, extra: Mapping[str, np.ndarray] | None = None
            ) -> np.ndarray:
        """The output of one launch on input `x` (B, a half kernel's B bits, or a conv kernel's X),
        padded to the kernel's column multiple and cut back; `threads` and `extra` are a proxy's
        block size and cluster map."""
        ...

    def time(self, count: int) -> Timing: ...


def checked_backend(backend: str) -> str:
    """`backend` if it is one of BACKENDS, else ValueError naming them."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    return backend


def backend_kernel(backend: str, spec: KernelSpec, cubin: bytes | None = None, source: str | None = None,
                   sanitize: bool = False, module_data: Mapping[str, np.ndarray] | None = None) -> BackendKernel:
    """`spec`'s kernel on `backend`: its cubin on the GPU, its source text built for the host
    (under AddressSanitizer with `sanitize`); `module_data`: its module globals' contents
    (KernelSpec.module_data), for a kernel that has any."""
    if checked_backend(backend) == "cuda":
        if cubin is None:
            raise ValueError(f"{spec.layer or spec.name}: the cuda backend launches a cubin; none given")
        from lospmm.kernel.cuda import CudaKernel

        return CudaKernel(spec, cubin, module_data)
    if source is None:
        raise ValueError(f"{spec.layer or spec.name}: the host backend builds the kernel's source; none given")
    from lospmm.kernel.host import HostKernel

    return HostKernel(KernelSource(spec, (source,)), sanitize, module_data)
