"""Use an emitted kernel from Python: `load_kernel(dir)` returns C = A·B for CuPy or PyTorch CUDA
arrays (B: K×N float32, any N), and `SparseLinear` is a drop-in for a pruned `nn.Linear` built on it.
torch and cupy are optional extras (`pip install lospmm[torch]` or `[cupy]`)."""

from __future__ import annotations

import json
from pathlib import Path


class KernelDirError(ValueError):
    """A kernel directory is missing a file or was not compiled; the message names it."""


class SpMM:
    """The emitted kernel of one layer: `spmm(B)` -> C with C = A·B, A baked in (M×K)."""

    def __init__(self, kernel_dir: str | Path):
        d = Path(kernel_dir)
        from lospmm.flows.store import manifest_problem

        problem = manifest_problem(d, required=("kernel.cubin", "kernel.json"))  # as emit wrote them, or nothing
        if problem:
            raise KernelDirError(f"{problem}; re-run the search (or `lospmm rerun --stage emit`) to rebuild it")
        try:
            self.facts = json.loads((d / "kernel.json").read_text(encoding="utf-8"))
            cubin = (d / "kernel.cubin").read_bytes()
        except FileNotFoundError as e:
            raise KernelDirError(f"{d}: {Path(e.filename).name} is missing (was the kernel compiled?)") from None
        from lospmm.runtime import LoadedKernel

        self.m, self.k = self.facts["m"], self.facts["k"]
        self.n1, self.grid_x = self.facts["n1"], self.facts["grid"]["x"]
        self._kernel = LoadedKernel(cubin, self.facts["kernel"])

    def __call__(self, b, out=None):
        lib, ptr, stream = _array_info(b)
        if tuple(b.shape[:1]) != (self.k,) or b.ndim != 2:
            raise ValueError(f"B must be {self.k}×N, got {tuple(b.shape)}")
        n = int(b.shape[1])
        if out is None:
            out = lib.empty((self.m, n), dtype=lib.float32, **({"device": b.device} if lib.__name__ == "torch" else {}))
        _, out_ptr, _ = _array_info(out)
        self._kernel.launch((self.grid_x, -(-n // self.n1), 1), self.n1,
                            [("ptr", ptr), ("ptr", out_ptr), ("int", n)], 0, stream)
        return out


def load_kernel(kernel_dir: str | Path) -> SpMM:
    """The callable for one kernel directory (kernel.json + kernel.cubin)."""
    return SpMM(kernel_dir)


def _array_info(x):
    """(module, device pointer, stream handle) of a C-contiguous float32 CuPy or torch CUDA array."""
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        import torch

        if not x.is_cuda or x.dtype != torch.float32 or not x.is_contiguous():
            raise ValueError("need a contiguous float32 CUDA tensor")
        return torch, x.data_ptr(), torch.cuda.current_stream(x.device).cuda_stream
    if mod == "cupy":
        import cupy

        if x.dtype != cupy.float32 or not x.flags.c_contiguous:
            raise ValueError("need a C-contiguous float32 CuPy array")
        return cupy, x.data.ptr, cupy.cuda.get_current_stream().ptr
    raise TypeError(f"expected a CuPy array or a torch CUDA tensor, got {type(x).__name__}")


def sparse_linear(kernel_dir: str | Path, bias=None):
    """A torch.nn.Module computing x @ W.T + bias with W the kernel's pruned weight (out × in)."""
    import torch

    spmm = load_kernel(kernel_dir)

    class SparseLinear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.in_features, self.out_features = spmm.k, spmm.m
            self.bias = torch.nn.Parameter(bias.detach().clone()) if bias is not None else None

        def forward(self, x):
            lead = x.shape[:-1]
            b = x.reshape(-1, self.in_features).t().contiguous()  # K×N
            y = spmm(b).t()
            if self.bias is not None:
                y = y + self.bias
            return y.reshape(*lead, self.out_features)

    return SparseLinear()
