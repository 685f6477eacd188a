"""Compile cost of sharded full kernels: each way of splitting tile functions into units, on a
small layer, a 512-tile M1 = 1 layer and a >= 1M-nonzero layer; and compile seconds against nnz
(the fitted exponent). Every compile runs in a child process (its peak RSS is the child's
ru_maxrss), units one after another, so the seconds are the CPU cost of the whole kernel.

    python -m benchmarks.shard_compile              # the split table
    python -m benchmarks.shard_compile --sweep      # seconds against nnz at the default split
    python -m benchmarks.shard_compile --mono       # add the one-function kernel (slow: minutes)
    python -m benchmarks.shard_compile --proxy bert-base encoder.layer.0.output.dense 12   # one zoo proxy
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import time

import numpy as np
from rich.console import Console
from rich.table import Table

LAYERS = {  # name: (rows, K, sparsity, M1)
    "768x768@0.9 M1=32": (768, 768, 0.9, 32),
    "512x4608@0.9 M1=1": (512, 4608, 0.9, 1),
    "768x3072@0.5 M1=16": (768, 3072, 0.5, 16),
}


def _child(rows, k, sparsity, m1, shard_nnz, mono, queue) -> None:
    from lospmm.kernel.render import CodegenParams, kernel_source as full_kernel_source
    from lospmm.stages.compile import CompileOptions, compiled, kernel_options
    from lospmm.stages.prune import random_pruned
    from lospmm.stages.reorder import reordered_tiles

    a = random_pruned(rows, k, sparsity, np.random.default_rng(0))
    tiles = reordered_tiles(a, m1)
    kernel = full_kernel_source(a, tiles, 128, CodegenParams(shard_nnz=shard_nnz))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if mono:  # the one-function kernel this replaces: every tile inlined into the entry
        source = kernel.source.replace("__noinline__ __attribute__((noreturn))", "__forceinline__").replace(
            'asm volatile("exit;"); __builtin_unreachable();', "")
        options = kernel_options("sm_90", m1)
        out = compiled(source, kernel.name, CompileOptions(arch="sm_90", maxrregcount=options.maxrregcount))
        units, worst, link = 1, out.seconds, 0.0
    else:
        from lospmm.stages.compile import linked

        options = kernel_options("sm_90", m1)
        unit_seconds, cubins, spills = [], [], 0
        for i, u in enumerate(kernel.units):
            r = compiled(u, f"{kernel.name}_unit{i}", options)
            unit_seconds.append(r.seconds)
            cubins.append(r.cubin)
            spills += r.spill_stores
        lk = linked(cubins, "sm_90", kernel.name)
        units, worst, link = len(kernel.units), max(unit_seconds), lk.seconds
        out = type("R", (), {"status": lk.status, "registers": lk.registers, "spill_stores": spills})
    wall = time.perf_counter() - t0
    queue.put({"nnz": a.nnz, "tiles": tiles.num_tiles, "units": units, "seconds": wall, "worst_unit": worst,
               "link": link, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "base_mb": base / 1024, "status": str(out.status), "registers": out.registers,
               "spill": out.spill_stores, "pred": kernel_options("sm_90", m1).maxrregcount})


def _proxy_child(model, layer, sparsity, m1, queue) -> None:
    from lospmm.stages.cluster import proxy_active_blocks, proxy_clusters
    from lospmm.kernel.render import proxy_source as proxy_kernel_source
    from lospmm.stages.compile import compiled_kernel, kernel_options
    from lospmm.stages.constrain import layer_candidates
    from lospmm.devices import device_named
    from lospmm.stages.extract import zoo_shapes
    from lospmm.stages.prune import pruned_layer
    from lospmm.stages.reorder import reordered_tiles, tile_stats

    device = device_named("h100")
    shape = next(s for s in zoo_shapes(model) if s.layer == layer)
    a = pruned_layer(shape, sparsity).matrix
    tiles = reordered_tiles(a, m1)
    atb = proxy_active_blocks(layer_candidates(shape.n, {m1: tile_stats(tiles)}, device), device)
    kernel = proxy_kernel_source(shape.m, shape.k, proxy_clusters(a, tiles, sparsity, atb))
    t0 = time.perf_counter()
    out = compiled_kernel(kernel, kernel_options("sm_90", m1))
    queue.put({"nnz": a.nnz, "units": len(kernel.units), "seconds": time.perf_counter() - t0,
               "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "status": str(out.status),
               "registers": out.registers, "spill": out.spill_stores, "clusters": len(kernel.units) - 1})


def proxy(model: str, layer: str, m1: int, sparsity: float) -> None:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=_proxy_child, args=(model, layer, sparsity, m1, queue))
    p.start()
    r = _result(p, queue)
    print(f"{model} {layer} proxy M1={m1} at sparsity {sparsity}: {r['units']} units, {r['seconds']:.1f} s, "
          f"peak RSS {r['rss_mb']:.0f} MB, {r['registers']} registers, {r['spill']} B spilled, {r['status']}")


def measured(rows, k, sparsity, m1, shard_nnz, mono=False) -> dict:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=_child, args=(rows, k, sparsity, m1, shard_nnz, mono, queue))
    p.start()
    return _result(p, queue)


def _result(p, queue) -> dict:
    """The child's result; a child that died without one (a crash, a bug) stops the benchmark."""
    import queue as queues

    while True:
        try:
            out = queue.get(timeout=1.0)
            p.join()
            return out
        except queues.Empty:
            if not p.is_alive():
                raise SystemExit(f"the compile child died (exit code {p.exitcode}) without a result")


def split_table(splits: list[int], mono: bool) -> None:
    table = Table(title="Sharded full kernels, sm_90, NVRTC -rdc units + nvJitLink, units compiled serially")
    for c in ("layer", "nnz", "tiles", "split (nnz/unit)", "units", "compile s", "worst unit s", "link s",
              "peak RSS MB", "regs (pred)", "spill B", "status"):
        table.add_column(c)
    for name, (rows, k, s, m1) in LAYERS.items():
        runs = [(str(n), measured(rows, k, s, m1, n)) for n in splits]
        if mono and rows * k * (1 - s) < 100_000:
            runs.insert(0, ("one function", measured(rows, k, s, m1, 1, mono=True)))
        for label, r in runs:
            table.add_row(name, str(r["nnz"]), str(r["tiles"]), label, str(r["units"]), f"{r['seconds']:.1f}",
                          f"{r['worst_unit']:.2f}", f"{r['link']:.2f}", f"{r['rss_mb']:.0f}",
                          f"{r['registers']} ({r['pred']})", str(r["spill"]), r["status"])
        Console(width=180).print(table) if name == list(LAYERS)[-1] else None


def sweep(shard_nnz: int) -> None:
    table = Table(title=f"Compile seconds against nnz, K=3072 rows×K at sparsity 0.5, M1=16, split {shard_nnz}")
    for c in ("rows", "nnz", "units", "compile s", "peak RSS MB"):
        table.add_column(c)
    xs, ys = [], []
    for rows in (16, 64, 192, 384, 768):
        r = measured(rows, 3072, 0.5, 16, shard_nnz)
        xs.append(r["nnz"])
        ys.append(r["seconds"])
        table.add_row(str(rows), str(r["nnz"]), str(r["units"]), f"{r['seconds']:.1f}", f"{r['rss_mb']:.0f}")
    slope = np.polyfit(np.log(xs), np.log(ys), 1)[0]
    Console(width=160).print(table)
    print(f"fitted exponent (log seconds against log nnz, {xs[0]}..{xs[-1]} nnz): {slope:.3f}")


def main() -> None:
    from lospmm.kernel.render import CodegenParams

    ap = argparse.ArgumentParser()
    ap.add_argument("--splits", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--mono", action="store_true")
    ap.add_argument("--proxy", nargs=3, metavar=("MODEL", "LAYER", "M1"))
    ap.add_argument("--sparsity", type=float, default=0.9, help="for --proxy")
    args = ap.parse_args()
    if args.proxy:
        proxy(args.proxy[0], args.proxy[1], int(args.proxy[2]), args.sparsity)
    elif args.sweep:
        sweep(CodegenParams().shard_nnz)
    else:
        split_table(args.splits, args.mono)


if __name__ == "__main__":
    main()
