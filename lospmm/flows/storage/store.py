"""Artifact store: content keys, module source hashes (stage code versions), atomic Parquet
writes with checksums.

An artifact is `<root>/<NN_layer>/<label>-<key16>.parquet` plus a sidecar `.json` holding its
SHA-256, row count and key. The sidecar is written after the Parquet file, both by temp file +
rename, so a present sidecar whose checksum matches means a whole, trusted artifact.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import importlib
import importlib.util
import json
import os
import socket
import sys
import threading
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from lospmm.files import atomic_write, file_sha256, manifest_problem
from lospmm.stages import STAGE_LAYERS


class ArtifactError(RuntimeError):
    """An artifact is missing, truncated, or does not match its checksum: `path` is the artifact,
    `reason` what is wrong with it, naming the file at fault (artifact_problem)."""

    def __init__(self, message: str, path: Path | None = None, reason: str = ""):
        super().__init__(message)
        self.path, self.reason = path, reason


def module_closure(module_name: str, prefix: str = "lospmm", skip: tuple[str, ...] = ()) -> dict[str, str]:
    """The code of a module (_code_and_imports, with the files it reads as code) and, transitively, of every
    module under `prefix` it imports (at module level or inside functions), except those in `skip`.
    Read from the files, not imported (only a module declaring `__code_files__` is, to read that list):
    the version of code that needs Prefect or a GPU library is known without them (the device program
    hashes a bundle's code on a machine without Prefect)."""
    seen: dict[str, str] = {}
    todo = [module_name]
    while todo:
        name = todo.pop()
        if name in seen or name in skip:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None:
            raise ModuleNotFoundError(f"no module named {name!r}", name=name)
        source = _source(spec)
        code, imports = _code_and_imports(prefix, source, name, spec.submodule_search_locations is not None)
        seen[name] = code + (_code_files(importlib.import_module(name)) if "__code_files__" in source else "")
        todo.extend(imports)
    return seen


class _WithoutDocstrings(ast.NodeTransformer):
    """Drops every statement that is a string alone (docstrings, and strings written as comments)."""

    def generic_visit(self, node):
        super().generic_visit(node)
        for field_name in ("body", "orelse", "finalbody"):
            body = getattr(node, field_name, None)
            if isinstance(body, list) and body and all(isinstance(s, ast.stmt) for s in body):
                kept = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                                and isinstance(s.value.value, str))]
                if not kept and field_name == "body" and not isinstance(node, ast.Module):
                    kept = [ast.Pass()]  # a function of a docstring alone is a function that passes
                setattr(node, field_name, kept)
        return node


@lru_cache(maxsize=4096)  # every stage's closure holds most modules: each is parsed and dumped once a process
def _code_and_imports(prefix: str, source: str, module_name: str, is_package: bool) -> tuple[str, tuple[str, ...]]:
    """A module's code as its version sees it, and the modules under `prefix` it imports. The code is its
    syntax tree without docstrings, so comments, docstrings and layout are not in it: editing what only a
    reader sees then keeps every artifact's cache key and every prepared GPU bundle; editing what runs
    changes them."""
    tree = ast.parse(source)  # once: the imports are read before the docstrings are dropped from it
    imports = tuple(_each_import_under(prefix, tree, module_name, is_package))
    return ast.dump(_WithoutDocstrings().visit(tree)), imports


@lru_cache(maxsize=None)
def module_closure_hash(module_name: str, prefix: str = "lospmm", skip: tuple[str, ...] = ()) -> str:
    """Hash of `module_closure`: changes when any of those modules' code does."""
    seen = module_closure(module_name, prefix, skip)
    h = hashlib.sha256()
    for name in sorted(seen):
        h.update(name.encode() + b"\0" + seen[name].encode() + b"\0")
    return h.hexdigest()[:16]


def _each_import_under(prefix: str, tree: ast.Module, module_name: str, is_package: bool) -> Iterable[str]:
    package = module_name if is_package else module_name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                base = f"{package}.{base}" if base else package
            if base == prefix or base.startswith(prefix + "."):
                yield base
                if _is_package(base):  # `from lospmm.flows.storage import schemas` imports a module too
                    for alias in node.names:
                        if importlib.util.find_spec(f"{base}.{alias.name}") is not None:
                            yield f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == prefix or alias.name.startswith(prefix + "."):
                    yield alias.name


def _source(spec) -> str:
    # the file itself, as UTF-8 whatever the process's locale (a run once saw ASCII here mid-flow
    # and failed on the `§` of a docstring)
    origin = getattr(spec, "origin", None)
    return Path(origin).read_text(encoding="utf-8") if origin and origin.endswith(".py") else ""


def _code_files(module) -> str:
    """The data files a module reads as code (`__code_files__`: the C++ a kernel's text includes), so
    that editing one changes the version of every module that imports it, as editing the module would."""
    return "".join(f"\0{Path(f).name}\0" + Path(f).read_text(encoding="utf-8")
                   for f in getattr(module, "__code_files__", ()))


def _is_package(name: str) -> bool:
    try:
        spec = importlib.util.find_spec(name)
    except ImportError:
        return False
    return spec is not None and spec.submodule_search_locations is not None


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


def write_artifact(path: Path, table: pa.Table, meta: dict[str, Any]) -> dict[str, Any]:
    """Atomically write `table` to `path` and its sidecar; return the sidecar's contents."""
    path.parent.mkdir(parents=True, exist_ok=True)
    schema_meta = {b"lospmm": json.dumps(meta, default=str).encode()}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **schema_meta})
    atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
    side = {**meta, "rows": table.num_rows, "bytes": path.stat().st_size, "sha256": file_sha256(path)}
    text = json.dumps(side, indent=1, default=str)
    atomic_write(sidecar_path(path), lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return side


def valid_sidecar(path: Path) -> dict[str, Any] | None:
    """The sidecar of an artifact that may be reused as a cached result, else None: it is intact
    (`intact_sidecar`) and was not written incomplete (a layer failed in a way that may pass on a
    retry, so a later run computes it again)."""
    meta = intact_sidecar(path)
    return None if meta is None or meta.get("incomplete") else meta


def checked_sidecar(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(the sidecar, "") of a whole, uncorrupted artifact at `path`, else (None, why not, naming the file
    at fault: its sidecar, the file itself, or a file of a kernel directory it lists). Whole: the file
    matches its checksum and every directory it lists as attached (emit's kernel directories, relative
    to the artifact's folder) matches its manifest. An incomplete artifact is whole: its own run reads
    it (the summary names the layers that failed) but never reuses it."""
    path = Path(path)
    side = sidecar_path(path)
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
    except OSError:
        return None, (f"{path} is missing" if not path.exists() else f"its sidecar {side.name} is missing")
    except ValueError:
        return None, f"its sidecar {side.name} is not readable JSON"
    if not path.exists():
        return None, f"{path} is missing"
    try:
        if path.stat().st_size != meta["bytes"] or file_sha256(path) != meta["sha256"]:
            return None, f"{path.name} does not match its checksum (truncated or edited)"
        for directory, digest in meta.get("attachments", {}).items():
            problem = manifest_problem(path.parent / directory, digest)
            if problem:  # the kernel directory's file, named from the artifact's folder
                return None, problem.replace(f"{path.parent}/", "")
    except (OSError, KeyError, TypeError, AttributeError) as e:
        return None, f"its sidecar {side.name} is not one lospmm wrote ({type(e).__name__}: {e})"
    return meta, ""


def intact_sidecar(path: Path) -> dict[str, Any] | None:
    """The sidecar of a whole, uncorrupted artifact at `path`, else None (checked_sidecar says why)."""
    return checked_sidecar(path)[0]


def artifact_problem(path: str | Path) -> str:
    """Why the artifact at `path` cannot be trusted, naming the file at fault ("" when it is whole)."""
    return checked_sidecar(Path(path))[1]


def read_artifact(path: str | Path, columns: list[str] | None = None) -> pa.Table:
    """Read a checked artifact; ArtifactError names the file and what is wrong with it if it is missing
    or corrupt."""
    path = Path(path)
    meta, why = checked_sidecar(path)
    if meta is None:
        raise ArtifactError(f"artifact {path}: {why}", path, why)
    return pq.read_table(path, columns=columns)


def _holder_line() -> str:
    """What a lock's holder writes into its lock file: its process, host, thread and command, and when."""
    command = " ".join(Path(sys.argv[0]).name if i == 0 else a for i, a in enumerate(sys.argv[:6])) if sys.argv else ""
    return (f"pid {os.getpid()} on {socket.gethostname()} (thread {threading.current_thread().name}, "
            f"{command or 'python'}) since {time.strftime('%H:%M:%S')}\n")


def lock_holder(lock: Path) -> str:
    """Who holds (or last held) the lock file `lock`, as its holder wrote it; "" when unknown."""
    try:
        return lock.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


@contextmanager
def locked(path: Path, check=None, poll_s: float = 0.2, waiting=None, note_after_s: float = 10.0):
    """An exclusive lock on `path` (a `.lock` file beside it) across threads and processes: two runs,
    or two tasks of one run, that reach the same artifact or compile key compute it once. The holder
    writes who it is into the lock file (lock_holder); while waiting, `check()` is called every
    `poll_s` (it raises to give up, e.g. when the run is stopped), and after `note_after_s` seconds
    `waiting(line)` once, with the line naming the holder: a second run on the same artifacts seems
    to hang otherwise."""
    lock = path.with_name(f".{path.name}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as f:
        start, noted = time.monotonic(), waiting is None
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if check is not None:
                    check()
                if not noted and time.monotonic() - start >= note_after_s:
                    noted = True
                    waiting(f"waiting for {path.name}: {lock_holder(lock) or 'another holder'} has it (a run or "
                            f"task computing the same key; it is reused once done)")
                time.sleep(poll_s)
        try:
            f.seek(0)
            f.truncate()
            f.write(_holder_line())
            f.flush()
        except OSError:  # who holds it is a courtesy: a full disk must not fail the lock
            pass
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
