"""Reading real weights from a safetensors file (numpy API, no torch)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lospmm.stages.extract import TensorInfo


class WeightsFileError(ValueError):
    """A weights file is missing or unreadable; the message names it."""


def tensor_infos(path: str | Path) -> list[TensorInfo]:
    """Name, shape and dtype of every tensor, from the header only; WeightsFileError names the file."""
    from safetensors import safe_open

    p = Path(path)
    if not p.is_file():
        raise WeightsFileError(f"weights file {p} does not exist or is not a file")
    try:
        with safe_open(str(p), framework="np") as f:
            out = []
            for name in f.keys():
                sl = f.get_slice(name)
                out.append(TensorInfo(name, tuple(int(d) for d in sl.get_shape()), str(sl.get_dtype())))
            return out
    except Exception as e:  # safetensors raises its own error types for a bad header
        raise WeightsFileError(f"weights file {p} is not a readable safetensors file: {e}") from None


def load_tensor(path: str | Path, name: str) -> np.ndarray:
    """One tensor as numpy; an unsupported dtype (e.g. bf16) raises ValueError naming it."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            return f.get_tensor(name)
    except Exception as e:
        raise ValueError(f"{name}: cannot load tensor from {path}: {e}") from None
