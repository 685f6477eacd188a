"""Full kernels on demand: the Alg. 2 kernel of one layer and tile of a run, written to a kernel
directory (kernel.cu, and when compiled kernel.ptx, kernel.cubin; kernel.json with the launch
facts), compiled through the compile cache and checked on the host against scipy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from lospmm.flows import schemas
from lospmm.flows.compile_cache import cached_compile
from lospmm.flows.store import atomic_write, read_artifact
from lospmm.hostemu import checked_against_scipy
from lospmm.stages.codegen import full_kernel_source
from lospmm.stages.compile import CompileOptions
from lospmm.stages.constrain import predicted_registers
from lospmm.stages.devices import device_named


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
    matrix = schemas.csr_from_row(pruned, layers.index(layer))
    rows = [i for i in range(reordered.num_rows) if reordered.column("layer")[i].as_py() == layer
            and reordered.column("m1")[i].as_py() == m1]
    if not rows:
        known = sorted({reordered.column("m1")[i].as_py() for i in range(reordered.num_rows)
                        if reordered.column("layer")[i].as_py() == layer})
        raise LookupError(f"{layer}: no reorder for M1={m1}; M1 values in the run: {known}")
    tiles = schemas.tiles_from_row(reordered, rows[0])
    arch = device_named(record["config"]["gpu"]).arch
    return emitted_kernel(root, matrix, tiles, layer, sparsity, n1, arch, Path(out_dir), compile_, verify)


def emitted_kernel(root: str, matrix, tiles, layer: str, sparsity: float, n1: int, arch: str, out: Path,
                   compile_: bool = True, verify: bool = True, extra: dict | None = None) -> dict:
    """Write one full kernel directory: kernel.cu, kernel.ptx/.cubin (compiled through the compile
    cache), kernel.json with the launch facts, compile results, `extra` and the host check."""
    m1 = tiles.m1
    kernel = full_kernel_source(matrix, tiles, n1)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "kernel.cu", lambda tmp: Path(tmp).write_text(kernel.source))
    facts = {"kernel": kernel.name, "layer": layer, "sparsity": sparsity, "m": kernel.m, "k": kernel.k,
             "nnz": int(matrix.nnz), "m1": m1, "n1": n1, "params": list(kernel.params),
             "layout": "B is K×N and C is M×N, row-major float32; N is a runtime argument",
             "grid": {"x": kernel.grid_x, "y": "ceil(N / n1)", "z": 1}, "block": {"x": n1, "y": 1, "z": 1},
             "dynamic_smem_bytes": 0, "arch": arch, "row_order": tiles.rows.tolist(),
             "tile_ptr": tiles.tile_ptr.tolist(), "empty_rows": tiles.empty_rows.tolist(), **(extra or {})}
    if compile_:
        options = CompileOptions(arch=arch, maxrregcount=predicted_registers(m1))
        result, hit = cached_compile(root, kernel.source, kernel.name, options)
        facts["compile"] = {k: result[k] for k in ("status", "registers", "spill_stores", "spill_loads",
                                                    "stack_bytes", "seconds", "key", "options")} | {"from_cache": hit}
        if result["status"] == "ok":
            for what in ("ptx", "cubin"):
                shutil.copyfile(Path(root) / result["paths"][what], out / f"kernel.{what}")
        else:
            facts["compile"]["log"] = result["log"][-4000:]
    if verify:
        n = 2 * n1 + 3
        try:
            facts["host_check"] = {"max_rel_error": checked_against_scipy(kernel, matrix, n=n, sanitize=True),
                                   "n": n, "sanitizer": "address", "status": "ok"}
        except Exception as e:
            facts["host_check"] = {"status": "failed", "message": f"{type(e).__name__}: {e}"[:2000], "n": n}
    atomic_write(out / "kernel.json", lambda tmp: Path(tmp).write_text(json.dumps(facts, indent=1)))
    return facts
