"""Use an emitted kernel from Python. `load_kernel(dir)` returns the kernel as a callable:

- a GEMM kernel (`form` gemm): `spmm(B)` -> C = A·B, B K×N float32, any N;
- an implicit-im2col convolution kernel (`form` implicit-conv): `conv(X)` -> Y, X an NCHW float32
  batch of the emitted input size (any batch), Y NCHW.

Backends: `cuda` launches the cubin on CuPy arrays or torch CUDA tensors (the extras
`lospmm[torch]` or `[cupy]`); `host` runs the same kernel.cu on the CPU through the host emulation,
on numpy arrays or torch CPU tensors. `host` is for tests and for checking a kernel directory
without a GPU: it builds a C++ program per kernel (cached) and is slow."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lospmm.stages.codegen import KernelSource, LaunchLayout, design_of_facts

BACKENDS = ("cuda", "host")


class KernelDirError(ValueError):
    """A kernel directory is missing a file or was not compiled; the message names it."""


def kernel_facts(kernel_dir: str | Path, required: tuple[str, ...] = ("kernel.json",)) -> dict:
    """kernel.json of a directory that passes its checksums (every file emit wrote, unchanged) and
    has `required`; KernelDirError naming the directory otherwise."""
    from lospmm.flows.storage.store import manifest_problem

    d = Path(kernel_dir)
    problem = manifest_problem(d, required=required)  # as emit wrote them, or nothing
    if problem:
        raise KernelDirError(f"{problem}; re-run the search (or `lospmm rerun --stage emit`) to rebuild it")
    try:
        return json.loads((d / "kernel.json").read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise KernelDirError(f"{d}: {Path(e.filename).name} is missing (was the kernel compiled?)") from None


def checked_backend(backend: str) -> str:
    """`backend` if it is one of BACKENDS, else ValueError naming them."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    return backend


def _launch_facts(kernel_dir: str | Path, backend: str) -> dict:
    """kernel_facts of a directory with what `backend` runs: the cubin, or the source for the host."""
    runs = "kernel.cubin" if checked_backend(backend) == "cuda" else "kernel.cu"
    return kernel_facts(kernel_dir, ("kernel.json", runs))


class _Kernel:
    """One kernel directory, launchable on a backend: the launch facts and a `launch(grid, args)`.
    `facts`: its kernel.json when the caller has just checked the directory (`load_kernel`)."""

    def __init__(self, kernel_dir: str | Path, backend: str = "cuda", facts: dict | None = None):
        self.dir, self.backend = Path(kernel_dir), checked_backend(backend)
        self.facts = facts if facts is not None else _launch_facts(self.dir, backend)
        self.m, self.k = self.facts["m"], self.facts["k"]
        self.conv = self.facts.get("conv")
        self.layout = LaunchLayout.of_facts(self.facts)  # the one launch description (kernel.json `launch`)
        self.dtype = (self.facts.get("precision") or {}).get("dtype", "fp32")  # B's and C's: fp32, fp16 or bf16
        self.n1 = self.layout.threads
        if backend == "cuda":
            from lospmm.runtime import LoadedKernel

            self._kernel = LoadedKernel((self.dir / "kernel.cubin").read_bytes(), self.facts["kernel"])
        else:
            f = self.facts
            self._source = KernelSource(f["kernel"], "conv" if self.conv else "full",
                                        ((self.dir / "kernel.cu").read_text(encoding="utf-8"),),
                                        tuple(f["params"]), f["m"], f["k"], f["m1"], self.layout, 0, design_of_facts(f))

    def _launch(self, columns: int, inputs, output, count):
        """Launch over `columns` GEMM columns: `inputs` (pointer arg, array), `output` (pointer arg,
        array), `count` (int arg name, value). A kernel that computes several columns per thread
        runs on copies padded to its column multiple (and aligned) where the arrays are not."""
        layout = self.layout
        if self.backend == "cuda":
            (_, x), (_, y) = inputs, output
            launched = layout.launch_columns(columns)
            width = (4 if self.dtype == "fp32" else 2) * layout.columns_per_thread
            if launched != columns or any(_array_info(a, False, self.dtype)[0] % width for a in (x, y)):
                return self._launch_padded(columns, launched, x, y)
            x_ptr, stream = _array_info(x, True, self.dtype)
            y_ptr, _ = _array_info(y, False, self.dtype)
            self._kernel.launch(layout.grid(columns), layout.block(), [("ptr", x_ptr), ("ptr", y_ptr),
                                                                       ("int", count[1])], 0, stream)
            return y
        from lospmm.hostemu import gemm_on_host, half_gemm_on_host, run_on_host

        (x_name, x), (y_name, y) = inputs, output
        if self.dtype != "fp32":  # a half kernel: its arrays' 16-bit patterns through the host emulation
            got = half_gemm_on_host(self._source, _host_bits(x, self.dtype)).reshape(y.shape)
            if _library(y) == "torch":
                y.copy_(_torch_of_bits(got, self.dtype))
            else:
                y[...] = got.view(np.float16)
            return y
        host_x = _host_array(x)
        if self.conv:
            got = run_on_host(self._source, {x_name: host_x.ravel(), y_name: np.empty(int(np.prod(y.shape)), np.float32),
                                             count[0]: count[1]}, layout.grid(columns), layout.block())[y_name]
        else:
            got = gemm_on_host(self._source, host_x)
        got = got.reshape(y.shape)
        if _library(y) == "torch":
            import torch

            y.copy_(torch.from_numpy(got))
        else:
            y[...] = got
        return y

    def _launch_padded(self, columns: int, launched: int, b, c):
        """A GEMM kernel's launch on fresh K×`launched` and M×`launched` copies (zero columns past
        `columns`), the result copied back into `c`."""
        padded_b = self._zeros(b, (self.k, launched))
        padded_b[:, :columns] = b
        padded_c = self._empty(b, (self.m, launched))
        self._launch(launched, ("B", padded_b), ("C", padded_c), ("N", launched))
        c[...] = padded_c[:, :columns]
        return c

    def _named(self, call):
        try:
            return call()
        except (ValueError, TypeError) as e:  # an array the kernel cannot take: say which layer's
            raise type(e)(f"{self.facts['layer']}: {e}") from None

    def _empty(self, like, shape):
        return self._allocated(like, shape, "empty")

    def _zeros(self, like, shape):
        return self._allocated(like, shape, "zeros")

    @staticmethod
    def _allocated(like, shape, how: str):
        """An array of the library, device and dtype of `like` (B: the kernel's dtype, checked at launch)."""
        if _library(like) == "torch":
            import torch

            return getattr(torch, how)(shape, dtype=like.dtype, device=like.device)
        if _library(like) == "cupy":
            import cupy

            return getattr(cupy, how)(shape, dtype=like.dtype)
        return getattr(np, how)(shape, like.dtype)


class SpMM(_Kernel):
    """The emitted GEMM kernel of one layer: `spmm(B)` -> C with C = A·B, A baked in (M×K), through
    the epilogue kernel.json's `epilogue` records (a bias per row and an activation), if any."""

    def __call__(self, b, out=None):
        if tuple(b.shape[:1]) != (self.k,) or b.ndim != 2:
            raise ValueError(f"{self.facts['layer']}: B must be {self.k}×N, got {tuple(b.shape)}")
        n = int(b.shape[1])
        out = self._empty(b, (self.m, n)) if out is None else out
        return self._named(lambda: self._launch(n, ("B", b), ("C", out), ("N", n)))


class SpConv(_Kernel):
    """The emitted implicit-im2col kernel of one convolution: `conv(X)` -> Y, X NCHW float32 of
    the input size it was emitted for (any batch), Y NCHW; no bias or activation unless kernel.json's
    `epilogue` says it was fused."""

    def __call__(self, x, out=None):
        g = self.conv
        if x.ndim != 4 or tuple(x.shape[1:]) != (g["cin"], g["h"], g["w"]):
            raise ValueError(f"{self.facts['layer']}: X must be batch×{g['cin']}×{g['h']}×{g['w']} (NCHW; the input "
                             f"size the kernel was searched and emitted for), got {tuple(x.shape)}")
        batch = int(x.shape[0])
        out = self._empty(x, (batch, self.m, g["h_out"], g["w_out"])) if out is None else out
        return self._named(lambda: self._launch(batch * g["h_out"] * g["w_out"], ("X", x), ("Y", out), ("batch", batch)))


def load_kernel(kernel_dir: str | Path, backend: str = "cuda") -> SpMM | SpConv:
    """The callable for one kernel directory: SpMM for a GEMM kernel, SpConv for an implicit-im2col
    convolution kernel (kernel.json has `conv`). `backend`: `cuda` or `host` (see the module doc)."""
    facts = _launch_facts(kernel_dir, backend)
    return (SpConv if facts.get("conv") else SpMM)(kernel_dir, backend, facts)


def _library(x) -> str:
    """The top-level package of an array's type: "torch", "cupy", "numpy", …"""
    return type(x).__module__.split(".")[0]


def _host_array(x) -> np.ndarray:
    if _library(x) == "torch":
        if x.device.type != "cpu":
            raise ValueError("the host backend takes CPU tensors")
        x = x.detach().numpy()
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise ValueError(f"need a float32 numpy array or torch CPU tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    return np.ascontiguousarray(x)


def _host_bits(x, dtype: str) -> np.ndarray:
    """The 16-bit patterns (uint16) of a half kernel's CPU array: a numpy float16 array (fp16) or a
    torch CPU tensor of the kernel's dtype; anything else is refused (no silent conversion)."""
    if _library(x) == "torch":
        import torch

        want = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
        if x.device.type != "cpu" or x.dtype != want:
            raise ValueError(f"the host backend takes a CPU tensor of the kernel's dtype {want}, got {x.dtype} on "
                             f"{x.device}")
        return np.ascontiguousarray(x.detach().contiguous().view(torch.int16).numpy().view(np.uint16))
    if dtype == "fp16" and isinstance(x, np.ndarray) and x.dtype == np.float16:
        return np.ascontiguousarray(x).view(np.uint16)
    raise ValueError(f"need a {'float16 numpy array or ' if dtype == 'fp16' else ''}torch CPU tensor of the kernel's "
                     f"dtype {dtype}, got {getattr(x, 'dtype', type(x).__name__)}")


def _torch_of_bits(bits: np.ndarray, dtype: str):
    import torch

    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(
        {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype])


def _array_info(x, with_stream: bool = True, dtype: str = "fp32"):
    """(device pointer, stream handle or None) of a C-contiguous CuPy or torch CUDA array of the
    kernel's `dtype` (fp32, fp16 or bf16: no silent conversion)."""
    mod = _library(x)
    if mod == "torch":
        import torch

        want = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
        if not x.is_cuda or x.dtype != want or not x.is_contiguous():
            raise ValueError(f"need a contiguous {str(want).removeprefix('torch.')} CUDA tensor, got {x.dtype} on "
                             f"{x.device}")
        if x.device.index not in (None, 0):  # kernels are loaded in device 0's primary context
            raise ValueError(f"kernels run on cuda:0, got a tensor on {x.device}")
        return x.data_ptr(), torch.cuda.current_stream(x.device).cuda_stream if with_stream else None
    if mod == "cupy":
        import cupy

        want = {"fp32": cupy.float32, "fp16": cupy.float16}.get(dtype)
        if want is None or x.dtype != want or not x.flags.c_contiguous:
            raise ValueError(f"need a C-contiguous {dtype} CuPy array" + (" (CuPy has no bfloat16: use torch)"
                                                                         if dtype == "bf16" else ""))
        return x.data.ptr, cupy.cuda.get_current_stream().ptr if with_stream else None
    raise TypeError(f"expected a CuPy array or a torch CUDA tensor, got {type(x).__name__}")
