"""Reading real weights from a safetensors file, or a sharded checkpoint (Hugging Face's layout: the
shards and their `model.safetensors.index.json`), as one model (numpy API, no torch)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

from lospmm.files import file_sha256, stream_sha256
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
            if sha256 and self.sha256() != sha256:
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
            short = self._cut_short()
            if short:
                raise WeightsFileError(short)
        except BaseException:
            self._file.close()
            raise

    def _cut_short(self) -> str:
        """Why the file cannot hold the tensors its header lists ("" when it can): its last tensor's
        bytes run past the file's end, as an interrupted copy or download leaves it (the header is
        whole, so every tensor is listed; only reading the last ones would find out, after the work)."""
        ends = []
        for name, entry in self.header.items():
            try:
                ends.append((self._data + int(entry["data_offsets"][1]), name))
            except (KeyError, TypeError, ValueError, IndexError):  # an unreadable entry: its tensor's read says so
                continue
        end, name = max(ends, default=(0, ""))
        if end <= self._stat.st_size:
            return ""
        return (f"weights file {self.path} is cut short: {self._stat.st_size:,} bytes, where its header puts tensor "
                f"{name} up to byte {end:,} (an interrupted copy or download?)")

    def infos(self) -> list[TensorInfo]:
        """Name, shape and dtype of every tensor (the header's order)."""
        return [TensorInfo(name, tuple(int(d) for d in entry["shape"]), entry["dtype"])
                for name, entry in self.header.items() if name != "__metadata__"]

    def metadata(self) -> dict:
        return self.header.get("__metadata__") or {}

    def sha256(self) -> str:
        """The open file's SHA-256 (what a path replaced since cannot change)."""
        self._file.seek(0)
        return stream_sha256(self._file)

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


INDEX_SUFFIX = ".safetensors.index.json"  # a sharded checkpoint's index: model.safetensors.index.json


class ShardedWeights:
    """A sharded checkpoint opened once as one model: its index (`weight_map`: each tensor's shard) read,
    every shard opened as a WeightsFile (their headers checked against the index, each shard's fit
    too). The same reads as WeightsFile: infos (the shards' tensors, in the index's shard order),
    metadata (the first shard's), tensor (read from its shard). With `sha256` (weights_sha256 of the
    index), the shards opened must be the ones the run planned with: hashed through the open files;
    closing checks none was edited meanwhile. A context manager."""

    def __init__(self, index: str | Path, sha256: str = ""):
        self.path = Path(index)
        raw, self._where = _index_of(self.path)
        self._shards: dict[str, WeightsFile] = {}
        self._open = ExitStack()  # the shards, closed as WeightsFile closes: checked unless an error is under way
        try:
            for shard in dict.fromkeys(self._where.values()):
                file = self.path.parent / shard
                if not file.is_file():
                    listed = [t for t, s in self._where.items() if s == shard]
                    raise WeightsFileError(f"weights index {self.path}: its shard {shard} ({len(listed)} tensors, "
                                           f"{listed[0]} first) is missing")
                self._shards[shard] = self._open.enter_context(WeightsFile(file))
            for name, shard in self._where.items():
                if not isinstance(self._shards[shard].header.get(name), dict):
                    raise WeightsFileError(f"weights index {self.path}: it puts tensor {name} in {shard}, whose header "
                                           f"lacks it (shards from another checkpoint?)")
            if sha256 and _sharded_digest(raw, {s: f.sha256() for s, f in self._shards.items()}) != sha256:
                raise WeightsChanged(f"{self.path}: the weights changed since the run started (the SHA-256 of the index "
                                     f"and its shards is not the one the run planned with); run again")
        except BaseException:
            self._open.__exit__(*sys.exc_info())
            raise

    def infos(self) -> list[TensorInfo]:
        return [t for shard, f in self._shards.items() for t in f.infos() if self._where.get(t.name) == shard]

    def metadata(self) -> dict:
        return next(iter(self._shards.values())).metadata()

    def tensor(self, name: str) -> np.ndarray:
        shard = self._where.get(name)
        if shard is None:
            raise ValueError(f"{name}: no such tensor in {self.path}")
        return self._shards[shard].tensor(name)

    def close(self) -> None:
        """Close every shard, each checked unedited (a shard found edited is raised, the others closed)."""
        self._open.close()

    def __enter__(self) -> "ShardedWeights":
        return self

    def __exit__(self, kind, error, tb) -> None:
        self._open.__exit__(kind, error, tb)


def _index_of(index: Path) -> tuple[bytes, dict[str, str]]:
    """A sharded checkpoint's index: its bytes and its weight_map (tensor -> shard file, beside the
    index); WeightsFileError naming the index when it cannot be read as one."""
    try:
        raw = index.read_bytes()
        weight_map = json.loads(raw).get("weight_map")
    except (OSError, ValueError, AttributeError) as e:
        raise WeightsFileError(f"weights index {index} is not readable as a sharded checkpoint's index: {e}") from None
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise WeightsFileError(f"weights index {index}: its weight_map names no tensors in shards (a JSON object of "
                               f"tensor name -> shard file is expected)")
    outside = next((v for v in weight_map.values() if Path(v).name != v), None)
    if outside:
        raise WeightsFileError(f"weights index {index}: shard {outside} is not a file beside the index")
    return raw, weight_map


def _sharded_digest(index: bytes, shards: dict[str, str]) -> str:
    """One SHA-256 for a sharded checkpoint: its index's bytes and each shard's SHA-256, by name."""
    blob = json.dumps({"index": hashlib.sha256(index).hexdigest(), "shards": shards}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def weights_file(path: str | Path) -> Path:
    """What --weights names, as the file to open: a safetensors file or an index as given; a folder,
    its one index (a sharded checkpoint) or else its one safetensors file. WeightsFileError names a
    folder holding neither or several."""
    path = Path(path)
    if not path.is_dir():
        if path.name.endswith(".index.json") and not path.name.endswith(INDEX_SUFFIX):
            raise WeightsFileError(f"weights index {path}: the index of a torch checkpoint's shards (torch.save files), "
                                   f"not of safetensors ones: give a safetensors checkpoint (its folder or "
                                   f"model{INDEX_SUFFIX}), or search the model with lospmm.torch")
        return path
    indexes = sorted(p for p in path.iterdir() if p.name.endswith(INDEX_SUFFIX))
    files = sorted(p for p in path.iterdir() if p.suffix == ".safetensors")
    if len(indexes) == 1 or (not indexes and len(files) == 1):
        return (indexes or files)[0]
    found = [p.name for p in (indexes or files)]
    others = sorted(p.name for p in path.iterdir() if p.suffix == ".onnx" or p.name.endswith(".index.json"))[:3]
    raise WeightsFileError(f"weights folder {path}: " + (
        f"{len(found)} safetensors files ({', '.join(found[:3])}{', ...' if len(found) > 3 else ''}) and no "
        f"index ({'model' + INDEX_SUFFIX}) to join them: give one file, or the index of a sharded checkpoint"
        if found and not indexes else f"{len(found)} indexes ({', '.join(found)}): give the one to search"
        if indexes else "no safetensors file or index in it" + (
            f"; give the file to read ({', '.join(others)})" if others else "")))


def open_weights(path: str | Path, sha256: str = "") -> WeightsFile | ShardedWeights:
    """The weights --weights names opened once: a safetensors file, or a sharded checkpoint (its index
    or its folder) as one model."""
    path = weights_file(path)
    return ShardedWeights(path, sha256) if path.name.endswith(INDEX_SUFFIX) else WeightsFile(path, sha256)


def weights_sha256(path: str | Path) -> str:
    """The SHA-256 a run plans with: a file's; a sharded checkpoint's over its index and every shard."""
    path = weights_file(path)
    if not path.name.endswith(INDEX_SUFFIX):
        return file_sha256(path)
    raw, where = _index_of(path)
    try:
        return _sharded_digest(raw, {s: file_sha256(path.parent / s) for s in dict.fromkeys(where.values())})
    except OSError as e:
        raise WeightsFileError(f"weights index {path}: its shard {Path(e.filename or '?').name} is not readable "
                               f"({e.strerror or type(e).__name__})") from None


def tensor_infos(path: str | Path) -> list[TensorInfo]:
    """Name, shape and dtype of every tensor, from the header only; WeightsFileError names the file."""
    with open_weights(path) as f:
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
        with open_weights(path) as f:
            return graph_of(f)
    except OSError as e:
        raise WeightsFileError(f"weights file {path} is not readable: {e}") from None


def graph_of(weights: WeightsFile | ShardedWeights) -> list[GraphWeight] | None:
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
    with open_weights(path) as f:
        return f.tensor(name)


@contextmanager
def planned_weights(path: str, sha256: str):
    """The weights file a run planned with (its SHA-256 taken then), for one stage's reads: a
    WeightsFile of it for a safetensors file (hashed through the open file, checked unedited at the
    end); for an ONNX model, None, its bytes hashed before the reads and its identity checked after
    them. WeightsChanged, one line naming the file, when it is not that file any more."""
    if Path(path).suffix.lower() != ".onnx":
        with open_weights(path, sha256) as f:
            yield f
        return
    p = Path(path)
    before = p.stat()
    with open(p, "rb") as f:
        if sha256 and stream_sha256(f) != sha256:
            raise WeightsChanged(f"{p}: the weights file changed since the run started (its SHA-256 is not the one "
                                 f"the run planned with); run again")
    yield None
    after = p.stat()
    if (after.st_ino, after.st_size, after.st_mtime_ns) != (before.st_ino, before.st_size, before.st_mtime_ns):
        raise WeightsChanged(f"{p}: the weights file was replaced or written to while the run read it; run again")
