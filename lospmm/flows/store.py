"""Artifact store: content keys, stage code versions, atomic Parquet writes with checksums.

An artifact is `<root>/<NN_layer>/<label>-<key16>.parquet` plus a sidecar `.json` holding its
SHA-256, row count and key. The sidecar is written after the Parquet file, both by temp file +
rename, so a present sidecar whose checksum matches means a whole, trusted artifact.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

# Numbered as in the design's DAG; 05 (rank) is not implemented yet.
STAGE_LAYERS = {
    "extract": "01_shapes",
    "prune": "02_pruned",
    "reorder": "03_reordered",
    "constrain": "04_candidates",
    "rank": "05_ranked",
    "cluster": "06_clusters",
    "pad": "07_launch",
    "compile": "08_compiled",
    "time": "09_timed",
    "emit": "10_kernels",
}
STAGES = tuple(STAGE_LAYERS)
# The modules whose source is a stage's code version (imports under lospmm.stages follow).
STAGE_MODULES = {s: (f"lospmm.stages.{s}",) for s in STAGES}
STAGE_MODULES["compile"] = ("lospmm.stages.compile", "lospmm.stages.codegen", "lospmm.hostemu")
STAGE_MODULES["time"] = ("lospmm.stages.timing", "lospmm.runtime")
STAGE_MODULES["emit"] = ("lospmm.stages.codegen", "lospmm.stages.compile", "lospmm.stages.timing", "lospmm.hostemu",
                         "lospmm.runtime", "lospmm.flows.kernels")


class ArtifactError(RuntimeError):
    """An artifact is missing, truncated, or does not match its checksum."""


def stage_version(stage: str) -> str:
    """Hash of the stage module's source and of every lospmm.stages module it imports."""
    return hashlib.sha256("".join(module_closure_hash(m) for m in STAGE_MODULES[stage]).encode()).hexdigest()[:16]


@lru_cache(maxsize=None)
def module_closure_hash(module_name: str, prefix: str = "lospmm.stages") -> str:
    """Hash of a module's source and, transitively, of the modules under `prefix` it imports."""
    seen: dict[str, str] = {}
    todo = [module_name]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        source = inspect.getsource(importlib.import_module(name))
        seen[name] = source
        todo.extend(_imports_under(prefix, source, name))
    h = hashlib.sha256()
    for name in sorted(seen):
        h.update(name.encode() + b"\0" + seen[name].encode() + b"\0")
    return h.hexdigest()[:16]


def _imports_under(prefix: str, source: str, module_name: str) -> Iterable[str]:
    package = module_name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                base = f"{package}.{base}" if base else package
            if base.startswith(prefix):
                yield base
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(prefix):
                    yield alias.name


def artifact_key(stage: str, version: str, params: dict[str, Any], inputs: Iterable[str] = ()) -> str:
    """The artifact's identity: stage, its code version, its parameters and its inputs' keys."""
    blob = json.dumps(
        {"stage": stage, "version": version, "params": params, "inputs": list(inputs)},
        sort_keys=True, default=str, separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def artifact_path(root: str | Path, stage: str, label: str, key: str) -> Path:
    return Path(root) / STAGE_LAYERS[stage] / f"{label}-{key[:16]}.parquet"


def sidecar_path(path: Path) -> Path:
    return path.with_suffix(".json")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_artifact(path: Path, table: pa.Table, meta: dict[str, Any]) -> dict[str, Any]:
    """Atomically write `table` to `path` and its sidecar; return the sidecar's contents."""
    path.parent.mkdir(parents=True, exist_ok=True)
    schema_meta = {b"lospmm": json.dumps(meta, default=str).encode()}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **schema_meta})
    atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
    side = {**meta, "rows": table.num_rows, "bytes": path.stat().st_size, "sha256": file_sha256(path)}
    atomic_write(sidecar_path(path), lambda tmp: Path(tmp).write_text(json.dumps(side, indent=1, default=str)))
    return side


def valid_sidecar(path: Path) -> dict[str, Any] | None:
    """The sidecar of a whole, uncorrupted artifact at `path`, else None."""
    side = sidecar_path(path)
    try:
        meta = json.loads(side.read_text())
        if path.stat().st_size != meta["bytes"] or file_sha256(path) != meta["sha256"]:
            return None
        return meta
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_artifact(path: str | Path, columns: list[str] | None = None) -> pa.Table:
    """Read a checked artifact; ArtifactError names the file if it is missing or corrupt."""
    path = Path(path)
    if valid_sidecar(path) is None:
        raise ArtifactError(f"artifact {path} is missing, truncated or fails its checksum")
    return pq.read_table(path, columns=columns)


def atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
