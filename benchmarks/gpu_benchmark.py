"""GPU benchmark (needs a CUDA device, torch; cupy optional): our emitted kernel vs cuBLAS SGEMM
(TF32 off), cuSPARSE CSR SpMM (cupyx) and torch.sparse CSR, over the zoo's distinct GEMM shapes ×
sparsities; geometric-mean speedups; and the loss of the proxy-selected tile against the best full
kernel among the ranker's top-K (the paper's Table 4).

Every time is measured here (CUDA events, warm-up, L2 flushed before each repeat, median of 20).
Compiles fan out over a process pool (NVRTC is single-threaded per program).

    python benchmarks/gpu_benchmark.py [--models bert-base resnet50] [--sparsity 0.5 0.7 0.8 0.9 0.95]
                                       [--max-shapes 8] [--top-k 10] [--jobs 16]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from rich.console import Console
from rich.table import Table

from lospmm.flows.ranker_store import load_ranker
from lospmm.runtime import (CudaTimerOptions, check_full_kernel, device_facts, gpu_present, time_full_kernel_cubin,
                            time_proxy_cubin, torch_timed)
from lospmm.stages.cluster import proxy_clusters
from lospmm.stages.codegen import full_kernel_source, proxy_kernel_source, proxy_tile_rows
from lospmm.stages.compile import CompileOptions, compiled
from lospmm.stages.constrain import constrained_candidates, predicted_registers
from lospmm.stages.devices import device_named
from lospmm.stages.extract import zoo_shapes
from lospmm.stages.pad import proxy_launch
from lospmm.stages.prune import pruned_layer
from lospmm.stages.rank import ranked
from lospmm.stages.reorder import distinct_m1s, reordered_tiles, tile_stats

M1S = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def _compile(job):
    source, name, arch, regs = job
    out = compiled(source, name, CompileOptions(arch=arch, maxrregcount=regs))
    return out.status, out.cubin, out.log[-500:]


def library_times(a, n: int) -> dict[str, float]:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    b = torch.randn(a.shape[1], n, device="cuda")
    dense = torch.from_numpy(a.toarray()).cuda()
    out = {"cublas_us": torch_timed(lambda: torch.matmul(dense, b))}
    csr = dense.to_sparse_csr()
    out["torch_csr_us"] = torch_timed(lambda: csr @ b)
    try:
        import cupy
        import cupyx.scipy.sparse as cps

        ca, cb = cps.csr_matrix(a.astype(np.float32)), cupy.asarray(b.cpu().numpy())
        out["cusparse_us"] = torch_timed(lambda: ca @ cb)  # both libraries use the legacy default stream
    except ImportError:
        out["cusparse_us"] = float("nan")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["bert-base", "resnet50", "mobilenetv2", "shufflenetv2"])
    ap.add_argument("--sparsity", type=float, nargs="+", default=[0.5, 0.7, 0.8, 0.9, 0.95])
    ap.add_argument("--max-shapes", type=int, default=0, help="first N distinct shapes only (0 = all)")
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--gpu", default="h100", help="device table for the constraints")
    args = ap.parse_args()
    if not gpu_present():
        print("gpu_benchmark.py needs a CUDA device; none here.", file=sys.stderr)
        raise SystemExit(2)
    facts = device_facts()
    device, arch = device_named(args.gpu), facts["arch"]
    booster, meta = load_ranker()
    shapes, seen = [], set()
    for model in args.models:
        for s in zoo_shapes(model):
            if s.ok and (s.m, s.k, s.n) not in seen:
                seen.add((s.m, s.k, s.n))
                shapes.append(s)
    shapes = shapes[: args.max_shapes] if args.max_shapes else shapes
    console = Console(width=220)
    table = Table(title=f"{facts['name']} ({arch}): µs per SpMM, median of 20 (CUDA events, L2 flushed); "
                        f"ranker {meta['version']} top-{args.top_k}")
    for c in ("model", "layer", "M×K×N", "sparsity", "tile", "ours", "cuBLAS", "cuSPARSE", "torch CSR",
              "vs cuBLAS", "vs cuSPARSE", "vs torch", "best top-K full", "proxy loss", "check"):
        table.add_column(c)
    speedups: dict[str, list[float]] = {"cublas": [], "cusparse": [], "torch_csr": []}
    losses = []
    opts = CudaTimerOptions()
    # spawn: the parent has initialised CUDA, and a forked child must not inherit that state
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for s in shapes:
            for sp_ in args.sparsity:
                a = pruned_layer(s, sp_).matrix
                tiles = {m1: reordered_tiles(a, m1) for m1 in distinct_m1s(a, M1S)}
                kept = [vars(c) | {"sparsity": sp_, "k": s.k} for c in
                        constrained_candidates(s.n, {m: tile_stats(t) for m, t in tiles.items()}, device) if c.kept]
                if not kept:
                    table.add_row(s.model, s.layer, f"{s.m}×{s.k}×{s.n}", f"{sp_:g}", "no kept candidate")
                    continue
                _, ranks = ranked(kept, booster, args.top_k)
                top = [c for c, r in zip(kept, ranks) if r <= args.top_k]
                launches = {(c["m1"], c["n1"]): proxy_launch(tiles[c["m1"]].num_tiles, s.n, c["m1"], c["n1"],
                                                             c["pred_regs"], device) for c in top}
                proxies = {}
                for m1 in sorted({c["m1"] for c in top}):
                    atb = max(launches[(c["m1"], c["n1"])].num_atb for c in top if c["m1"] == m1)
                    cl = proxy_clusters(a, tiles[m1], sp_, atb)
                    proxies[m1] = (cl, proxy_kernel_source(s.m, s.k, cl))
                fulls = {(c["m1"], c["n1"]): full_kernel_source(a, tiles[c["m1"]], c["n1"]) for c in top}
                jobs = [(k.source, k.name, arch, predicted_registers(m1)) for m1, (_, k) in proxies.items()]
                jobs += [(k.source, k.name, arch, predicted_registers(m1)) for (m1, _), k in fulls.items()]
                results = list(pool.map(_compile, jobs))
                p_bins = dict(zip(proxies, results[:len(proxies)]))
                f_bins = dict(zip(fulls, results[len(proxies):]))
                proxy_t, full_t = {}, {}
                for key, launch in launches.items():
                    cl, k = proxies[key[0]]
                    if p_bins[key[0]][0] == "ok":
                        proxy_t[key] = time_proxy_cubin(p_bins[key[0]][1], k.name, s.m, s.k, s.n, key[1], cl.cluster_of,
                                                        proxy_tile_rows(tiles[key[0]]), launch.smem_bytes, opts).time_us
                    if f_bins[key][0] == "ok":
                        fk = fulls[key]
                        full_t[key] = time_full_kernel_cubin(f_bins[key][1], fk.name, fk.grid_x, s.m, s.k, s.n,
                                                             key[1], opts).time_us
                if not proxy_t or not full_t:
                    table.add_row(s.model, s.layer, f"{s.m}×{s.k}×{s.n}", f"{sp_:g}", "compile/launch failed")
                    continue
                chosen = min(proxy_t, key=proxy_t.get)
                ours = full_t.get(chosen, float("inf"))
                best = min(full_t.values())
                fk = fulls[chosen]
                err = check_full_kernel(f_bins[chosen][1], fk.name, fk.grid_x, chosen[1], a)
                lib = library_times(a, s.n)
                loss = ours / best - 1
                losses.append(loss)
                for name in speedups:
                    if np.isfinite(lib[f"{name}_us"]):
                        speedups[name].append(lib[f"{name}_us"] / ours)
                table.add_row(s.model, s.layer, f"{s.m}×{s.k}×{s.n}", f"{sp_:g}", f"{chosen[0]}×{chosen[1]}",
                              f"{ours:.1f}", f"{lib['cublas_us']:.1f}", f"{lib['cusparse_us']:.1f}",
                              f"{lib['torch_csr_us']:.1f}", f"{lib['cublas_us'] / ours:.2f}×",
                              f"{lib['cusparse_us'] / ours:.2f}×", f"{lib['torch_csr_us'] / ours:.2f}×",
                              f"{best:.1f}", f"{loss:.1%}", f"{err:.1e}")
    console.print(table)
    for name, vals in speedups.items():
        if vals:
            console.print(f"geometric-mean speedup vs {name}: {np.exp(np.mean(np.log(vals))):.2f}× over {len(vals)} kernels")
    if losses:
        console.print(f"proxy-selected tile vs best full kernel in the top-{args.top_k}: mean loss {np.mean(losses):.2%}, "
                      f"max {np.max(losses):.2%} over {len(losses)} kernels")


if __name__ == "__main__":
    main()
