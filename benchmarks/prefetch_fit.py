"""The estimate's prefetch term fitted to measured same-tile pairs (the device program's prefetch-tiles
step): per layer, the kernel at prefetch depth P (4, 8) and at depth 1 on the same tile, both measured.
For each exponent of the grid the estimate (estimate.load_wait: a load's wait at depth P is
(2 / (1 + P))^exponent of its wait at depth 1) prices both kernels of every pair, and the fit keeps the
exponent whose depth-P over depth-1 ratios are nearest the measured ones (the mean squared log error);
it prints the table, and the leave-one-layer-out error of the fitted exponent. No GPU: every time is
measured, every ratio priced.

    python -m benchmarks.prefetch_fit [--results benchmarks/results/h200/prefetch-tiles] [--gpu h200]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from benchmarks.analysis import geomean, launch_work, print_table
from lospmm.devices import DEVICES
from lospmm.kernel.estimate import estimate_timer, estimated_timing

RESULTS = Path("benchmarks/results/h200/prefetch-tiles")
EXPONENTS = tuple(round(x, 2) for x in np.arange(0.0, 1.01, 0.05))


def same_tile_pairs(rows: list[dict]) -> list[tuple[dict, dict]]:
    """(depth P kernel, depth 1 kernel on its tile) of each layer and depth, both measured ok."""
    by: dict = {}
    for r in rows:
        if r.get("set") == "prefetch-tiles" and r.get("status") == "ok" and math.isfinite(float(r.get("ours_us") or "inf")):
            by.setdefault((r["model"], r["layer"]), {})[r["variant"]] = r
    return [(r, variants[f"{label}-tile"]) for variants in by.values() for label, r in sorted(variants.items())
            if label.startswith("prefetch-") and not label.endswith("-tile") and f"{label}-tile" in variants]


def priced_ratio(deep: dict, tile: dict, timer, exponent: float) -> float:
    """The estimate's depth-P over depth-1 time for one pair at `exponent`."""
    params = replace(timer.params, prefetch_exponent=exponent)
    times = [estimated_timing(launch_work(r), timer.device, params).time_us for r in (deep, tile)]
    return times[0] / times[1]


def log_error(pairs, timer, exponent: float) -> float:
    return float(np.mean([math.log(priced_ratio(d, t, timer, exponent) / (d["ours_us"] / t["ours_us"])) ** 2
                          for d, t in pairs]))


def fitted_exponent(pairs, timer, exponents=EXPONENTS) -> float:
    return min(exponents, key=lambda e: log_error(pairs, timer, e))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--gpu", default="h200", choices=sorted(DEVICES))
    args = ap.parse_args(argv)
    rows = pq.read_table(args.results / "kernel-speed-prefetch-tiles.parquet").to_pylist()
    pairs = same_tile_pairs(rows)
    if not pairs:
        raise SystemExit(f"{args.results}: no measured same-tile pairs")
    timer = estimate_timer(DEVICES[args.gpu])
    table = []
    for exponent in EXPONENTS:
        by_depth = {}
        for d, t in pairs:
            by_depth.setdefault(d["prefetch"], []).append(priced_ratio(d, t, timer, exponent))
        table.append({"exponent": exponent, "mean squared log error": round(log_error(pairs, timer, exponent), 5),
                      **{f"depth {p} / 1 priced (geomean)": round(geomean(v), 3) for p, v in sorted(by_depth.items())}})
    measured = {}
    for d, t in pairs:
        measured.setdefault(d["prefetch"], []).append(d["ours_us"] / t["ours_us"])
    print_table(f"the prefetch term on {len(pairs)} same-tile pairs ({args.results}, {timer.name}); measured: "
                + ", ".join(f"depth {p} {geomean(v):.3f}" for p, v in sorted(measured.items())), table)
    best = fitted_exponent(pairs, timer)
    layers = sorted({(d["model"], d["layer"]) for d, _ in pairs})
    held_out = []
    for layer in layers:  # the exponent fitted without the layer, judged on it
        rest = [(d, t) for d, t in pairs if (d["model"], d["layer"]) != layer]
        own = [(d, t) for d, t in pairs if (d["model"], d["layer"]) == layer]
        held_out.append(log_error(own, timer, fitted_exponent(rest, timer)))
    print(f"fitted exponent: {best} (mean squared log error {log_error(pairs, timer, best):.5f}; the old model, "
          f"exponent 1: {log_error(pairs, timer, 1.0):.5f}; leave one layer out: {np.mean(held_out):.5f} over "
          f"{len(layers)} layers)")


if __name__ == "__main__":
    main()
