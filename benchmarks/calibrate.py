"""Fit the estimate's physical parameters (lospmm.kernel.estimate.PHYSICAL_BOUNDS) to measured
launches and report before and after, on the launches it was fitted on and on those held out; print
the values to ship in lospmm.kernel.estimate.CALIBRATIONS. No GPU needed.

    python -m benchmarks.calibrate FILE [FILE ...] [--split layer|sparsity] [--train-sparsity 0.9] [--gpu h100]
    python -m benchmarks.calibrate --nm benchmarks/results/h200/nm-spmm/kernel-speed-nm-spmm.parquet

FILEs are the device program's kernel-speed-*.parquet (every launch with its work: per-tile loads and
multiply-adds, registers, spills), or the launches-*.parquet and speedup.parquet of the plan before
it. `--split layer` (default) holds out half of the layers (by a hash of model and layer: other
matrices, other shapes) at every sparsity; `--split sparsity` trains on --train-sparsity and holds
out the others. `--nm`: the N:M kernel's two loop parameters (estimate.NM_BOUNDS) fitted to its
measured launches (design nm), each shape held out in turn, then on all of them.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
import zlib
from pathlib import Path

import numpy as np

from benchmarks.analysis import calibration_rows, launch_rows, launch_work, print_table


def speedup_launch_rows(rows: list[dict]) -> list[dict]:
    """The plan-before's speedup rows (emitted kernels at the layer's N) as launch rows: role full,
    the flow's own variant, their measured time."""
    return [r | {"role": "full", "variant": "", "ours_us": r["ours_us"], "status": "ok"} for r in rows
            if "tile_loads" in r and np.isfinite(r["ours_us"])]


def nm_work(row: dict):
    """The estimate's NMWork of a measured N:M launch: its blocking from the row (`nm`: block rows and
    columns, thread rows and columns, depth, gather), or, for a row measured before rows carried it,
    from its block rows and threads (unique among nm.BLOCKINGS) with whole-chunk 32-column stages, the
    only kernel there was then."""
    from lospmm.kernel.design import design_named
    from lospmm.kernel.estimate import NMWork
    from lospmm.kernel.nm import BLOCKINGS, NMTiling
    from lospmm.stages.prune import nm_pattern

    pattern = nm_pattern(row["prune"])
    if row.get("nm"):
        from benchmarks.sets import nm_tiling_from

        tiling = nm_tiling_from(pattern, row["nm"])
    else:
        rows, cols, trows, tcols = next(b for b in BLOCKINGS if b[0] == row["m1"]
                                        and (b[0] // b[2]) * (b[1] // b[3]) == row["n1"])
        tiling = NMTiling(pattern.n, pattern.m, pattern.vector, rows, cols, trows, tcols, 32, False)
    return NMWork(tiling, row["m"], row["k"], row["n"], int(row["registers"]), design_named(row["design"]).number,
                  bool(row.get("conv")))  # a conv step's N:M kernel gathers its pixels' inputs


def nm_main(paths: list[str], gpu: str) -> None:
    """--nm: the N:M loop's parameters fitted to measured launches, each shape held out in turn."""
    import pyarrow.parquet as pq

    from lospmm.devices import device_named
    from lospmm.kernel.estimate import NM_BOUNDS, calibrated_nm, estimate_timer, nm_timing

    from benchmarks.device import with_plan_columns

    rows = [r for path in paths for r in with_plan_columns(pq.read_table(path).to_pylist())
            if str(r.get("design", "")).startswith("nm") and r.get("status") == "ok" and np.isfinite(r["ours_us"])]
    if not rows:
        raise SystemExit("no measured N:M launch (design nm, status ok) in the files given")
    timer = estimate_timer(device_named(gpu))
    works = [nm_work(r) for r in rows]
    measured = np.array([r["ours_us"] for r in rows])

    def error(params, keep) -> float:
        est = np.array([nm_timing(w, timer.device, params).time_us for w, k in zip(works, keep) if k])
        return float(np.median(np.abs(np.log(est / measured[keep]))))

    # the model before the loop's parameters: its issue bound at the full rate with any warps resident
    full_rate = replace(timer.params, nm_issue_efficiency=1.0, nm_warps_to_fill=NM_BOUNDS["nm_warps_to_fill"][0])
    shapes = sorted({r["layer"] for r in rows})
    table = []
    for held in shapes:
        out = np.array([r["layer"] == held for r in rows])
        fitted = calibrated_nm([w for w, o in zip(works, out) if not o], measured[~out], timer.device, timer.params)
        table.append({"held out": held, "launches": int(out.sum()),
                      **{k: round(getattr(fitted, k), 3) for k in NM_BOUNDS},
                      "median |log error| at full rate": error(full_rate, out),
                      "shipped": error(timer.params, out), "fitted on the others": error(fitted, out)})
    print_table(f"the N:M loop's parameters on {len(rows)} launches ({timer.name}), each shape held out", table)
    fitted = calibrated_nm(works, measured, timer.device, timer.params)
    every = np.ones(len(rows), bool)
    print(f"fitted on all {len(rows)}: {({k: round(getattr(fitted, k), 4) for k in NM_BOUNDS})}; median |log error| "
          f"{error(full_rate, every):.3f} at full rate, {error(timer.params, every):.3f} shipped, "
          f"{error(fitted, every):.3f} fitted")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("launches", nargs="+", help="kernel-speed-*.parquet (or launches-*.parquet, speedup.parquet)")
    p.add_argument("--nm", action="store_true", help="fit the N:M kernel's loop parameters to its launches instead")
    p.add_argument("--train-sparsity", type=float, nargs="+", default=None,
                   help="with --split sparsity: launches at these sparsities (default 0.9) train the fit, all "
                        "others are held out")
    p.add_argument("--gpu", default="h100", help="the device table entry the fit starts from")
    p.add_argument("--split", choices=("layer", "sparsity"), default="layer",
                   help="hold out half of the layers (default) or the sparsities other than --train-sparsity")
    args = p.parse_args(argv)
    if args.nm:
        return nm_main(args.launches, args.gpu)
    import pyarrow.parquet as pq

    from lospmm.devices import device_named
    from lospmm.kernel.estimate import CALIBRATED_DEVICE, CALIBRATED_PARAMS, EstimateParams, calibrated_estimate

    device, params = device_named(args.gpu), EstimateParams()
    if args.train_sparsity is not None and args.split != "sparsity":
        raise SystemExit("--train-sparsity goes with --split sparsity (--split layer holds out layers at every sparsity)")
    train_sparsity = args.train_sparsity or [0.9]

    def trains(r: dict) -> bool:
        if args.split == "sparsity":
            return r["sparsity"] in train_sparsity
        return zlib.crc32(f"{r['model']}/{r['layer']}".encode()) % 2 == 0

    sets: dict[str, list[dict]] = {}
    for path in args.launches:
        rows = pq.read_table(path).to_pylist()
        rows = speedup_launch_rows(rows) if Path(path).stem.startswith("speedup") else launch_rows(rows)
        for r in rows:
            if "tile_loads" not in r or r.get("tile_loads") is None:
                continue  # a launch without its work (a kernel that did not compile) fits nothing
            split = "train" if trains(r) else "held-out"
            sets.setdefault(f"{split} {Path(path).parent.name}/{Path(path).stem} s{r['sparsity']:g}", []).append(r)
    sets = dict(sorted(sets.items()))
    train = [r for name, rows in sets.items() if name.startswith("train") for r in rows
             if r["variant"] in ("", "outside-top-k") and np.isfinite(r["ours_us"])]
    if not train:
        raise SystemExit("no measured launch to fit (finite time, the flow's own variant) in the files given")
    t0 = time.perf_counter()
    fitted_device, fitted_params = calibrated_estimate([launch_work(r) for r in train], [r["ours_us"] for r in train],
                                                       device, params)
    layers = {(r["model"], r["layer"]) for r in train}
    print(f"fitted on {len(train)} launches of {len(layers)} layers ({args.split} split"
          + (f" at sparsity {', '.join(map(str, train_sparsity))}" if args.split == "sparsity" else "")
          + f") in {time.perf_counter() - t0:.1f} s")
    values = {f: round(float(getattr(fitted_params, f)), 4) for f in CALIBRATED_PARAMS}
    values |= {f: round(float(getattr(fitted_device, f)), 4) for f in CALIBRATED_DEVICE}
    print(f"calibrated values for {args.gpu}: {values}")
    print_table("the datasheet estimate (before) and the calibrated one (after): Spearman pooled and mean within a layer, "
           "median |log(estimate/measured)|, and the loss of the estimate's choice among the measured top-K against "
           "the best", calibration_rows(sets, device, params, fitted_device, fitted_params))


if __name__ == "__main__":
    main()
