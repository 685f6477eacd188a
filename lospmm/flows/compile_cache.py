"""Content-addressed compile cache: (source, options, NVRTC version, arch) -> PTX, cubin, log,
resource report, under `<root>/compile-cache/<key[:2]>/<key>/`. No kernel is compiled twice,
within a run or across runs (a lock per key); NVRTC's failures are cached too (the same input fails
the same way); an entry whose files fail their checksums is compiled again."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from lospmm.flows.store import atomic_write, file_sha256, locked
from lospmm.flows.taskio import stop_requested
from lospmm.stages.compile import CompileOptions, compile_key, compiled

FILES = {"source": "kernel.cu", "ptx": "kernel.ptx", "cubin": "kernel.cubin", "log": "ptxas.log"}


def cache_dir(root: str | Path, key: str) -> Path:
    return Path(root) / "compile-cache" / key[:2] / key


def cached_compile(root: str | Path, source: str, name: str, options: CompileOptions) -> tuple[dict, bool]:
    """The compile result for this source and options, and whether it came from the cache."""
    key = compile_key(source, options)
    d = cache_dir(root, key)
    with locked(d, check=stop_requested):  # two tasks or runs on one source: one compiles, the other reuses
        hit = _valid(d)
        if hit is not None:
            return hit, True
        return _compiled_into(d, root, key, source, name, options), False


def _compiled_into(d: Path, root: str | Path, key: str, source: str, name: str, options: CompileOptions) -> dict:
    out = compiled(source, name, options)
    d.mkdir(parents=True, exist_ok=True)
    blobs = {"source": source.encode(), "ptx": out.ptx, "cubin": out.cubin, "log": out.log.encode()}
    for what, data in blobs.items():
        atomic_write(d / FILES[what], lambda tmp, data=data: Path(tmp).write_bytes(data))
    result = {k: v for k, v in asdict(out).items() if k not in ("ptx", "cubin")}
    result.update(key=key, name=name, options=options.as_list(), arch=options.arch,
                  paths={w: str((d / f).relative_to(root)) for w, f in FILES.items()},
                  sha256={w: file_sha256(d / f) for w, f in FILES.items()})
    atomic_write(d / "result.json", lambda tmp: Path(tmp).write_text(json.dumps(result, indent=1), encoding="utf-8"))
    return result


def _valid(d: Path) -> dict | None:
    try:
        result = json.loads((d / "result.json").read_text(encoding="utf-8"))
        if any(file_sha256(d / FILES[w]) != sha for w, sha in result["sha256"].items()):
            return None
        return result
    except (OSError, ValueError, KeyError):
        return None
