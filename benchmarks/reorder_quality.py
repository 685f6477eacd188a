"""Reorder quality: Σ nnc and max nnc of every candidate order (stages.reorder), against the identity
and a hypergraph partitioner alone, on three sets; each table's figures are measured on this run.

1. The paper's §4.3 experiment: 1024×1024, 98% sparse, 32 blocks of 32 rows; blocks i and i+16
   share a fraction R of their nonzero positions, adjacent blocks differ in nnz by a ratio; tiles
   of 32 rows. "today" is Algorithm 1 alone (the flow's order before several candidates).
2. Real trained models that a package ships (the ONNX models in the rapidocr_onnxruntime wheel: a
   CNN text detector and an SVTR text recogniser), magnitude-pruned per layer as the flow prunes
   weights, at each --sparsity and M1: Σ over layers per strategy, ratios to the identity and to
   the partitioner alone (Mt-KaHyPar, km1, ε = 0, run here for every layer whatever the budget),
   seconds per layer, and the layers where the kept order's Σ nnc is above the identity's (0 by
   construction).
3. The reorder stage's time per zoo model (every distinct layer, every default M1, the flow's
   defaults and random pruning), as `lospmm run --until reorder` spends it.

    pip install --no-deps rapidocr_onnxruntime   # the real models (its ONNX files only)
    python -m benchmarks.reorder_quality                       # all three sets
    python -m benchmarks.reorder_quality --sets real --onnx model.onnx:x:1x3x640x640

Figures depend on the machine (the time columns) but not the order columns: orders are deterministic.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from rich.console import Console
from rich.table import Table

from lospmm.stages.reorder import (STRATEGIES, ReorderParams, identity_tiles, layer_orders, partitioned_tiles,
                                   reordered_tiles, tile_stats)

M = K = 1024
BLOCKS, ROWS = 32, 32
RAPIDOCR = {"ch_PP-OCRv4_det_infer.onnx": "x:1x3x640x640", "ch_PP-OCRv4_rec_infer.onnx": "x:1x3x48x320"}


def similar_blocks_matrix(similarity: float, nnz_ratio: float, rng: np.random.Generator) -> sp.csr_matrix:
    """The §4.3 matrix: 98% sparse overall; block b+16 repeats `similarity` of block b's positions."""
    low = 0.04 / (1 + nnz_ratio)  # adjacent blocks at low and ratio·low average to 2% density
    dense = np.zeros((M, K), dtype=bool)
    cells = ROWS * K
    for b in range(BLOCKS // 2):
        count = int(round((low if b % 2 == 0 else low * nnz_ratio) * cells))
        first = rng.choice(cells, size=count, replace=False)
        shared = rng.choice(first, size=int(round(similarity * count)), replace=False)
        rest = rng.choice(np.setdiff1d(np.arange(cells), first), size=count - len(shared), replace=False)
        for blk, flat in ((b, first), (b + BLOCKS // 2, np.concatenate([shared, rest]))):
            block = np.zeros(cells, dtype=bool)
            block[flat] = True
            dense[blk * ROWS:(blk + 1) * ROWS] = block.reshape(ROWS, K)
    values = rng.standard_normal((M, K)).astype(np.float32)
    return sp.csr_matrix(np.where(dense, values, 0))


def _timed(make):
    t0 = time.perf_counter()
    out = make()
    return out, time.perf_counter() - t0


def synthetic_table(ratios, similarities, n: int, params: ReorderParams) -> Table:
    table = Table(title=f"§4.3: 1024×1024 at 98%, tiles of 32 rows (Σ nnc / max nnc; the kept order as the flow "
                        f"chooses it for N = {n}, budget {params.budget_seconds:g} s)")
    for c in ("nnz ratio", "R", "identity", "today (Alg. 1)", "partition alone", "kept", "kept order",
              "kept / today Σ", "kept / today max", "kept s", "partition s"):
        table.add_column(c)
    rng = np.random.default_rng(0)
    for ratio in ratios:
        for sim in similarities:
            a = similar_blocks_matrix(sim, ratio, rng)
            ident, alg1 = tile_stats(identity_tiles(a, ROWS)), tile_stats(reordered_tiles(a, ROWS))
            part_tiles, part_s = _timed(lambda: partitioned_tiles(a, ROWS, params))
            part = tile_stats(part_tiles)
            orders, kept_s = _timed(lambda: layer_orders(a, (ROWS,), n, params))
            r = orders[ROWS]
            kept = tile_stats(r.tiles)
            table.add_row(f"{ratio:g}", f"{sim:.1f}", *(f"{s.nnc_sum} / {s.max_nnc}" for s in (ident, alg1, part, kept)),
                          r.strategy, f"{kept.nnc_sum / alg1.nnc_sum:.3f}", f"{kept.max_nnc / alg1.max_nnc:.3f}",
                          f"{kept_s:.2f}", f"{part_s:.2f}")
    return table


def onnx_layers(spec: str) -> tuple[str, list[tuple[str, np.ndarray]]]:
    """(model name, [(layer, A)]) of an ONNX model given as PATH[:INPUT:DIMS], e.g. det.onnx:x:1x3x640x640."""
    from lospmm.flows.inputs.onnx_model import graph_weight_matrix, graph_weights

    path, _, shape = spec.partition(":")
    shapes = ()
    if shape:
        name, _, dims = shape.partition(":")
        shapes = ((name, tuple(int(d) for d in dims.split("x"))),)
    layers = [(w.name, graph_weight_matrix(path, w.name, shapes)) for w in graph_weights(path, shapes) if w.op]
    return Path(path).stem, [(name, a) for name, a in layers if a.shape[0] >= 2]


def shipped_models() -> list[str]:
    """The rapidocr wheel's ONNX models with their input shapes ([] when it is not installed)."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return []
    models = Path(list(spec.submodule_search_locations)[0]) / "models"
    return [f"{models / f}:{shape}" for f, shape in RAPIDOCR.items() if (models / f).exists()]


def real_tables(specs, sparsities, m1s, n: int, params: ReorderParams) -> list[Table]:
    from lospmm.stages.prune import magnitude_pruned

    detail = Table(title=f"real weights, magnitude-pruned per layer: Σ nnc per strategy over the layers where it ran "
                         f"(their count), as a ratio to the identity's on the same layers (kept: the flow's order for "
                         f"N = {n}, budget {params.budget_seconds:g} s per layer)")
    for c in ("model", "layers", "sparsity", "M1", "identity Σ", *(s for s in STRATEGIES if s != "identity"),
              "partition alone", "kept", "kept / partition alone", "max nnc: identity / kept", "kept above identity",
              "partition alone s/layer", "flow s/layer"):
        detail.add_column(c)
    summary = Table(title="real weights: kept Σ nnc over every layer and M1, against the targets "
                          "(≤ 0.85× identity on average, ≤ 1.00× the partitioner alone)")
    for c in ("model", "sparsity", "today (Alg. 1) / identity", "kept / identity",
              "kept / identity where the M1 can still win", "kept / partition alone",
              "refine-from-partition / partition alone", "kept orders"):
        summary.add_column(c)
    for spec in specs:
        model, layers = onnx_layers(spec)
        for sparsity in sparsities:
            pruned = [magnitude_pruned(a, sparsity) for _, a in layers]
            flow_s, orders = 0.0, []
            for a in pruned:
                o, s = _timed(lambda: layer_orders(a, m1s, n, params))
                flow_s += s
                orders.append(o)
            all_sums = {"identity": 0, "algorithm1": 0, "kept": 0, "partition alone": 0, "reach identity": 0,
                        "reach kept": 0}
            from_partition, partition_where, counts = 0, 0, {}
            for m1 in m1s:
                sums = dict.fromkeys(("identity", *STRATEGIES[1:], "partition alone", "kept", "reach identity",
                                      "reach kept"), 0)
                ran = dict.fromkeys(STRATEGIES, 0)
                ident_where = dict.fromkeys(STRATEGIES, 0)  # the identity's Σ nnc where each strategy ran
                ident_max = kept_max = above = 0
                part_s = 0.0
                for a, o in zip(pruned, orders):
                    r = o.get(m1)
                    if r is None or a.shape[0] <= m1:  # one tile: every order is the same
                        continue
                    for c in r.candidates:
                        if c.nnc_sum >= 0:
                            sums[c.strategy] += c.nnc_sum
                            ran[c.strategy] += 1
                            ident_where[c.strategy] += r.candidate("identity").nnc_sum
                    part_tiles, s = _timed(lambda: partitioned_tiles(a, m1, params))
                    part_s += s
                    part_sum = int(part_tiles.tile_nnc.sum())
                    sums["partition alone"] += part_sum
                    kept = tile_stats(r.tiles)
                    sums["kept"] += kept.nnc_sum
                    counts[r.strategy] = counts.get(r.strategy, 0) + 1
                    ident = r.candidate("identity")
                    ident_max, kept_max = max(ident_max, ident.max_nnc), max(kept_max, kept.max_nnc)
                    above += kept.nnc_sum > ident.nnc_sum
                    if not any("layer's cheapest" in c.note for c in r.candidates):  # this M1 can still win
                        sums["reach identity"] += ident.nnc_sum
                        sums["reach kept"] += kept.nnc_sum
                    refine = r.candidate("refine")
                    if refine is not None and "from partition" in refine.note and "kept over" not in refine.note:
                        from_partition += refine.nnc_sum
                        partition_where += part_sum
                pairs = max(ran["identity"], 1)
                for k in all_sums:
                    all_sums[k] += sums[k]
                base = max(sums["identity"], 1)
                detail.add_row(model, str(len(layers)), f"{sparsity:g}", str(m1), str(sums["identity"]),
                               *(f"{sums[s] / max(ident_where[s], 1):.3f} ({ran[s]})" if ran[s] else "-"
                                 for s in STRATEGIES[1:]),
                               f"{sums['partition alone'] / base:.3f}", f"{sums['kept'] / base:.3f}",
                               f"{sums['kept'] / max(sums['partition alone'], 1):.3f}", f"{ident_max} / {kept_max}",
                               str(above), f"{part_s / pairs:.3f}", f"{flow_s / len(layers):.3f}")
            base = max(all_sums["identity"], 1)
            summary.add_row(model, f"{sparsity:g}", f"{all_sums['algorithm1'] / base:.3f}",
                            f"{all_sums['kept'] / base:.3f}",
                            f"{all_sums['reach kept'] / max(all_sums['reach identity'], 1):.3f}",
                            f"{all_sums['kept'] / max(all_sums['partition alone'], 1):.3f}",
                            f"{from_partition / partition_where:.3f}" if partition_where else "-",
                            ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return [detail, summary]


def zoo_table(models, params: ReorderParams) -> Table:
    from lospmm.search import DEFAULT_M1
    from lospmm.stages.extract import zoo_shapes
    from lospmm.stages.prune import pruned_layer

    table = Table(title=f"the reorder stage per zoo model at 0.9 (every distinct layer, M1 in {list(DEFAULT_M1)}; "
                        "the flow's defaults): seconds, and Σ nnc against Algorithm 1 alone at M1 = 8")
    for c in ("model", "layers", "reorder s (all strategies)", "reorder s (Alg. 1 alone)", "kept / Alg. 1 at M1 8"):
        table.add_column(c)
    alone = ReorderParams(strategies=("identity", "algorithm1"))
    for model in models:
        layers = [pruned_layer(shape, 0.9).matrix for shape in zoo_shapes(model)]
        layers = [a for a in layers if a is not None]
        orders, all_s = _timed(lambda: [layer_orders(a, DEFAULT_M1, 4096, params) for a in layers])
        _, alg1_s = _timed(lambda: [layer_orders(a, DEFAULT_M1, 4096, alone) for a in layers])
        kept = sum(int(o[8].tiles.tile_nnc.sum()) for o in orders if 8 in o)
        alg1 = sum(o[8].candidate("algorithm1").nnc_sum for o in orders if 8 in o)
        table.add_row(model, str(len(layers)), f"{all_s:.1f}", f"{alg1_s:.1f}", f"{kept / max(alg1, 1):.3f}")
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", nargs="+", choices=("synthetic", "real", "zoo"), default=["synthetic", "real", "zoo"])
    ap.add_argument("--ratios", type=float, nargs="+", default=[1.0, 2.0, 3.0])
    ap.add_argument("--similarities", type=float, nargs="+", default=[0.0, 0.3, 0.6, 0.9])
    ap.add_argument("--onnx", nargs="+", default=None,
                    help="ONNX models as PATH[:INPUT:DIMS] (default: the rapidocr wheel's detector and recogniser)")
    ap.add_argument("--sparsity", type=float, nargs="+", default=[0.7, 0.9])
    ap.add_argument("--m1", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--n", type=int, default=4096, help="N the estimate prices orders for")
    ap.add_argument("--budget", type=float, default=ReorderParams.budget_seconds,
                    help="the partitioner's priced seconds per layer in the flow's choice (--reorder-budget)")
    ap.add_argument("--zoo", nargs="+", default=["shufflenetv2", "resnet50", "bert-base"])
    args = ap.parse_args()
    params = ReorderParams(budget_seconds=args.budget)
    layer_orders(sp.csr_matrix(np.eye(16, dtype=np.float32)), (8,), 64, params)  # JIT outside the timings
    console = Console(width=200)
    if "synthetic" in args.sets:
        console.print(synthetic_table(args.ratios, args.similarities, args.n, params))
    if "real" in args.sets:
        specs = args.onnx or shipped_models()
        if not specs:
            console.print("real weights left out: pip install --no-deps rapidocr_onnxruntime, or pass --onnx")
        else:
            for table in real_tables(specs, args.sparsity, tuple(args.m1), args.n, params):
                console.print(table)
    if "zoo" in args.sets:
        console.print(zoo_table(args.zoo, params))


if __name__ == "__main__":
    main()
