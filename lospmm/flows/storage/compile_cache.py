"""Content-addressed compile cache: (source, options, NVRTC version, arch) -> PTX, cubin, log,
resource report, under `<root>/compile-cache/<key[:2]>/<key>/`. A unit found in the cache is never
compiled again. Two runs that need one kernel build it once (a lock per kernel: the second waits and
reuses it); two kernels that share a unit and miss it at once may both compile it, and the first to
store it wins (a lock per unit). NVRTC's failures are cached too (the same input fails the same way); an
entry whose files fail their checksums, or written in an older format, is compiled again.

A kernel is its units (codegen's shards of tile functions, then the entry): each unit is an entry
of its own, so a kernel in which only some tiles changed recompiles only their units, and a killed
compile resumes unit by unit. The link of the units' cubins is an entry keyed by their keys."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from lospmm.files import atomic_write, file_sha256
from lospmm.flows.storage.store import locked
from lospmm.flows.execution.taskio import lock_wait_noted, stop_requested
from lospmm.kernel.spec import KernelSource
from lospmm.flows.execution.units import UnitCompiler, threads
from lospmm.stages.compile import CompileOptions, compile_key, link_key, linked
from lospmm.status import Status

FILES = {"source": "kernel.cu", "ptx": "kernel.ptx", "cubin": "kernel.cubin", "log": "ptxas.log"}
# result.json's format: an entry of another format (missing fields, other meanings) is rebuilt,
# never read with defaults
FORMAT = 2
LINKED_FILES = {"source": "kernel.cu", "cubin": "kernel.cubin", "log": "ptxas.log"}


def cache_dir(root: str | Path, key: str) -> Path:
    return Path(root) / "compile-cache" / key[:2] / key


def cached_kernel(root: str | Path, kernel: KernelSource, options: CompileOptions,
                  compile_units: UnitCompiler | None = None) -> tuple[dict, bool]:
    """One cubin for `kernel`: the units the cache lacks compiled by `compile_units` (default: one
    thread here; the flow passes its run's, see flows/units.py), stored, and all linked. The result
    has a unit entry's fields (status, log, paths…), with `registers` the linked entry's, spills summed over the units,
    `seconds` NVRTC's over the units compiled now plus the link (0 when nothing was), `cost_seconds`
    what the whole kernel cost when its units and link were first built, `units` and `units_compiled`."""
    if not options.relocatable:
        raise ValueError("a kernel's units are compiled with CompileOptions(relocatable=True)")
    compile_units = compile_units or threads(1)
    t0 = time.perf_counter()
    keys = [compile_key(u, options) for u in kernel.units]
    key = link_key(keys, options.arch)
    d = cache_dir(root, key)
    # a kernel already linked is served without a lock or a look at its units (a read-only root too)
    hit = _valid(d, LINKED_FILES)
    if hit is not None:
        return _served(hit, None, time.perf_counter() - t0), True
    # two runs on one kernel: one builds it, the other waits (saying who holds it), reuses it
    with locked(d, check=stop_requested, waiting=lock_wait_noted):
        hit = _valid(d, LINKED_FILES)
        if hit is not None:
            return _served(hit, None, time.perf_counter() - t0), True
        units = [_valid(cache_dir(root, k), FILES) for k in keys]
        missing = [i for i, u in enumerate(units) if u is None]
        if missing:
            stop_requested()

            def landed(j: int, out: dict) -> None:
                i = missing[j]
                unit_dir = cache_dir(root, keys[i])
                with locked(unit_dir, check=stop_requested, waiting=lock_wait_noted):  # another kernel may have stored it: keep theirs
                    units[i] = _valid(unit_dir, FILES) or _stored(unit_dir, root, keys[i], kernel.units[i],
                                                                  f"{kernel.name}_unit{i}", options, out)
                stop_requested()

            compile_units([(kernel.units[i], f"{kernel.name}_unit{i}", options) for i in missing], landed)
        hit = _linked_into(d, root, key, kernel, options, units)
    return _served(hit, [units[i] for i in missing], time.perf_counter() - t0), False


def _served(linked_entry: dict, fresh: list[dict] | None, wall_seconds: float) -> dict:
    """A link entry as cached_kernel's result: `fresh` the units compiled for it now (None: the
    whole kernel came from the cache, nothing was compiled or linked)."""
    link = 0.0 if fresh is None else linked_entry["link_seconds"]
    fresh = fresh or []
    return {**linked_entry, "seconds": sum(u["seconds"] for u in fresh) + link, "wall_seconds": wall_seconds,
            "cost_seconds": sum(linked_entry["unit_seconds"]) + linked_entry["link_seconds"],
            "units_compiled": len(fresh), "compiled_on": sorted({u.get("compiled_on", "") for u in fresh})}


def compile_summary(result: dict, hit: bool) -> str:
    """A cached_kernel result as a log line reads it: the wall time the compile took here, and where
    several units compiled now, their seconds summed (the `compile_seconds` columns' figure: a cost,
    which exceeds the wall time when the units compile side by side on several jobs)."""
    wall = result.get("wall_seconds", 0.0)
    n = result.get("units_compiled", 0)
    if hit:
        return f"{result['status']} from the compile cache in {wall:.1f} s"
    if n == 0:
        return f"{result['status']} in {wall:.1f} s (its units from the compile cache, linked now)"
    if n == 1:
        return f"{result['status']} in {wall:.1f} s"
    return (f"{result['status']} in {wall:.1f} s ({result['seconds']:.1f} s of compiler time summed over {n} units "
            f"compiled side by side, and the link)")


def _linked_into(d: Path, root, key: str, kernel: KernelSource, options: CompileOptions, units: list[dict]) -> dict:
    failed = [(i, u) for i, u in enumerate(units) if u["status"] != Status.OK]
    logs = "\n".join(f"// unit {i}: {u['key']}\n{Path(root, u['paths']['log']).read_text(encoding='utf-8')}"
                     for i, u in enumerate(units))
    if failed:  # last: the log kept is its tail
        status, cubin, registers, seconds = Status.ERROR, b"", 0, 0.0
        logs += "\n" + "\n".join(f"unit {i} of {len(units)} failed:\n{u['log']}" for i, u in failed)
    else:
        out = linked([_unit_cubin(root, u) for u in units], options.arch, kernel.name)
        status, cubin, registers, seconds = out.status, out.cubin, out.registers, out.seconds
        logs += f"\n// nvJitLink ({out.status}):\n{out.log}"
    d.mkdir(parents=True, exist_ok=True)
    blobs = {"source": kernel.source.encode(), "cubin": cubin, "log": logs.encode()}
    for what, data in blobs.items():
        atomic_write(d / LINKED_FILES[what], lambda tmp, data=data: Path(tmp).write_bytes(data))
    result = {"status": status, "log": logs[-20000:], "registers": registers,
              "spill_stores": sum(u["spill_stores"] for u in units), "spill_loads": sum(u["spill_loads"] for u in units),
              "thread_spill_bytes": max(u["thread_spill_bytes"] for u in units), "format": FORMAT,
              "stack_bytes": max(u["stack_bytes"] for u in units), "smem_bytes": max(u["smem_bytes"] for u in units),
              "link_seconds": seconds, "nvrtc_version": units[0]["nvrtc_version"], "key": key, "name": kernel.name,
              "options": options.as_list(), "arch": options.arch, "units": len(units),
              "unit_keys": [u["key"] for u in units],
              "unit_seconds": [u["seconds"] for u in units],  # as first compiled
              "paths": {w: str((d / f).relative_to(root)) for w, f in LINKED_FILES.items()},
              "sha256": {w: file_sha256(d / f) for w, f in LINKED_FILES.items()}}
    atomic_write(d / "result.json", lambda tmp: Path(tmp).write_text(json.dumps(result, indent=1), encoding="utf-8"))
    return result


def _unit_cubin(root, unit: dict) -> bytes:
    """A unit's cubin as checked when it was found: a file changed since is not linked."""
    path = Path(root, unit["paths"]["cubin"])
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != unit["sha256"]["cubin"]:
        raise OSError(f"{path} changed since it was checked; compile again")  # transient: the retry rebuilds it
    return data


def _stored(d: Path, root: str | Path, key: str, source: str, name: str, options: CompileOptions, out: dict) -> dict:
    """One compile's output (compiled_unit's dict) written into its cache entry; the entry's result."""
    d.mkdir(parents=True, exist_ok=True)
    blobs = {"source": source.encode(), "ptx": out["ptx"], "cubin": out["cubin"], "log": out["log"].encode()}
    for what, data in blobs.items():
        atomic_write(d / FILES[what], lambda tmp, data=data: Path(tmp).write_bytes(data))
    result = {k: v for k, v in out.items() if k not in ("ptx", "cubin")}
    result.update(key=key, name=name, options=options.as_list(), arch=options.arch, format=FORMAT,
                  paths={w: str((d / f).relative_to(root)) for w, f in FILES.items()},
                  sha256={w: file_sha256(d / f) for w, f in FILES.items()})
    atomic_write(d / "result.json", lambda tmp: Path(tmp).write_text(json.dumps(result, indent=1), encoding="utf-8"))
    return result


def _valid(d: Path, files: dict[str, str]) -> dict | None:
    try:
        result = json.loads((d / "result.json").read_text(encoding="utf-8"))
        if result.get("format") != FORMAT or set(result["sha256"]) != set(files):
            return None
        if any(file_sha256(d / files[w]) != sha for w, sha in result["sha256"].items()):
            return None
        return result
    except (OSError, ValueError, KeyError):
        return None
