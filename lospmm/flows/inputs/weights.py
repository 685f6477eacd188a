"""Reading real weights from a safetensors file (numpy API, no torch)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from lospmm.stages.extract import GraphWeight, TensorInfo

GRAPH_METADATA = "lospmm.graph"  # written by lospmm.torch.save_model: each tensor's GEMM role and geometry


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
        raise WeightsFileError(_torch_checkpoint_hint(p) or f"weights file {p} is not a readable safetensors file: "
                                                            f"{e}") from None


TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def _torch_checkpoint_hint(p: Path) -> str:
    """One line for a file that is no safetensors but looks like torch.save's output (its suffix, or
    the zip or pickle magic it starts with), saying what to give instead; "" for any other file."""
    try:
        with open(p, "rb") as f:
            head = f.read(2)
    except OSError:
        head = b""
    # torch.save writes a zip archive (PK\x03\x04) since 1.6, a protocol-2+ pickle (0x80, 2..5) before
    pickled = head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05")
    if not (p.suffix.lower() in TORCH_SUFFIXES or head == b"PK" or pickled):
        return ""
    return (f"weights file {p} looks like a torch checkpoint (torch.save), not safetensors: search the model with "
            f"`import lospmm.torch as lt; lt.search(model, example_input)`, or save its weights with "
            f"`safetensors.torch.save_file(model.state_dict(), 'model.safetensors')` and pass that file")


def saved_graph(path: str | Path) -> list[GraphWeight] | None:
    """The layer geometry `lospmm.torch.save_model` stored in a safetensors file's metadata (one
    GraphWeight per tensor of the model, searched or not), or None for a plain checkpoint."""
    try:
        text = (_header(Path(path)).get("__metadata__") or {}).get(GRAPH_METADATA)
    except (OSError, ValueError, struct.error) as e:
        raise WeightsFileError(_torch_checkpoint_hint(Path(path))
                               or f"weights file {path} is not a readable safetensors file: {e}") from None
    if text is None:
        return None
    try:
        return [GraphWeight(**w) for w in json.loads(text)]
    except (TypeError, ValueError) as e:
        raise WeightsFileError(f"weights file {path}: its {GRAPH_METADATA} metadata is not readable: {e}") from None


def load_tensor(path: str | Path, name: str) -> np.ndarray:
    """One tensor as numpy (bfloat16, which numpy lacks, widened exactly to float32); a tensor that
    cannot be read raises ValueError naming it."""
    from safetensors import safe_open

    try:
        if _header(Path(path)).get(name, {}).get("dtype") == "BF16":
            return _bfloat16_as_float32(Path(path), name)
        with safe_open(str(path), framework="np") as f:
            return f.get_tensor(name)
    except (OSError, MemoryError):  # may pass on a retry: not the tensor's fault
        raise
    except Exception as e:
        raise ValueError(f"{name}: cannot load tensor from {path}: {e}") from None


def _header(path: Path) -> dict:
    """The safetensors header: 8 bytes of little-endian length, then that much JSON."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(size))


def _bfloat16_as_float32(path: Path, name: str) -> np.ndarray:
    # bfloat16 is the top half of a float32: shifting its bits up gives the same value exactly
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        entry = json.loads(f.read(size))[name]
        begin, end = entry["data_offsets"]
        f.seek(8 + size + begin)
        raw = np.frombuffer(f.read(end - begin), dtype="<u2")
    if raw.size != int(np.prod(entry["shape"], dtype=np.int64)):
        raise ValueError(f"{name}: {raw.size} bfloat16 values for shape {entry['shape']}")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])
