"""What the ranker's top-K leaves out on real layers, by the estimate (no GPU): for every distinct
layer of the zoo models at each sparsity and batch, every candidate the constrain stage keeps is
priced by the device's `estimate` timer (its full kernel at the §3.2 register prediction,
search.full_kernel_time: the price the search's proxies are checked against), and the ranker's
top-K is compared with all of them. `reach loss` = the cheapest in the top-K over the cheapest kept
− 1: what the search loses before any proxy is timed, however good the proxies. Every time here is
an ESTIMATE; the device's Table 4 step measures the same choice.

    python -m benchmarks.ranker_reach [--models resnet50 ...] [--sparsity 0.7 0.9 0.95]
        [--cnn-batch 4 32] [--ranker STEM ...] [--design chained|auto|LABEL] [--gpu h100] [--out FILE.parquet]

Every layer is its GEMM: a convolution's im2col form, whose candidates the ranker's features
describe alike (a run serves most convolutions with implicit-im2col kernels, a register or two more,
and one design fewer under `auto`: no conv form for v > 1). With `--design auto` the candidates span
the GEMM designs `run --design auto` searches, each priced by the estimate in its own design (the
raw estimate: emit compares designs by the device's design price on top of it). The default ranker
is the shipped one for the design: lospmm/models/ranker, ranker-half for a half design,
ranker-designs for `auto`.

With several --ranker stems (default: the shipped model) each is scored on the same candidates and
prices, so their rows compare directly. Layers are the zoo's synthetic pruned weights (stages.prune),
none of which any shipped ranker was trained on.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from lospmm.devices import device_named
from lospmm.flows.config import run_designs
from lospmm.kernel.design import design_named
from lospmm.kernel.estimate import estimate_timer
from lospmm.search import full_kernel_time, layer_tiles
from lospmm.stages.constrain import layer_candidates
from lospmm.stages.extract import ZooParams, zoo_shapes
from lospmm.stages.prune import pruned_layer
from lospmm.stages.rank import RankParams, chosen_candidates, feature_row, ranker_features
from lospmm.stages.reorder import tile_stats
from lospmm.status import Status

MODELS = ("resnet50", "bert-base", "mobilenetv2", "shufflenetv2")


def layer_prices(shape, sparsity: float, device, timer, designs) -> tuple[list, np.ndarray, int]:
    """The kept candidates of one layer (a GEMM: a convolution's im2col form, which the ranker's
    features describe alike) in each of `designs`, and each one's estimated full-kernel µs in its own."""
    pruned = pruned_layer(shape, sparsity)
    if pruned.status != Status.OK or pruned.matrix is None or pruned.matrix.nnz == 0:
        return [], np.zeros(0), 0
    matrix = pruned.matrix
    tiles = layer_tiles(matrix, shape.n)
    kept = [c for c in layer_candidates(shape.n, {m1: tile_stats(t) for m1, t in tiles.items()}, device,
                                        designs=designs) if c.kept]
    by_label = {d.label: d for d in designs}
    prices = np.array([full_kernel_time(timer, matrix, tiles[c.m1], shape.m, shape.k, shape.n, c.n1,
                                        by_label[c.design]) for c in kept])
    return kept, prices, matrix.shape[1]


def reach_rows(models, sparsities, cnn_batches, rankers: dict, design_label: str = "chained", gpu: str = "h100",
               top_k: int = RankParams().top_k, layers: tuple[str, ...] = ()) -> list[dict]:
    """One row per (layer, sparsity, batch, ranker): the cheapest kept candidate, the ranker's top-K's
    cheapest, the reach loss, and the M1 each sits at (`layers`: only these, by name)."""
    device = device_named(gpu)
    designs = run_designs(design_label) or (design_named(design_label),)
    timer = estimate_timer(device)
    rows = []
    for model in models:
        batches = (None,) if model == "bert-base" else tuple(cnn_batches)
        for batch in batches:
            zoo = ZooParams() if batch is None else ZooParams(cnn_batch=batch)
            for shape in zoo_shapes(model, zoo):
                if shape.status != Status.OK or shape.op not in ("linear", "conv") or (layers and shape.layer
                                                                                       not in layers):
                    continue
                for sparsity in sparsities:
                    kept, prices, k = layer_prices(shape, sparsity, device, timer, designs)
                    if not kept or not np.isfinite(prices).any():  # said in the table: `skipped`
                        rows.append({"model": model, "layer": shape.layer, "batch": batch or 0,
                                     "sparsity": sparsity, "skipped": "no kept candidate with a price"})
                        continue
                    best = int(np.argmin(prices))
                    feats = [feature_row(c, sparsity, k) for c in kept]
                    for name, (booster, features) in rankers.items():
                        _, ranks, chosen = chosen_candidates(feats, booster, RankParams(top_k=top_k), features)
                        top = np.flatnonzero(chosen)
                        pick = top[int(np.argmin(prices[top]))]  # inf when none of the top-K has a price
                        rows.append({"ranker": name, "model": model, "layer": shape.layer,
                                     "batch": batch or 0, "m": shape.m, "k": shape.k, "n": shape.n,
                                     "sparsity": sparsity, "kept": len(kept),
                                     "best_us": float(prices[best]), "best_m1": kept[best].m1,
                                     "best_n1": kept[best].n1, "best_design": kept[best].design,
                                     "top_design": kept[pick].design, "top_us": float(prices[pick]),
                                     "top_m1": kept[pick].m1, "top_n1": kept[pick].n1,
                                     "top_m1s": sorted({kept[i].m1 for i in top}),
                                     "best_rank": int(ranks[best]),
                                     "reach_loss": float(prices[pick] / prices[best] - 1)})
    return rows


def loaded_rankers(stems, design_label: str = "chained") -> dict:
    """{name: (booster, features)} of each ranker stem; none given: the shipped model for the design
    (the design-aware one for `auto`, the half one for a half design)."""
    from lospmm.flows.config import AUTO_DESIGN
    from lospmm.flows.storage.ranker_store import SHIPPED_DESIGNS, load_ranker, shipped_ranker

    if not stems:
        half = design_label != AUTO_DESIGN and design_named(design_label).number.is_half
        stems = [SHIPPED_DESIGNS if design_label == AUTO_DESIGN else shipped_ranker(half)]
    out = {}
    names = [Path(stem).name for stem in stems]
    for stem, name in zip(stems, names):
        booster, meta = load_ranker(Path(stem))
        # two stems of one name (a model and its copy elsewhere) keep apart by their path
        out[str(stem) if names.count(name) > 1 else name] = (booster, ranker_features(meta))
    return out


def summary(rows: list[dict]) -> list[dict]:
    """Per ranker, model and batch, then per ranker over all: layers, mean and worst reach loss, the
    share beyond 2%, and how often the cheapest kept candidate's M1 is outside the top-K's M1s."""
    skipped = [r for r in rows if r.get("skipped")]
    rows = [r for r in rows if not r.get("skipped")]

    def stats(rs: list[dict]) -> dict:
        loss = np.array([r["reach_loss"] for r in rs])
        return {"layers": len(rs), "mean loss": float(loss.mean()),
                "geomean top / best": float(np.exp(np.log1p(loss).mean())), "worst loss": float(loss.max()),
                "beyond 2%": float((loss > 0.02).mean()),
                "best M1 outside top-K": float(np.mean([r["best_m1"] not in r["top_m1s"] for r in rs]))}

    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r["ranker"], r["model"], r["batch"]), []).append(r)
    out = [{"ranker": ranker, "model": model, "batch": batch or "32x128", **stats(rs)}
           for (ranker, model, batch), rs in sorted(groups.items())]
    for ranker in sorted({r["ranker"] for r in rows}):
        out.append({"ranker": ranker, "model": "all", "batch": "",
                    **stats([r for r in rows if r["ranker"] == ranker]), "skipped": len(skipped)})
    return out


def main(argv=None) -> list[dict]:
    from benchmarks.analysis import print_table

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--sparsity", nargs="+", type=float, default=[0.7, 0.9, 0.95])
    p.add_argument("--cnn-batch", nargs="+", type=int, default=[4, 32])
    p.add_argument("--ranker", nargs="+", default=None, help="ranker model stems (default: the shipped one)")
    p.add_argument("--design", default="chained", help="a design's label, or 'auto': the candidates of every "
                   "design `run --design auto` searches, ranked together (give a design-aware ranker)")
    p.add_argument("--gpu", default="h100")
    p.add_argument("--top-k", type=int, default=RankParams().top_k)
    p.add_argument("--out", type=Path, default=None, help="every layer's row as Parquet")
    args = p.parse_args(argv)
    started = time.perf_counter()
    rankers = loaded_rankers(args.ranker, args.design)
    rows = reach_rows(args.models, args.sparsity, args.cnn_batch, rankers, args.design, args.gpu, args.top_k)
    table = summary(rows)
    print_table(f"the ranker's top-{args.top_k} against every kept candidate, priced by the {args.gpu} estimate "
                f"(ESTIMATES; design {args.design}; {time.perf_counter() - started:.0f} s)", table)
    if args.out:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), args.out)
    return table


if __name__ == "__main__":
    main()
