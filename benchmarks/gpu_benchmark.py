"""GPU benchmark (needs a CUDA device, torch; cupy optional): our emitted kernel vs cuBLAS SGEMM
(TF32 off), cuSPARSE CSR SpMM (cupyx) and torch.sparse CSR, over the zoo's distinct GEMM shapes ×
sparsities; geometric-mean speedups; and the loss of the proxy-selected tile against the best full
kernel among the ranker's top-K (the paper's Table 4).

The search is the flow's (lospmm.stages.search.layer_search: reorder, constrain, rank, cluster,
pad), compiled with the flow's options and timed with its `cuda` timer, and the proxy-selected tile
is the emit stage's choice, so this measures the decisions `lospmm run` makes.

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
from dataclasses import dataclass

import numpy as np
from rich.console import Console
from rich.table import Table

from lospmm.flows.ranker_store import load_ranker
from lospmm.runtime import CudaTimer, device_facts, gpu_present, torch_timed
from lospmm.stages.compile import compiled_kernel, kernel_options
from lospmm.stages.devices import device_named
from lospmm.stages.emit import EmitParams
from lospmm.stages.extract import zoo_shapes
from lospmm.stages.prune import pruned_layer
from lospmm.stages.rank import RankParams
from lospmm.stages.search import SearchParams, choice, full_source, layer_search, proxy_sources
from lospmm.stages.status import Status
from lospmm.stages.timing import LaunchUnderTest


@dataclass(frozen=True)
class Binary:
    """What a launch needs from a compile (the PTX stays in the worker)."""

    status: Status
    cubin: bytes
    registers: int
    spill_bytes: int
    log: str


def _compile(job) -> Binary:
    kernel, arch, m1 = job
    out = compiled_kernel(kernel, kernel_options(arch, m1))
    return Binary(out.status, out.cubin, out.registers, out.thread_spill_bytes, out.log[-500:])


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
    timer = CudaTimer(device, facts["name"])
    params = SearchParams(rank=RankParams(top_k=args.top_k))
    check_n = EmitParams().device_check_n  # the emit stage's device check
    # spawn: the parent has initialised CUDA, and a forked child must not inherit that state
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for s in shapes:
            for sp_ in args.sparsity:
                shape_cells = (s.model, s.layer, f"{s.m}×{s.k}×{s.n}", f"{sp_:g}")
                a = pruned_layer(s, sp_).matrix
                search = layer_search(a, s.n, sp_, device, booster, params)
                if not search.chosen:
                    table.add_row(*shape_cells, "no kept candidate")
                    continue
                proxies = proxy_sources(search, s.m, s.k)
                fulls = {(c.m1, c.n1): full_source(a, search, c.m1, c.n1) for c in search.chosen}
                jobs = [(k, arch, m1) for m1, k in proxies.items()]
                jobs += [(k, arch, m1) for (m1, _), k in fulls.items()]
                results = list(pool.map(_compile, jobs))
                p_bins = dict(zip(proxies, results[:len(proxies)]))
                f_bins = dict(zip(fulls, results[len(proxies):]))
                proxy_t, full_launch, full_t = {}, {}, {}
                for (m1, n1), launch in search.launches.items():
                    p, f, fk = p_bins[m1], f_bins[(m1, n1)], fulls[(m1, n1)]
                    if p.status == Status.OK:
                        proxy_t[(m1, n1)] = timer.time(LaunchUnderTest(
                            search.tiles[m1], s.m, s.k, s.n, n1, p.registers, p.spill_bytes, launch.smem_bytes,
                            clusters=search.clusters[m1], kernel=proxies[m1].name, cubin=p.cubin))
                    if f.status == Status.OK:
                        full_launch[(m1, n1)] = LaunchUnderTest(search.tiles[m1], s.m, s.k, s.n, n1, f.registers,
                                                                f.spill_bytes, kernel=fk.name, grid_x=fk.grid_x,
                                                                cubin=f.cubin)
                        full_t[(m1, n1)] = timer.time(full_launch[(m1, n1)]).time_us
                full_t = {key: t for key, t in full_t.items() if np.isfinite(t)}
                chosen = choice(proxy_t)
                if chosen is None or not full_t:
                    table.add_row(*shape_cells, "compile/launch failed")
                    continue
                if chosen not in full_t:
                    table.add_row(*shape_cells, f"{chosen[0]}×{chosen[1]}", "full kernel failed")
                    continue
                ours = full_t[chosen]
                best = min(full_t.values())
                err = timer.device_error(full_launch[chosen], a, check_n)
                lib = library_times(a, s.n)
                loss = ours / best - 1
                losses.append(loss)
                for name in speedups:
                    if np.isfinite(lib[f"{name}_us"]):
                        speedups[name].append(lib[f"{name}_us"] / ours)
                table.add_row(*shape_cells, f"{chosen[0]}×{chosen[1]}",
                              f"{ours:.1f}", f"{lib['cublas_us']:.1f}", f"{lib['cusparse_us']:.1f}",
                              f"{lib['torch_csr_us']:.1f}", f"{lib['cublas_us'] / ours:.2f}×",
                              f"{lib['cusparse_us'] / ours:.2f}×", f"{lib['torch_csr_us'] / ours:.2f}×",
                              f"{best:.1f}", f"{loss:.1%}", f"{err:.1e}")
    console.print(table)
    for name, vals in speedups.items():
        if vals:
            console.print(f"geometric-mean speedup vs {name}: {np.exp(np.mean(np.log(vals))):.2f}× "
                          f"over {len(vals)} kernels")
    if losses:
        console.print(f"proxy-selected tile vs best full kernel in the top-{args.top_k}: "
                      f"mean loss {np.mean(losses):.2%}, max {np.max(losses):.2%} over {len(losses)} kernels")


if __name__ == "__main__":
    main()
