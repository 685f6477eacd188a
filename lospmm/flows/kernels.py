"""Kernel directories: the full Alg. 2 kernel of one layer and tile written to a directory
(kernel.cu, and when compiled kernel.ptx, kernel.cubin; kernel.json with the launch facts),
compiled through the compile cache and checked on the host against scipy. Used by the emit stage
and by `lospmm kernel` for any layer and tile of a run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

from lospmm.flows.compile_cache import cached_compile
from lospmm.flows.store import atomic_write, read_artifact
from lospmm.flows.tasks.prune import csr_from_row
from lospmm.flows.tasks.reorder import tiles_from_row
from lospmm.hostemu import checked_against_scipy
from lospmm.stages.codegen import full_kernel_source
from lospmm.stages.compile import kernel_options
from lospmm.stages.devices import device_named
from lospmm.stages.emit import host_check_columns, kernel_facts
from lospmm.stages.status import Status


def write_full_kernel(root: str, record: dict, layer: str, m1: int, n1: int, out_dir: str,
                      sparsity: float | None = None, compile_: bool = True, verify: bool = True) -> dict:
    """Generate (and compile, verify) the full kernel of `layer` at tile (m1, n1); returns kernel.json."""
    entries = {(e["stage"], e.get("sparsity")): e for e in record["entries"] if e.get("path")}
    sparsities = sorted({s for (st, s) in entries if st == "reorder"})
    if sparsity is None:
        if len(sparsities) != 1:
            raise LookupError(f"run has sparsities {sparsities}; pick one with --sparsity")
        sparsity = sparsities[0]
    if ("reorder", sparsity) not in entries:
        raise LookupError(f"run {record['run_id']} has no reorder artifact at sparsity {sparsity}")
    pruned = read_artifact(Path(root) / entries[("prune", sparsity)]["path"])
    reordered = read_artifact(Path(root) / entries[("reorder", sparsity)]["path"])
    layers = pruned.column("layer").to_pylist()
    if layer not in layers:
        raise LookupError(f"layer {layer!r} is not in the run; layers: {', '.join(layers)}")
    matrix = csr_from_row(pruned, layers.index(layer))
    at = {(reordered.column("layer")[i].as_py(), reordered.column("m1")[i].as_py()): i
          for i in range(reordered.num_rows)}
    if (layer, m1) not in at:
        known = sorted(m for (lay, m) in at if lay == layer)
        raise LookupError(f"{layer}: no reorder for M1={m1}; M1 values in the run: {known}")
    tiles = tiles_from_row(reordered, at[(layer, m1)])
    arch = device_named(record["config"]["gpu"]).arch
    return emitted_kernel(root, matrix, tiles, layer, sparsity, n1, arch, Path(out_dir), compile_, verify)


def emitted_kernel(root: str, matrix, tiles, layer: str, sparsity: float, n1: int, arch: str, out: Path,
                   compile_: bool = True, verify: bool = True, extra: dict | None = None,
                   measured: Callable[[dict, bytes], dict] | None = None) -> dict:
    """Write one full kernel directory: kernel.cu, kernel.ptx/.cubin (compiled through the compile
    cache), and kernel.json with the launch facts, `extra`, the compile result, the host check and
    what `measured(facts, cubin)` adds once the kernel compiled (its time, a device check)."""
    kernel = full_kernel_source(matrix, tiles, n1)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "kernel.cu", lambda tmp: Path(tmp).write_text(kernel.source))
    facts = {**kernel_facts(kernel, matrix, tiles, layer, sparsity, arch), **(extra or {})}
    cubin = None
    if compile_:
        result, hit = cached_compile(root, kernel.source, kernel.name, kernel_options(arch, tiles.m1))
        facts["compile"] = {k: result[k] for k in ("status", "registers", "spill_stores", "spill_loads",
                                                    "stack_bytes", "seconds", "key", "options")} | {"from_cache": hit}
        if result["status"] == Status.OK:
            for what in ("ptx", "cubin"):
                shutil.copyfile(Path(root) / result["paths"][what], out / f"kernel.{what}")
            cubin = (out / "kernel.cubin").read_bytes()
        else:
            facts["compile"]["log"] = result["log"][-4000:]
    if verify:
        n = host_check_columns(n1)
        try:
            facts["host_check"] = {"max_rel_error": checked_against_scipy(kernel, matrix, n=n, sanitize=True),
                                   "n": n, "sanitizer": "address", "status": Status.OK}
        except Exception as e:
            facts["host_check"] = {"status": Status.ERROR, "message": f"{type(e).__name__}: {e}"[:2000], "n": n}
    if measured is not None and cubin is not None:
        facts.update(measured(facts, cubin))
    atomic_write(out / "kernel.json", lambda tmp: Path(tmp).write_text(json.dumps(facts, indent=1)))
    return facts
