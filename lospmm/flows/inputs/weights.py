"""Reading real weights from a safetensors file (numpy API, no torch)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from lospmm.stages.extract import GraphWeight, TensorInfo

GRAPH_METADATA = "lospmm.graph"  # written by lospmm.torch.save_model: each tensor's GEMM role and geometry


class WeightsFileError(ValueError):
    """A weights file is missing or unreadable; the message names it."""


class WeightsChanged(ValueError):
    """The weights file is not the one the run planned with (replaced or edited since): the run fails
    with this line, and nothing computed from it is kept."""


# safetensors dtype -> numpy (BF16, which numpy lacks, is widened to float32 exactly: weights_of)
_NUMPY = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
          "U8": "u1", "BOOL": "?"}


class WeightsFile:
    """A safetensors file opened once: its header parsed once, its tensors read from the one open file
    (a file of 10,000 tensors read tensor by tensor costs one header parse, not 10,000). With
    `sha256`, the file opened must be the one the run planned with: its bytes are hashed through the
    open file (so a path replaced later does not change what is read), and closing checks it was not
    edited in place meanwhile; WeightsChanged otherwise. A context manager."""

    def __init__(self, path: str | Path, sha256: str = ""):
        self.path = Path(path)
        if not self.path.is_file():
            raise WeightsFileError(f"weights file {self.path} does not exist or is not a file")
        self._file = open(self.path, "rb")
        try:
            self._stat = os.fstat(self._file.fileno())
            if sha256 and _digest(self._file) != sha256:
                raise WeightsChanged(f"{self.path}: the weights file changed since the run started (its SHA-256 is not "
                                     f"the one the run planned with); run again")
            self._file.seek(0)
            try:
                (size,) = struct.unpack("<Q", self._file.read(8))
                if size > self._stat.st_size - 8:
                    raise ValueError(f"its header claims {size:,} bytes, more than the file's {self._stat.st_size:,}")
                self.header = json.loads(self._file.read(size))
                self._data = 8 + size
                if not isinstance(self.header, dict):
                    raise ValueError("its header is not a JSON object")
            except (struct.error, ValueError, MemoryError) as e:
                raise WeightsFileError(_torch_checkpoint_hint(self.path)
                                       or f"weights file {self.path} is not a readable safetensors file: {e}") from None
        except BaseException:
            self._file.close()
            raise

    def infos(self) -> list[TensorInfo]:
        """Name, shape and dtype of every tensor (the header's order)."""
        return [TensorInfo(name, tuple(int(d) for d in entry["shape"]), entry["dtype"])
                for name, entry in self.header.items() if name != "__metadata__"]

    def metadata(self) -> dict:
        return self.header.get("__metadata__") or {}

    def tensor(self, name: str) -> np.ndarray:
        """One tensor as numpy (bfloat16 widened exactly to float32); ValueError naming it when it is
        not in the file or its bytes do not fit its shape."""
        entry = self.header.get(name)
        if not isinstance(entry, dict) or name == "__metadata__":
            raise ValueError(f"{name}: no such tensor in {self.path}")
        try:
            begin, end = (int(x) for x in entry["data_offsets"])
            dtype, shape = entry["dtype"], tuple(int(d) for d in entry["shape"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{name}: cannot load tensor from {self.path}: its header entry is unreadable ({e})") from None
        self._file.seek(self._data + begin)
        raw = self._file.read(max(end - begin, 0))
        count = int(np.prod(shape, dtype=np.int64))
        if dtype == "BF16":  # bfloat16 is the top half of a float32: shifting its bits up gives the same value
            bits = np.frombuffer(raw, dtype="<u2")
            values = (bits.astype(np.uint32) << 16).view(np.float32) if bits.size == count else None
        elif dtype in _NUMPY:
            values = np.frombuffer(raw, dtype=_NUMPY[dtype]) if len(raw) == count * np.dtype(_NUMPY[dtype]).itemsize \
                else None
        else:
            raise ValueError(f"{name}: cannot load tensor from {self.path}: dtype {dtype} is not read")
        if values is None:
            raise ValueError(f"{name}: cannot load tensor from {self.path}: {len(raw)} bytes for {dtype} {list(shape)}")
        return values.reshape(shape).copy()  # its own memory, writable, native order

    def close(self) -> None:
        """Close the file, first checking it was not edited in place while it was read."""
        if self._file.closed:
            return
        now = os.fstat(self._file.fileno())
        self._file.close()
        if (now.st_size, now.st_mtime_ns) != (self._stat.st_size, self._stat.st_mtime_ns):
            raise WeightsChanged(f"{self.path}: the weights file was written to while the run read it; run again")

    def __enter__(self) -> "WeightsFile":
        return self

    def __exit__(self, kind, error, tb) -> None:
        if kind is None:
            self.close()
        else:  # the error under way says more
            self._file.close()


def _digest(f) -> str:
    h = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
    return h.hexdigest()


def tensor_infos(path: str | Path) -> list[TensorInfo]:
    """Name, shape and dtype of every tensor, from the header only; WeightsFileError names the file."""
    with WeightsFile(path) as f:
        return f.infos()


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
            f"`lt.save_model(model, example_input, 'model.safetensors')` (each layer's geometry kept: its "
            f"convolutions are served as convolutions) and pass that file")


def saved_graph(path: str | Path) -> list[GraphWeight] | None:
    """The layer geometry `lospmm.torch.save_model` stored in a safetensors file's metadata (one
    GraphWeight per tensor of the model, searched or not), or None for a plain checkpoint."""
    try:
        with WeightsFile(path) as f:
            return graph_of(f)
    except OSError as e:
        raise WeightsFileError(f"weights file {path} is not readable: {e}") from None


def graph_of(weights: WeightsFile) -> list[GraphWeight] | None:
    """saved_graph of an opened file."""
    text = weights.metadata().get(GRAPH_METADATA)
    if text is None:
        return None
    try:
        return [GraphWeight(**w) for w in json.loads(text)]
    except (TypeError, ValueError) as e:
        raise WeightsFileError(f"weights file {weights.path}: its {GRAPH_METADATA} metadata is not readable: {e}") from None


def load_tensor(path: str | Path, name: str) -> np.ndarray:
    """One tensor as numpy (bfloat16, which numpy lacks, widened exactly to float32); a tensor that
    cannot be read raises ValueError naming it. To read many, open a WeightsFile once."""
    with WeightsFile(path) as f:
        return f.tensor(name)


@contextmanager
def planned_weights(path: str, sha256: str):
    """The weights file a run planned with (its SHA-256 taken then), for one stage's reads: a
    WeightsFile of it for a safetensors file (hashed through the open file, checked unedited at the
    end); for an ONNX model, None, its bytes hashed before the reads and its identity checked after
    them. WeightsChanged, one line naming the file, when it is not that file any more."""
    if Path(path).suffix.lower() != ".onnx":
        with WeightsFile(path, sha256) as f:
            yield f
        return
    p = Path(path)
    before = p.stat()
    with open(p, "rb") as f:
        if sha256 and _digest(f) != sha256:
            raise WeightsChanged(f"{p}: the weights file changed since the run started (its SHA-256 is not the one "
                                 f"the run planned with); run again")
    yield None
    after = p.stat()
    if (after.st_ino, after.st_size, after.st_mtime_ns) != (before.st_ino, before.st_size, before.st_mtime_ns):
        raise WeightsChanged(f"{p}: the weights file was replaced or written to while the run read it; run again")
