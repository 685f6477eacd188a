"""The tables of issue 14's H100 session, from the Parquet files beside this script (one folder per
device call, a–m, each with the log of the command that made it). Prints Markdown; nothing here
is typed in.

    PYTHONPATH=. python benchmarks/results/gpu-h100/summarize.py > benchmarks/results/gpu-h100/SUMMARY.md

(from the repository's root: it reads benchmarks.analysis; its estimate columns are those of the
calibration current when it runs, not of the session's. These files are the plan's before the device
program: their launch times are `measured_us`, read through analysis.launch_rows.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from benchmarks import analysis
from lospmm.devices import device_named
from lospmm.kernel.estimate import estimate_timer, estimated_timing

HERE = Path(__file__).resolve().parent

BASELINES = ("cublas_fp32", "cublas_tf32", "cublas_fp16", "cusparse_csr", "torch_csr")
BUSY_WAIT_CALLS = "cdefghl"  # calls a and b timed the libraries without the busy wait (host dispatch included)


def rows(call: str, name: str) -> list[dict]:
    p = HERE / call / f"{name}.parquet"
    got = pq.read_table(p).to_pylist() if p.exists() else []
    return analysis.launch_rows(got) if name.startswith("launches") else got


def table(header: list[str], body: list[list]) -> str:
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(fmt(v) for v in r) + " |" for r in body])


def speedups(ours: dict, baselines: dict) -> list[list]:
    out = []
    for model in [*sorted({k[0] for k in ours}), "all"]:
        keys = [k for k in ours if model in ("all", k[0]) and np.isfinite(ours[k])]
        out.append([model, len(keys)] + [analysis.geomean([baselines[k][b] / ours[k] for k in keys]) for b in BASELINES])
    return out


def main() -> None:
    env = json.loads((HERE / "a" / "env.json").read_text())
    print(f"# lospmm on an {env['name']} (driver {env['nvidia_smi'].split(', ')[1]}, CUDA driver API "
          f"{env['driver_api']}, torch {env['torch']}, CuPy {env['cupy-cuda13x']}, cuda-bindings {env['cuda-bindings']})\n")
    checks = [r for c in "abdefgl" for r in rows(c, "check")]
    bad = [r for r in checks if r["status"] != "ok"]
    kernels = {(r["model"], r["layer"], r["m1"], r["n1"], r["nnz"]) for r in checks}
    print(f"**Device check**: {len(checks)} runs of {len(kernels)} emitted kernels (N in 1, 31, 32, 4096 and the "
          f"layer's N) against scipy in float64: {len(bad)} failed; largest relative error "
          f"{max(r['max_rel_error'] for r in checks):.2e}; the largest kernel {max(k[4] for k in kernels):,} nonzeros.\n")
    loader = rows("a", "loader")
    print(f"**Loader**: {len(loader)} kernels on torch and CuPy arrays; largest error "
          f"{max(max(r['torch_max_rel_error'], r['cupy_max_rel_error']) for r in loader):.2e}; torch vs CuPy "
          f"largest difference {max(r['torch_vs_cupy_max_abs'] for r in loader):g}.\n")
    print(f"**pytest -m gpu** (call m): `{(HERE / 'm' / 'pytest.txt').read_text().strip().splitlines()[-1]}`\n")

    # baselines: each layer's fastest of every busy-wait call that timed it (the libraries vary
    # between calls; ours repeat within 3%), so the speedups below are the conservative ones
    base: dict = {}
    for c in BUSY_WAIT_CALLS:
        for r in rows(c, "speedup"):
            k = (r["model"], r["sparsity"], r["layer"])
            for b in BASELINES:
                base.setdefault(k, {})[b] = min(base.get(k, {}).get(b, np.inf), r[f"{b}_us"])
    print("## Speedup of the emitted kernels (geometric means of baseline time / ours)\n")
    print("Median of 20 launches, L2 flushed before each and the GPU kept busy while the host enqueues "
          "(busy_wait_us=200), at the layer's N; baselines through torch and CuPy from Python.\n")
    print("One row per distinct layer shape (model, M, K, N); baselines are each layer's fastest over the "
          f"calls that timed it ({', '.join(BUSY_WAIT_CALLS)}): the libraries' times vary between calls "
          "(a few by several times), ours repeat within 5%, so these ratios are the conservative ones.\n")
    datasheet = {(r["model"], r["sparsity"], r["layer"]): r for c in "cdef" for r in rows(c, "speedup")}
    calibrated = {(r["model"], r["sparsity"], r["layer"]): r for r in rows("l", "speedup")}
    for s, note in ((0.9, "the calibration's training sparsity"), (0.95, "held out from the calibration")):
        got = {(k[0], k[2]): r["ours_us"] for k, r in calibrated.items() if k[1] == s}
        print(f"### Sparsity {s}, tiles chosen by the calibrated estimate (call l; {note})\n")
        print(table(["model", "layers", *(f"vs {b}" for b in BASELINES)],
                    speedups(got, {k: base[(k[0], s, k[1])] for k in got})) + "\n")
        ratio = [datasheet[k]["ours_us"] / calibrated[k]["ours_us"] for k in calibrated if k[1] == s]
        changed = sum(datasheet[k]["tile"] != calibrated[k]["tile"] for k in calibrated if k[1] == s)
        print(f"Against the datasheet estimate's tiles for the same layers (calls c, d): {changed} of {len(ratio)} "
              f"tiles changed; per-kernel time ratio geometric mean {analysis.geomean(ratio):.2f}×, "
              f"{sum(x > 1.05 for x in ratio)} faster and {sum(x < 0.95 for x in ratio)} slower by more than 5%; "
              f"summed time {sum(datasheet[k]['ours_us'] for k in calibrated if k[1] == s):.0f} → "
              f"{sum(r['ours_us'] for k, r in calibrated.items() if k[1] == s):.0f} µs.\n")
    print("### Tiles chosen by the datasheet estimate (calls c–f)\n")
    for s in (0.7, 0.9, 0.95):
        got = {(r["model"], r["layer"]): r["ours_us"] for c in "cdef" for r in rows(c, "speedup") if r["sparsity"] == s}
        print(f"Sparsity {s}:\n")
        print(table(["model", "layers", *(f"vs {b}" for b in BASELINES)],
                    speedups(got, {k: base[(k[0], s, k[1])] for k in got})) + "\n")

    print("## Table 4, measured: the proxy-chosen tile against the best full kernel of the top-10\n")
    h100 = device_named("h100")
    cal = estimate_timer(h100)
    for c, name in (("c", "launches-sample-0.9"), ("d", "launches-sample-0.7")):
        launches = rows(c, name)
        for r in launches:  # the calibrated estimate's choice too (the measured rows carry their work)
            r["datasheet_us"] = r["estimate_us"]
        t4 = analysis.table4_rows(launches)
        t4c = analysis.table4_rows([r | {"estimate_us": estimated_timing(analysis.launch_work(r), cal.device, cal.params).time_us}
                                   for r in launches])  # the shipped calibration, fitted on the 0.9 launches
        loss = [r["proxy_loss"] for r in t4]
        print(f"{name} ({len(t4)} layers): proxy choice within 2% of the best on {sum(x <= 0.02 for x in loss)}, "
              f"mean loss {np.mean(loss):.1%}, max {np.max(loss):.1%}; the datasheet estimate's choice: mean loss "
              f"{np.nanmean([r['estimate_loss'] for r in t4]):.1%}; the calibrated estimate's: "
              f"{np.nanmean([r['estimate_loss'] for r in t4c]):.1%}"
              + (" (this sample is in the calibration's training data)" if c == "c" else " (held out from the calibration)")
              + "\n")
        print(table(["model", "layer", "M×K×N", "best tile", "best µs", "proxy tile", "proxy loss", "datasheet-estimate tile",
                     "loss", "calibrated-estimate tile", "loss"],
                    [[a["model"], a["layer"], f"{a['m']}×{a['k']}×{a['n']}", a["best_tile"], a["best_us"], a["proxy_tile"],
                      f"{a['proxy_loss']:.1%}", a["estimate_tile"], f"{a['estimate_loss']:.1%}", b["estimate_tile"],
                      f"{b['estimate_loss']:.1%}"] for a, b in zip(t4, t4c)]) + "\n")

    print("## Implicit-im2col conv kernels (issue 13) on the device (call k)\n")
    print("Each against a float64 reference convolution at batch 1 and 3 (X random, Y poisoned with NaN), then "
          "timed at batch 4: the conv kernel, the GEMM kernel of the same A and tile on an already "
          "materialised im2col matrix (im2col's own cost not counted), and cuDNN's dense FP32 convolution "
          "(torch, TF32 off), median µs.\n")
    print(table(["case", "Cout", "K", "nnz", "tile", "max rel. error", "conv µs", "GEMM µs", "cuDNN FP32 µs", "spill B"],
                [[r["case"], r["m"], r["k"], r["nnz"], r["tile"], r["max_rel_error"], r["conv_us"], r["gemm_us"],
                  r["cudnn_fp32_us"], r["conv_spill_bytes"]] for r in rows("k", "conv-s0.9")]) + "\n")
    print("## A/B of the choices made blind\n")
    print("Sample c (0.9) ran its variants on each model's smallest sampled layer, sample d (0.7) on the largest.\n")
    ab = [r | {"sample": c} for c, name in (("c", "launches-sample-0.9"), ("d", "launches-sample-0.7"))
          for r in analysis.ab_rows(rows(c, name))]
    print(table(["sample", "model", "layer", "tile", "A vs B", "A µs", "B µs", "A/B", "datasheet estimate A/B"],
                [[r["sample"], r["model"], r["layer"], r["tile"], r["a_b"], r["a_us"], r["b_us"], r["a_over_b"],
                  r.get("estimate_a_over_b", "")] for r in ab]) + "\n")


if __name__ == "__main__":
    main()
