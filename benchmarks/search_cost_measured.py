"""The paper's Table 2, measured: search seconds per kernel for three strategies, every compile real.

- compile-all: the full kernel of every kept (M1, N1) candidate (what EC-SpMM does after its
  constraints), stopped once its compile seconds pass --limit and then reported as "> limit";
- LO-SpMM: the search without the ranker, one proxy per kept M1, then the chosen full kernel;
- LO-SpMM-Rank: the same with the ranker's top-10 (the flow's default).

Each strategy's seconds are its search stages (reorder, constrain, rank, cluster, pad: the flow's
own `layer_search`, timed per stage), its proxy compiles, the proxies' timing (the `estimate`
timer the flow uses without a GPU) and its full kernel's compile. Compiles are NVRTC's own seconds
(`Compiled.seconds`) in this process; a source compiled twice is compiled once and its seconds
counted for every strategy that needs it. Sample: per model and sparsity, the smallest layer and
the lower-quartile layer by nonzeros (two distinct shapes), so 4 models × 5 sparsities × 2 = 40
kernels. One JSON line per kernel goes to --log as it finishes; a second run skips what the log has.

    python -m benchmarks.search_cost_measured [--limit 60] [--jobs 2] [--log benchmarks/results/search_cost_measured.jsonl]
    python -m benchmarks.search_cost_measured --report-only --plot benchmarks/results/search_cost_measured.png
    python -m benchmarks.search_cost_measured --designs   # the design searched (--design auto) against Rank
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

MODELS = ("bert-base", "resnet50", "mobilenetv2", "shufflenetv2")
SPARSITIES = (0.5, 0.7, 0.8, 0.9, 0.95)
STAGES = ("reorder", "constrain", "rank", "cluster", "pad")

from benchmarks.analysis import geomean


def sample() -> list[tuple[str, str, float]]:
    """(model, layer, sparsity): per model and sparsity, the smallest and the lower-quartile distinct shape."""
    from lospmm.stages.extract import zoo_shapes

    out = []
    for model in MODELS:
        seen, shapes = set(), []
        for s in zoo_shapes(model):
            if s.ok and (s.m, s.k, s.n) not in seen:
                seen.add((s.m, s.k, s.n))
                shapes.append(s)
        shapes.sort(key=lambda s: (s.m * s.k, s.n))
        picks = sorted({0, len(shapes) // 4}) if len(shapes) > 1 else [0]
        if len(picks) == 1 and len(shapes) > 1:
            picks = [0, 1]
        for sparsity in SPARSITIES:
            out.extend((model, shapes[i].layer, sparsity) for i in picks)
    return out


_WARM = False


def _warm_up(device) -> None:
    """Numba compiles Algorithm 1 on its first call in a process: do that before anything is timed,
    so that no strategy is charged for it."""
    global _WARM
    if not _WARM:
        from lospmm.stages.prune import random_pruned
        from lospmm.search import SearchParams, layer_search
        from lospmm.stages.rank import RankParams

        a = random_pruned(64, 64, 0.8, np.random.default_rng(0))
        layer_search(a, 256, 0.8, device, None, SearchParams(rank=RankParams(use_rank=False)))
        _WARM = True


def kernel_cost(model: str, layer: str, sparsity: float, limit: float, gpu: str = "h100",
                designs_only: bool = False) -> dict:
    """The three strategies' seconds for one kernel (see the module docstring); with `designs_only`,
    LO-SpMM-Rank and the same search with `--design auto`'s design dimension (every candidate
    design's tiles ranked together by the design-aware ranker) instead."""
    from lospmm.flows.storage.ranker_store import load_ranker
    from lospmm.stages.compile import compiled_kernel, kernel_options
    from lospmm.devices import device_named
    from lospmm.stages.extract import zoo_shapes
    from lospmm.stages.prune import pruned_layer
    from lospmm.stages.rank import FEATURES, RankParams, ranker_features
    from lospmm.search import SearchParams, choice, full_source, layer_search, proxy_timings
    from lospmm.kernel.estimate import estimate_timer

    device = device_named(gpu)
    timer = estimate_timer(device)
    _warm_up(device)
    shape = next(s for s in zoo_shapes(model) if s.layer == layer)
    a = pruned_layer(shape, sparsity).matrix
    compiles: dict[str, object] = {}  # source sha256 -> Compiled

    def compile_once(kernel, m1):
        key = kernel.sha256
        if key not in compiles:
            compiles[key] = compiled_kernel(kernel, kernel_options(device.arch, m1, design=kernel.spec.design))
        return compiles[key]

    def strategy(booster, params, features=FEATURES) -> dict:
        search = layer_search(a, shape.n, sparsity, device, booster, params, features, op=shape.op)
        out = {f"{st}_s": search.seconds[st] for st in STAGES}
        proxy_s = 0.0

        def compiled_of(kernel, m1):  # compiles are charged as compile time, the rest of the stages as time
            nonlocal proxy_s
            t0 = time.perf_counter()
            c = compile_once(kernel, m1)
            proxy_s += c.seconds
            excluded[0] += time.perf_counter() - t0
            return c

        excluded = [0.0]
        t0 = time.perf_counter()
        # stages 8-9 as the flow runs them; time_s: the proxies' generation and timing (their compiles apart)
        timed = proxy_timings(search, shape.m, shape.k, shape.n, timer, compiled_of)
        out["time_s"] = time.perf_counter() - t0 - excluded[0]
        picked = choice(timed, timer.measures)
        out |= {"proxy_compile_s": proxy_s, "proxies": len(search.clusters), "candidates": len(search.launches),
                "kept": len(search.kept), "tile": f"{picked[0]}×{picked[1]}" if picked else "",
                "design": picked[2] if picked else ""}
        out["full_compile_s"] = compile_once(full_source(a, search, *picked), picked[0]).seconds if picked else 0.0
        out["total_s"] = sum(out[f"{st}_s"] for st in STAGES) + out["proxy_compile_s"] + out["time_s"] + out["full_compile_s"]
        return out, search

    booster, _ = load_ranker()
    head = {"model": model, "layer": layer, "sparsity": sparsity, "m": shape.m, "k": shape.k, "n": shape.n,
            "nnz": int(a.nnz)}
    if designs_only:
        from lospmm.flows.config import run_designs
        from lospmm.flows.storage.ranker_store import SHIPPED_DESIGNS

        aware, meta = load_ranker(SHIPPED_DESIGNS)
        rank, _ = strategy(booster, SearchParams())
        designs, _ = strategy(aware, SearchParams(designs=run_designs("auto")), ranker_features(meta))
        return head | {f"rank_{k}": v for k, v in rank.items()} | {f"designs_{k}": v for k, v in designs.items()}
    lo, search_all = strategy(None, SearchParams(rank=RankParams(use_rank=False)))
    rank, _ = strategy(booster, SearchParams())
    # compile-all: every kept candidate's full kernel, in the ranker-free search's order
    total, done = sum(search_all.seconds[st] for st in ("reorder", "constrain")), 0
    for c in search_all.kept:
        if total >= limit:
            break
        total += compile_once(full_source(a, search_all, c.m1, c.n1), c.m1).seconds
        done += 1
    return {"model": model, "layer": layer, "sparsity": sparsity, "m": shape.m, "k": shape.k, "n": shape.n,
            "nnz": int(a.nnz), "limit_s": limit, "compile_all_s": total, "compile_all_done": done,
            "compile_all_kept": len(search_all.kept), "compile_all_finished": done == len(search_all.kept),
            **{f"lo_{k}": v for k, v in lo.items()}, **{f"rank_{k}": v for k, v in rank.items()}}


def projected_compile_all(r: dict) -> float:
    """ESTIMATE: compile-all's seconds had it finished (its measured mean per kernel × kept)."""
    search = r["lo_reorder_s"] + r["lo_constrain_s"]
    return search + (r["compile_all_s"] - search) / max(r["compile_all_done"], 1) * r["compile_all_kept"]


def report(rows: list[dict], plot: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    t = Table(title=f"Table 2, measured: search seconds per kernel normalised to LO-SpMM-Rank ({len(rows)} kernels; "
                    f"compile-all stopped at {rows[0]['limit_s']:.0f} s: '≥' marks a lower bound)")
    for c in ("model", "kernels", "compile-all finished", "compile-all / Rank median", "geomean",
              "LO-SpMM / Rank median", "geomean", "Rank s median"):
        t.add_column(c)
    for model in [*MODELS, "all"]:
        mine = [r for r in rows if model in ("all", r["model"])]
        if not mine:
            continue
        ca = [r["compile_all_s"] / r["rank_total_s"] for r in mine]
        lo = [r["lo_total_s"] / r["rank_total_s"] for r in mine]
        bound = "" if all(r["compile_all_finished"] for r in mine) else "≥ "
        t.add_row(model, str(len(mine)), f"{sum(r['compile_all_finished'] for r in mine)}/{len(mine)}",
                  f"{bound}{np.median(ca):.1f}×", f"{bound}{geomean(ca):.1f}×", f"{np.median(lo):.2f}×",
                  f"{geomean(lo):.2f}×", f"{np.median([r['rank_total_s'] for r in mine]):.2f}")
    console.print(t)
    est = Table(title="NOT MEASURED, an ESTIMATE beside the headline: compile-all projected as its measured mean "
                      "seconds per full kernel × kept candidates, for the kernels it did not finish")
    for c in ("model", "kernels projected", "projected compile-all / Rank median", "geomean"):
        est.add_column(c)
    for model in [*MODELS, "all"]:
        mine = [r for r in rows if model in ("all", r["model"]) and not r["compile_all_finished"] and r["compile_all_done"]]
        if mine:
            ratio = [projected_compile_all(r) / r["rank_total_s"] for r in mine]
            est.add_row(model, str(len(mine)), f"{np.median(ratio):.0f}×", f"{geomean(ratio):.0f}×")
    console.print(est)
    split = Table(title="where LO-SpMM-Rank's seconds go (sum over the sample)")
    parts = [*STAGES, "proxy_compile", "time", "full_compile"]
    for c in ("model", *parts, "total s"):
        split.add_column(c)
    for model in [*MODELS, "all"]:
        mine = [r for r in rows if model in ("all", r["model"])]
        total = sum(r["rank_total_s"] for r in mine)
        if total:
            split.add_row(model, *[f"{sum(r[f'rank_{p}_s'] for r in mine) / total:.1%}" for p in parts], f"{total:.0f}")
    console.print(split)
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        order = sorted(rows, key=lambda r: r["rank_total_s"])
        x = np.arange(len(order))
        fig, ax = plt.subplots(figsize=(11, 4.5))
        ax.scatter(x, [r["rank_total_s"] for r in order], s=18, label="LO-SpMM-Rank (top-10 proxies)", zorder=3)
        ax.scatter(x, [r["lo_total_s"] for r in order], s=18, marker="s", label="LO-SpMM (a proxy per kept M1)", zorder=3)
        done = [i for i, r in enumerate(order) if r["compile_all_finished"]]
        cut = [i for i, r in enumerate(order) if not r["compile_all_finished"]]
        ax.scatter(done, [order[i]["compile_all_s"] for i in done], s=22, marker="^", label="compile-all", zorder=3)
        ax.scatter(cut, [order[i]["compile_all_s"] for i in cut], s=22, marker="^", facecolors="none",
                   edgecolors="C2", label=f"compile-all, stopped at {order[0]['limit_s']:.0f} s (a lower bound)", zorder=3)
        ax.set_yscale("log")
        ax.set_xlabel("kernel (sorted by LO-SpMM-Rank's seconds)")
        ax.set_ylabel("search seconds (measured, one core)")
        ax.set_title("Search cost per kernel, 4 models × 5 sparsities × 2 layers (cf. the paper's Fig. 11)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(plot, dpi=120)
        console.print(f"wrote {plot}")


def designs_report(rows: list[dict]) -> None:
    """`--designs`: the design search's seconds against LO-SpMM-Rank's, per model (issue 35's target:
    at most 1.5×), and where they go."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    t = Table(title=f"search seconds per kernel with the design searched (--design auto: {len(rows)} kernels) over "
                    f"LO-SpMM-Rank's (the baseline design alone); target ≤ 1.5×")
    for c in ("model", "kernels", "designs / Rank median", "geomean", "max", "proxies (Rank → designs)",
              "served in another design", "Rank s median", "designs s median"):
        t.add_column(c)
    for model in [*MODELS, "all"]:
        mine = [r for r in rows if model in ("all", r["model"])]
        if not mine:
            continue
        ratio = [r["designs_total_s"] / r["rank_total_s"] for r in mine]
        other = sum(bool(r["designs_design"]) and not r["designs_design"].startswith("baked,based,tile-x,walks=1,v=1")
                    for r in mine)
        t.add_row(model, str(len(mine)), f"{np.median(ratio):.2f}×", f"{geomean(ratio):.2f}×", f"{max(ratio):.2f}×",
                  f"{sum(r['rank_proxies'] for r in mine)} → {sum(r['designs_proxies'] for r in mine)}",
                  f"{other}/{len(mine)}", f"{np.median([r['rank_total_s'] for r in mine]):.2f}",
                  f"{np.median([r['designs_total_s'] for r in mine]):.2f}")
    console.print(t)
    split = Table(title="where the design search's seconds go (sum over the sample)")
    parts = [*STAGES, "proxy_compile", "time", "full_compile"]
    for c in ("strategy", *parts, "total s"):
        split.add_column(c)
    for name in ("rank", "designs"):
        total = sum(r[f"{name}_total_s"] for r in rows)
        split.add_row(name, *[f"{sum(r[f'{name}_{p}_s'] for r in rows) / total:.1%}" for p in parts], f"{total:.0f}")
    console.print(split)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=float, default=60.0, help="compile-all's seconds per kernel before it stops")
    ap.add_argument("--jobs", type=int, default=2, help="kernels measured at once (one process each)")
    ap.add_argument("--log", default=str(ROOT / "benchmarks/results/search_cost_measured.jsonl"))
    ap.add_argument("--plot", default=None, help="PNG of seconds per kernel (log axis), e.g. …/search_cost_measured.png")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--designs", action="store_true", help="LO-SpMM-Rank against the same search over every "
                    "candidate design (--design auto, issue 35), no compile-all; log: search_cost_designs.jsonl")
    args = ap.parse_args()
    if args.designs and args.log == ap.get_default("log"):
        args.log = str(ROOT / "benchmarks/results/search_cost_designs.jsonl")
    log = Path(args.log)
    rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    if not args.report_only:
        have = {(r["model"], r["layer"], r["sparsity"]) for r in rows}
        todo = [job for job in sample() if job not in have]
        print(f"{len(todo)} kernels to measure ({len(have)} in {log})", flush=True)
        with ProcessPoolExecutor(args.jobs) as pool:
            futures = {pool.submit(kernel_cost, *job, args.limit, designs_only=args.designs): job for job in todo}
            for f in as_completed(futures):
                r = f.result()
                with log.open("a") as out:
                    out.write(json.dumps(r) + "\n")
                rows.append(r)
                if args.designs:
                    print(f"{r['model']} {r['layer']} s{r['sparsity']}: rank {r['rank_total_s']:.1f} s, designs "
                          f"{r['designs_total_s']:.1f} s ({r['designs_tile']} {r['designs_design']})", flush=True)
                    continue
                print(f"{r['model']} {r['layer']} s{r['sparsity']}: rank {r['rank_total_s']:.1f} s, lo {r['lo_total_s']:.1f} s, "
                      f"compile-all {'' if r['compile_all_finished'] else '> '}{r['compile_all_s']:.1f} s "
                      f"({r['compile_all_done']}/{r['compile_all_kept']})", flush=True)
    if rows:
        designs_report(rows) if args.designs else report(rows, args.plot)


if __name__ == "__main__":
    main()
