"""Compile cost of full kernels vs their proxies (NVRTC, no GPU needed).

For sampled zoo layers at one sparsity and a few M1: compile seconds and peak memory of the full
Alg. 2 kernel (N1 = 128) and of the M1 proxy (clusters sized for the busiest N1's occupancy, kept or
not), each compile in its own process with a time limit. A full kernel that runs past the limit is
reported as '> limit', not as a number.

    python -m benchmarks.compile_cost [--sparsity 0.9] [--m1 8 32] [--limit 300]
    python -m benchmarks.compile_cost --scaling    # full-kernel compile seconds and memory vs nnz
    python -m benchmarks.compile_cost --counts     # kernels to compile and source bytes, with vs without proxies
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from lospmm.stages.cluster import proxy_active_blocks, proxy_clusters
from lospmm.kernel.render import kernel_source as full_kernel_source, proxy_source as proxy_kernel_source
from lospmm.stages.compile import compiled_kernel, kernel_options
from lospmm.stages.constrain import layer_candidates
from lospmm.devices import device_named
from lospmm.stages.extract import zoo_shapes
from lospmm.stages.prune import pruned_layer, random_pruned
from lospmm.stages.rank import RankParams
from lospmm.stages.reorder import reordered_tiles, tile_stats
from lospmm.search import SearchParams, chosen_by_proxy, full_source, layer_search, proxy_sources

# the flow's search without the ranker: every kept candidate chosen, one proxy per kept M1
UNRANKED = SearchParams(rank=RankParams(use_rank=False))

SAMPLES = [("bert-base", "encoder.layer.0.attention.self.query"), ("resnet50", "layer2.0.conv3"),
           ("resnet50", "layer3.0.conv2"), ("resnet50", "layer1.0.conv2")]


def _child(kernel, m1: int, queue) -> None:
    out = compiled_kernel(kernel, kernel_options("sm_90", m1))
    queue.put((out.status, out.seconds, out.registers, out.spill_stores,
               resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def in_child(target, args: tuple, limit: float):
    """Run target(*args, queue) in a forked process; its queued result, or a timeout/crash dict."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    t0 = time.perf_counter()
    proc.start()
    proc.join(limit)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return {"status": "timeout", "seconds": time.perf_counter() - t0}
    return queue.get() if not queue.empty() else {"status": "crashed", "seconds": time.perf_counter() - t0}


def timed_compile(kernel, m1: int, limit: float) -> dict:
    """Compile in a fresh process with the pipeline's options for M1; seconds, registers, spills and
    the process's peak RSS (MiB)."""
    r = in_child(_child, (kernel, m1), limit)
    if isinstance(r, dict):
        return r
    status, seconds, regs, spills, rss = r
    return {"status": status, "seconds": seconds, "regs": regs, "spills": spills, "rss_mib": rss}


def _fmt(r: dict, limit: float) -> str:
    return f"> {limit:.0f}" if r["status"] == "timeout" else f"{r['seconds']:.2f}"


def proxies_vs_full(args) -> None:
    device = device_named("h100")
    table = Table(title=f"compile seconds, full kernel (N1=128) vs M1 proxy; sparsity {args.sparsity}, sm_90, "
                        f"limit {args.limit:.0f} s per compile")
    for c in ("model", "layer", "M×K", "nnz", "M1", "tiles", "clusters", "full loads", "proxy loads",
              "full s", "full MiB", "full regs/spill", "proxy s", "proxy MiB", "full/proxy"):
        table.add_column(c)
    for model, layer in SAMPLES:
        shape = next(s for s in zoo_shapes(model) if s.layer == layer)
        a = pruned_layer(shape, args.sparsity).matrix
        for m1 in args.m1:
            # one M1 on purpose: its proxy is sized over every N1, kept or not, so an M1 that keeps none has one too
            tiles = reordered_tiles(a, m1)
            atb = proxy_active_blocks(layer_candidates(shape.n, {m1: tile_stats(tiles)}, device), device)
            cl = proxy_clusters(a, tiles, args.sparsity, atb)
            proxy = proxy_kernel_source(shape.m, shape.k, cl)
            full = full_kernel_source(a, tiles, 128)
            p = timed_compile(proxy, m1, args.limit)
            f = timed_compile(full, m1, args.limit)
            ratio = "" if "timeout" in (p["status"], f["status"]) else f"{f['seconds'] / p['seconds']:.1f}×"
            if f["status"] == "timeout" and p["status"] != "timeout":
                ratio = f"> {args.limit / p['seconds']:.1f}×"
            table.add_row(model, layer, f"{shape.m}×{shape.k}", str(a.nnz), str(m1), str(tiles.num_tiles),
                          str(cl.num_clusters), str(int(tiles.tile_nnc.sum())), str(int(cl.nnc_p.sum())),
                          _fmt(f, args.limit), f"{f.get('rss_mib', 0):.0f}",
                          f"{f.get('regs', '')}/{f.get('spills', '')}", _fmt(p, args.limit),
                          f"{p.get('rss_mib', 0):.0f}", ratio)
            Console(width=200).print(table) if args.verbose else None
    Console(width=200).print(table)


def search_counts(args) -> None:
    """Per layer: full kernels a search without proxies compiles (one per kept (M1, N1)) vs proxies
    (one per kept M1), and the CUDA source each side generates (measured bytes, not compiled)."""
    device = device_named("h100")
    table = Table(title=f"search cost by kernel count and generated source, sparsity {args.sparsity}, h100 "
                        f"(full kernels: N1 only changes a constant, so each (M1, N1) has its M1's source size)")
    for c in ("model", "layer", "nnz", "kept (M1,N1) = full compiles", "kept M1 = proxies", "full source MB",
              "proxy source MB", "source ratio"):
        table.add_column(c)
    totals = {}
    for model in ("bert-base", "resnet50"):
        for shape in [s for s in zoo_shapes(model) if s.ok]:
            a = pruned_layer(shape, args.sparsity).matrix
            search = layer_search(a, shape.n, args.sparsity, device, params=UNRANKED)
            kept, by_m1 = search.kept, chosen_by_proxy(search.chosen)
            proxy_b = sum(len(k.source) for k in proxy_sources(search, shape.m, shape.k).values())
            # N1 only changes a constant: each kept (M1, N1) costs its M1's source at the first kept N1
            full_b = sum(len(group) * len(full_source(a, search, m1, group[0].n1, label).source)
                         for (m1, label), group in by_m1.items())
            ratio = f"{full_b / proxy_b:.1f}×" if proxy_b else "-"
            table.add_row(model, shape.layer, str(a.nnz), str(len(kept)), str(len(by_m1)), f"{full_b / 1e6:.1f}",
                          f"{proxy_b / 1e6:.1f}", ratio)
            t_ = totals.setdefault(model, [0, 0, 0, 0])
            for i, v in enumerate((len(kept), len(by_m1), full_b, proxy_b)):
                t_[i] += v
    for model, (k, p, fb, pb) in totals.items():
        table.add_row(model, "ALL", "", str(k), str(p), f"{fb / 1e6:.1f}", f"{pb / 1e6:.1f}", f"{fb / pb:.1f}×")
    Console(width=200).print(table)


def scaling(args) -> None:
    table = Table(title=f"full kernel compile vs nnz (K=768, M1=16, N1=128, sparsity 0.9, sm_90, "
                        f"limit {args.limit:.0f} s)")
    for c in ("M", "nnz", "tiles", "loads", "compile s", "peak MiB", "regs", "spill bytes"):
        table.add_column(c)
    for m in args.rows:
        a = random_pruned(m, 768, 0.9, np.random.default_rng(0))
        tiles = reordered_tiles(a, 16)
        k = full_kernel_source(a, tiles, 128)
        r = timed_compile(k, 16, args.limit)
        table.add_row(str(m), str(a.nnz), str(tiles.num_tiles), str(int(tiles.tile_nnc.sum())), _fmt(r, args.limit),
                      f"{r.get('rss_mib', 0):.0f}", str(r.get("regs", "")), str(r.get("spills", "")))
        Console(width=160).print(table) if args.verbose else None
    Console(width=160).print(table)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sparsity", type=float, default=0.9)
    ap.add_argument("--m1", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--limit", type=float, default=300.0)
    ap.add_argument("--scaling", action="store_true")
    ap.add_argument("--counts", action="store_true", help="kernel counts and generated source sizes (no compiling)")
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    ap.add_argument("--verbose", action="store_true", help="print the table after every row")
    args = ap.parse_args()
    if args.counts:
        search_counts(args)
    elif args.scaling:
        scaling(args)
    else:
        proxies_vs_full(args)


if __name__ == "__main__":
    main()
