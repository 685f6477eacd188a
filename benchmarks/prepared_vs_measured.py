"""What a prepared bundle's new kernels are expected to change, before a window measures them (no
GPU): a step measured once (its launches committed under benchmarks/results/<device>/<step>/) whose
bundle was prepared again since (the search chose other tiles: a retrained ranker, a fixed
constraint) is compared launch by launch, by layer, sparsity and N: how many kernels changed tile,
and per sparsity over the work-bound layers (cuBLAS SGEMM ≥ 15 µs, measured) the measured speedup
over SGEMM of the kernels measured, beside what the estimate gives for the old and the new kernels.
`new, scaled` multiplies each new kernel's estimate by its old kernel's measured / estimated time
(the estimate's own error on that layer, carried over). Every column but `measured` is an ESTIMATE,
written before the window so the window can say whether it held.

    python -m benchmarks.prepared_vs_measured headline-resnet50 [--device h100]
"""

from __future__ import annotations

import argparse
import math

from benchmarks import analysis
from benchmarks import bundle as bundles


def _key(r: dict) -> tuple:
    return (r.get("set"), r.get("model"), r.get("layer"), round(float(r["sparsity"]), 4), int(r["n"]),
            r.get("variant") or "", r.get("dtype") or "fp32")


def paired(prepared: list[dict], measured: list[dict]) -> list[dict]:
    """Each measured full kernel (launched `ok`) beside the prepared one of the same launch key."""
    new = {_key(r): r for r in prepared if r.get("role", "full") == "full" and r.get("estimate_us")}
    out = []
    for r in measured:
        if r.get("role", "full") != "full" or r.get("status") != "ok" or not math.isfinite(float(r["ours_us"])):
            continue
        p = new.get(_key(r))
        if p is None or not r.get("estimate_us"):
            continue
        out.append({"sparsity": float(r["sparsity"]), "sgemm_us": float(r.get("sgemm_us") or "nan"),
                    "measured_us": float(r["ours_us"]), "old_estimate_us": float(r["estimate_us"]),
                    "new_estimate_us": float(p["estimate_us"]), "old_tile": (r["m1"], r["n1"]),
                    "new_tile": (p["m1"], p["n1"]), "layer": r["layer"], "n": int(r["n"])})
    return out


def summary(pairs: list[dict]) -> list[dict]:
    """Per sparsity over the work-bound pairs: kernels, tiles changed, and geomean speedups over SGEMM
    measured (the old kernels) and estimated (old, new, new scaled by the old kernel's measured /
    estimated time); then the new kernels' estimate over the old's where the tile changed."""
    out = []
    for s in sorted({p["sparsity"] for p in pairs}):
        xs = [p for p in pairs if p["sparsity"] == s and p["sgemm_us"] >= analysis.WORK_BOUND_US]
        if not xs:
            continue
        changed = [p for p in xs if p["old_tile"] != p["new_tile"]]
        out.append({"sparsity": s, "work-bound kernels": len(xs), "tile changed": len(changed),
                    "vs SGEMM, measured (old)": analysis.geomean([p["sgemm_us"] / p["measured_us"] for p in xs]),
                    "vs SGEMM, estimate (old)": analysis.geomean([p["sgemm_us"] / p["old_estimate_us"] for p in xs]),
                    "vs SGEMM, estimate (new)": analysis.geomean([p["sgemm_us"] / p["new_estimate_us"] for p in xs]),
                    "vs SGEMM, new scaled": analysis.geomean(
                        [p["sgemm_us"] / (p["new_estimate_us"] * p["measured_us"] / p["old_estimate_us"]) for p in xs]),
                    "new / old estimate (changed tiles)": analysis.geomean(
                        [p["new_estimate_us"] / p["old_estimate_us"] for p in changed]) if changed else float("nan")})
    return out


def main(argv=None) -> None:
    import pyarrow.parquet as pq

    from benchmarks.device import RESULTS, step_named

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", help="a device program step measured once and prepared again (headline-resnet50)")
    p.add_argument("--device", default="h100", help="the results folder of the measured launches")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    step = step_named(args.step)
    folder = RESULTS / args.device / step.name
    measured = [r for f in sorted(folder.glob("kernel-speed-*.parquet")) for r in pq.read_table(f).to_pylist()]
    missing = [spec.name for spec in step.bundles if not (bundles.HOME / spec.name / "launches.parquet").is_file()]
    if missing:
        raise SystemExit(f"{step.name}: no prepared bundle {', '.join(missing)} under {bundles.HOME} "
                         f"(python -m benchmarks.device prepare {step.name})")
    if not measured:
        raise SystemExit(f"{step.name}: no measured launches under {folder}")
    prepared = [r for spec in step.bundles for r in bundles.bundle_rows(bundles.HOME / spec.name)]
    pairs = paired(prepared, measured)
    analysis.set_table_format("markdown" if args.markdown else "terminal")
    analysis.print_table(f"{step.name}: the prepared bundle's kernels against those measured on {args.device} "
                         f"({len(pairs)} launches paired; every column but 'measured' an ESTIMATE)", summary(pairs))


if __name__ == "__main__":
    main()
