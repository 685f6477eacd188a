"""The array libraries a kernel is served on, in one place: torch tensors (CPU or CUDA), CuPy
arrays and numpy arrays, each checked against the kernel's dtype (never converted silently) and
turned into what a backend runs on (device pointers, or numpy arrays in the format's element type:
float32, or a half format's 16-bit patterns)."""

from __future__ import annotations

import numpy as np

from lospmm.kernel.numbers import NumberFormat


def library(x) -> str:
    """The top-level package of an array's type: "torch", "cupy", "numpy", …"""
    return type(x).__module__.split(".")[0]


def torch_dtype(dtype: str):
    """The torch dtype of a number format's dtype: fp32, fp16 or bf16."""
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]


def device_pointer(x, dtype: str, with_stream: bool = True):
    """(device pointer, stream handle or None) of a C-contiguous CuPy or torch CUDA array of the
    kernel's `dtype` (fp32, fp16 or bf16: no silent conversion)."""
    mod = library(x)
    if mod == "torch":
        import torch

        want = torch_dtype(dtype)
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


def host_array(x, number: NumberFormat) -> np.ndarray:
    """A CPU array as the host backend runs on it: float32 values (a float32 numpy array or torch CPU
    tensor), or a half format's 16-bit patterns (a torch CPU tensor of its dtype, or numpy float16 for
    fp16); anything else is refused by name."""
    if not number.is_half:
        if library(x) == "torch":
            if x.device.type != "cpu":
                raise ValueError("the host backend takes CPU tensors")
            x = x.detach().numpy()
        if not isinstance(x, np.ndarray) or x.dtype != np.float32:
            raise ValueError(f"need a float32 numpy array or torch CPU tensor, got {getattr(x, 'dtype', type(x).__name__)}")
        return np.ascontiguousarray(x)
    dtype = number.dtype
    if library(x) == "torch":
        import torch

        want = torch_dtype(dtype)
        if x.device.type != "cpu" or x.dtype != want:
            raise ValueError(f"the host backend takes a CPU tensor of the kernel's dtype {want}, got {x.dtype} on "
                             f"{x.device}")
        return np.ascontiguousarray(x.detach().contiguous().view(torch.int16).numpy().view(np.uint16))
    if dtype == "fp16" and isinstance(x, np.ndarray) and x.dtype == np.float16:
        return np.ascontiguousarray(x).view(np.uint16)
    raise ValueError(f"need a {'float16 numpy array or ' if dtype == 'fp16' else ''}torch CPU tensor of the kernel's "
                     f"dtype {dtype}, got {getattr(x, 'dtype', type(x).__name__)}")


def stored(y, values: np.ndarray, number: NumberFormat):
    """The host backend's output `values` (float32, or 16-bit patterns) written into `y` (a torch
    CPU tensor or numpy array of the kernel's dtype); returns `y`."""
    values = values.reshape(y.shape)
    if library(y) == "torch":
        import torch

        if number.is_half:
            y.copy_(torch.from_numpy(np.ascontiguousarray(values).view(np.int16)).view(torch_dtype(number.dtype)))
        else:
            y.copy_(torch.from_numpy(np.ascontiguousarray(values)))
    else:
        y[...] = values.view(np.float16) if number.is_half else values
    return y


def allocated(like, shape, how: str = "empty"):
    """An array of the library, device and dtype of `like`: `how` is "empty" or "zeros"."""
    if library(like) == "torch":
        import torch

        return getattr(torch, how)(shape, dtype=like.dtype, device=like.device)
    if library(like) == "cupy":
        import cupy

        return getattr(cupy, how)(shape, dtype=like.dtype)
    return getattr(np, how)(shape, like.dtype)
