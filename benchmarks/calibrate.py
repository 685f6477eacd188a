"""Fit the estimate's physical parameters (lospmm.kernel.estimate.PHYSICAL_BOUNDS) to measured
launches and report before and after, on the launches it was fitted on and on those held out; print
the values to ship in lospmm.kernel.estimate.CALIBRATIONS. No GPU needed.

    python -m benchmarks.calibrate FILE [FILE ...] [--split layer|sparsity] [--train-sparsity 0.9] [--gpu h100]

FILEs are the device program's kernel-speed-*.parquet (every launch with its work: per-tile loads and
multiply-adds, registers, spills), or the launches-*.parquet and speedup.parquet of the plan before
it. `--split layer` (default) holds out half of the layers (by a hash of model and layer: other
matrices, other shapes) at every sparsity; `--split sparsity` trains on --train-sparsity and holds
out the others.
"""

from __future__ import annotations

import argparse
import time
import zlib
from pathlib import Path

import numpy as np

from benchmarks.analysis import calibration_rows, launch_rows, launch_work, print_table


def speedup_launch_rows(rows: list[dict]) -> list[dict]:
    """The plan-before's speedup rows (emitted kernels at the layer's N) as launch rows: role full,
    the flow's own variant, their measured time."""
    return [r | {"role": "full", "variant": "", "ours_us": r["ours_us"], "status": "ok"} for r in rows
            if "tile_loads" in r and np.isfinite(r["ours_us"])]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("launches", nargs="+", help="kernel-speed-*.parquet (or launches-*.parquet, speedup.parquet)")
    p.add_argument("--train-sparsity", type=float, nargs="+", default=None,
                   help="with --split sparsity: launches at these sparsities (default 0.9) train the fit, all "
                        "others are held out")
    p.add_argument("--gpu", default="h100", help="the device table entry the fit starts from")
    p.add_argument("--split", choices=("layer", "sparsity"), default="layer",
                   help="hold out half of the layers (default) or the sparsities other than --train-sparsity")
    args = p.parse_args(argv)
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
