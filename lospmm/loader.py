"""Use an emitted kernel from Python. `load_kernel(dir)` returns the kernel as a callable:

- a GEMM kernel (`form` gemm): `spmm(B)` -> C = A·B, B K×N in the kernel's dtype, any N;
- an implicit-im2col convolution kernel (`form` conv): `conv(X)` -> Y, X an NCHW float32
  batch of the emitted input size (any batch), Y NCHW.

Backends (lospmm.kernel.backend): `cuda` launches the cubin on CuPy arrays or torch CUDA tensors
(the extras `lospmm[torch]` or `[cupy]`); `host` runs the same kernel.cu on the CPU through the
host emulation, on numpy arrays or torch CPU tensors. `host` is for tests and for checking a kernel
directory without a GPU: it builds a C++ program per kernel (cached) and is slow. What a kernel
takes and how it is launched is its KernelSpec's (kernel.json)."""

from __future__ import annotations

from pathlib import Path

from lospmm.kernel.arrays import allocated, device_pointer, host_array, stored
from lospmm.kernel.backend import checked_backend
from lospmm.kernel.package import KernelDirError, KernelPackage, read_package, runs

__all__ = ["KernelDirError", "SpConv", "SpMM", "backend_here", "checked_backend", "load_kernel", "kernel_package"]


def backend_here(backend: str) -> str:
    """`backend`, checked; RuntimeError in one line where it is `cuda` and this machine has no CUDA
    device (rather than the driver library's own error from deep in the first launch's set-up)."""
    if checked_backend(backend) == "cuda":
        from lospmm.kernel.cuda import gpu_present

        if not gpu_present():
            raise RuntimeError("no CUDA device here for backend='cuda'; backend='host' runs the kernels on the CPU "
                               "(the host emulation: slow, for checking)")
    return backend


def kernel_package(kernel_dir: str | Path, backend: str | None = None) -> KernelPackage:
    """The kernel directory's package, checked against its manifest, with what `backend` runs (the
    cubin, or the source for the host) when one is given; KernelDirError naming the problem."""
    return read_package(kernel_dir, ("kernel.json",) if backend is None else ("kernel.json", runs(backend)))


class _Kernel:
    """One kernel package, launchable on a backend. `package`: the directory's, when the caller
    has just read it (`load_kernel`)."""

    def __init__(self, kernel_dir: str | Path, backend: str = "cuda", package: KernelPackage | None = None):
        self.package = package or kernel_package(kernel_dir, backend)
        self.spec, self.dir, self.backend = self.package.spec, self.package.dir, checked_backend(backend)
        self.facts = self.package.facts
        self.m, self.k = self.spec.m, self.spec.k
        self.layout = self.spec.layout
        self.n1, self.dtype = self.spec.n1, self.spec.dtype
        self._alignment = self.spec.alignment  # read once: a µs of every eager call otherwise
        self._kernel = self.package.on(backend)

    def __repr__(self) -> str:
        # what a user printing a loaded layer needs: which layer, its shape and sparsity, how it is served
        from lospmm.kernel.design import short_design_label

        spec, design = self.spec, short_design_label(self.facts.get("design", {}).get("label", ""))
        nm = self.facts.get("nm")
        tile_n1 = self.layout.threads // self.layout.groups  # a staged or sliced block holds several tiles' threads
        served = f"N:M {nm['label']}" if isinstance(nm, dict) else f"tile {spec.m1}×{tile_n1} {design}".rstrip()
        shape = f"M={self.m} K={self.k} nnz={spec.nnz}" + (f" {spec.conv.cin}×{spec.conv.h}×{spec.conv.w} input"
                                                          if spec.form == "conv" and spec.conv else "")
        return (f"{type(self).__name__}({spec.layer!r}, {shape}, sparsity {spec.sparsity:g}, {self.dtype}, {served}, "
                f"backend {self.backend!r}, {str(self.dir)!r})")

    def _launch(self, count: int, x, y):
        """One launch over `count` (N or a batch) of input `x` into output `y`. A kernel that computes
        several columns per thread runs on copies padded to its column multiple (and aligned) where
        the arrays are not."""
        spec = self.spec
        if self.backend == "host":
            return stored(y, self._kernel.run(host_array(x, spec.number)), spec.number)
        launched = spec.launch_count(count)
        x_ptr, stream = device_pointer(x, spec.dtype, True)
        y_ptr, _ = device_pointer(y, spec.dtype, False)
        if launched != count or x_ptr % self._alignment or y_ptr % self._alignment:
            return self._launch_padded(count, launched, x, y)
        self._kernel.launch(x_ptr, y_ptr, launched, stream)
        return y

    def _launch_padded(self, columns: int, launched: int, b, c):
        """A GEMM kernel's launch on fresh K×`launched` and M×`launched` copies (zero columns past
        `columns`), the result copied back into `c`."""
        padded_b = allocated(b, (self.k, launched), "zeros")
        padded_b[:, :columns] = b
        padded_c = allocated(b, (self.m, launched))
        self._launch(launched, padded_b, padded_c)
        c[...] = padded_c[:, :columns]
        return c

    def _called(self, x, out):
        problem = self.spec.serves(tuple(x.shape))
        if problem:
            raise ValueError(f"{self.spec.layer}: {problem}")
        count = self.spec.input_count(tuple(x.shape))
        out = allocated(x, self.spec.output_shape(count)) if out is None else out
        try:
            return self._launch(count, x, out)
        except (ValueError, TypeError) as e:  # an array the kernel cannot take: say which layer's
            raise type(e)(f"{self.spec.layer}: {e}") from None


class SpMM(_Kernel):
    """The emitted GEMM kernel of one layer: `spmm(B)` -> C with C = A·B, A baked in (M×K), through
    the epilogue kernel.json's `epilogue` records (a bias per row and an activation), if any."""

    def __call__(self, b, out=None):
        return self._called(b, out)


class SpConv(_Kernel):
    """The emitted implicit-im2col kernel of one convolution: `conv(X)` -> Y, X NCHW float32 of
    the input size it was emitted for (any batch), Y NCHW; no bias or activation unless kernel.json's
    `epilogue` says it was fused."""

    def __call__(self, x, out=None):
        return self._called(x, out)


def load_kernel(kernel_dir: str | Path, backend: str = "cuda") -> SpMM | SpConv:
    """The callable for one kernel directory: SpMM for a GEMM kernel, SpConv for an implicit-im2col
    convolution kernel. `backend`: `cuda` or `host` (see the module doc)."""
    backend_here(backend)
    package = kernel_package(kernel_dir, backend)
    return (SpConv if package.spec.form == "conv" else SpMM)(kernel_dir, backend, package)
