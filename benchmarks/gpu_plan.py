"""Issue 14's plan for a lent GPU: prepare here (no GPU), run there, read the tables anywhere.

    # here, once (no GPU): wheels the GPU machine lacks, emitted kernels of a run, a compiled sample
    python -m benchmarks.gpu_plan wheels
    python -m benchmarks.gpu_plan prepare --artifacts ARTIFACTS [--emitted shufflenetv2:0.9 ...]
    # on the GPU machine, in the checkout (bundles in .gpu/, wheels in .whl/): every step, or some
    python -m benchmarks.gpu_plan run OUT [--steps env pytest check loader speedup launches] [--budget-s 540]
    # anywhere, on a run's Parquet files: the tables again, and the estimate's calibration
    python -m benchmarks.gpu_plan report OUT
    python -m benchmarks.gpu_plan calibrate OUT/launches-*.parquet OUT/speedup.parquet [--train-sparsity 0.9]

Steps (each writes OUT/<step>.parquet or .json and prints its table; the plan stops by itself at
--budget-s, and a step cut short says how far it got):
  env       device, driver and library versions
  pytest    `pytest -m gpu` (needs prefect for one test: carried as wheels)
  check     every emitted kernel of the --check bundles against scipy for N in 1, 31, 32, 4096 and
            the layer's N
  loader    lospmm.loader on torch and on CuPy arrays, against scipy and each other
  speedup   ours vs cuBLAS (FP32 with TF32 off, TF32, FP16), cuSPARSE CSR and torch CSR, median of 20
            launches with L2 flushed, geometric means per model (the --speedup bundles)
  launches  the sample's proxies, top-K full kernels and A/B variants timed: Table 4 measured,
            Spearman of estimate vs measurement, the A/B table (then `calibrate`, anywhere)
  conv      the implicit-im2col conv kernels against a reference convolution, and timed against
            the GEMM kernel of the same A and cuDNN
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from benchmarks import gpuplan

STEPS = ("env", "pytest", "check", "loader", "speedup", "launches", "conv")
DEFAULT_EMITTED = ("shufflenetv2:0.9", "mobilenetv2:0.9", "resnet50:0.9", "bert-base:0.9", "bert-base:0.5:1000000:1")
DEFAULT_CHECK = ("shufflenetv2-s0.9", "mobilenetv2-s0.9", "bert-base-s0.5-nnz1000000")
DEFAULT_SPEEDUP = ("shufflenetv2-s0.9", "mobilenetv2-s0.9", "resnet50-s0.9", "bert-base-s0.9")


def _table(title: str, rows: list[dict], columns: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*[f"{r.get(c):.3g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in columns])
    Console(width=200).print(t)


def _write(out: Path, name: str, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if rows:
        pq.write_table(pa.Table.from_pylist(rows), out / f"{name}.parquet")


# What the GPU image already holds (its package list, as the workplace's KINDS.md read it on
# 2026-11-17); a wheel of one of these is not carried, so the image's own version is used.
ON_IMAGE = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers
flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx humanize hypothesis idna
imageio iniconfig interface-meta jax jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning linear-operator
lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro onnx onnx-ir onnxruntime
onnxscript opencv-python-headless optax opt-einsum optimistix packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
python-dateutil pyyaml regex requests rich safetensors scikit-learn scipy seaborn setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate threadpoolctl tifffile timm tokenizers toolz torch tqdm typer
typing-extensions typing-inspect urllib3 uvloop werkzeug wheel wrapt xarray xxhash yarl zipp""".split())
WHEELS = ("prefect==3.8.8", "fastapi==0.150.0", "lightgbm==4.7.0")  # the versions pyproject.toml resolves to here
PLATFORMS = ("manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def wheels(args) -> None:
    """The wheels (with their dependencies) that the GPU image lacks, for CPython 3.12 x86-64, into
    --dest (git-ignored): Prefect's stack for `pytest -m gpu`'s flow test, and LightGBM."""
    import re
    import shutil
    import tempfile

    dest = ROOT / args.dest
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.12",
               "--implementation", "cp", *(f"--platform={p}" for p in PLATFORMS), "-d", tmp, *WHEELS]
        if subprocess.run(cmd).returncode:
            raise SystemExit("pip download failed (is PyPI reachable?)")
        dest.mkdir(exist_ok=True)
        kept = []
        for whl in sorted(Path(tmp).glob("*.whl")):
            name = re.sub(r"[-_.]+", "-", whl.name.split("-")[0]).lower()
            if name not in ON_IMAGE:
                shutil.copy(whl, dest / whl.name)
                kept.append(whl.name)
    size = sum((dest / k).stat().st_size for k in kept)
    print(f"{len(kept)} wheels, {size / 2**20:.1f} MiB in {dest}")


def prepare(args) -> None:
    bundle = ROOT / args.bundle
    bundle.mkdir(parents=True, exist_ok=True)
    staging = Path(args.staging)
    # every requested bundle's run first: a missing one costs nothing already bundled
    missing = [spec for spec in args.emitted
               if gpuplan.emitted_run(Path(args.artifacts), spec.split(":")[0], float(spec.split(":")[1]), args.run) is None]
    if missing:
        print(f"no completed run under {args.artifacts} emitted {', '.join(missing)}", file=sys.stderr)
        raise SystemExit(1)
    for spec in args.emitted:
        model, sparsity, *rest = spec.split(":")
        limits = [int(x) for x in rest] + [0, 0]
        d = gpuplan.emitted_bundle(Path(args.artifacts), model, float(sparsity), staging, args.run, *limits[:2])
        if d is None:
            print(f"no completed run under {args.artifacts} emitted {model} at {sparsity}", file=sys.stderr)
            raise SystemExit(1)
        archive = gpuplan.packed(d, bundle / f"emitted-{d.name}.tar.xz")
        print(f"{archive.name}: {len(json.loads((d / 'index.json').read_text()))} kernels, "
              f"{archive.stat().st_size / 2**20:.1f} MiB")
    if args.conv:
        d = gpuplan.conv_bundle(staging)
        archive = gpuplan.packed(d, bundle / f"{d.name}.tar.xz")
        print(f"{archive.name}: {archive.stat().st_size / 2**20:.1f} MiB")
    if args.sample:
        for sparsity in args.sample_sparsity:
            params = gpuplan.SampleParams(sparsity=sparsity, per_model=args.per_model, every_kept=args.every_kept)
            d = gpuplan.sample_bundle(params, staging, args.jobs)
            archive = gpuplan.packed(d, bundle / f"{d.name}.tar.xz")
            print(f"{archive.name}: {archive.stat().st_size / 2**20:.1f} MiB")
    total = sum(f.stat().st_size for f in bundle.glob("*.tar.xz"))
    print(f"{bundle}: {total / 2**20:.1f} MiB in all (a device call carries at most 64 MiB with the checkout)")


def run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = gpuplan.Deadline.after(args.budget_s)
    unpacked = {p.name: p for p in gpuplan.unpacked(ROOT / args.bundle, Path(args.unpack))}
    print(f"bundles: {', '.join(sorted(unpacked)) or 'none'}", flush=True)
    steps = args.steps

    def rows_of(names):
        missing = [n for n in names if f"emitted-{n}" not in unpacked and n not in unpacked]
        if missing:
            print(f"not in the bundle: {', '.join(missing)}", flush=True)
        return [r for n in names if n in unpacked for r in gpuplan.emitted_rows(unpacked[n])]

    if "env" in steps:
        facts = gpuplan.env_facts()
        (out / "env.json").write_text(json.dumps(facts, indent=1))
        print(json.dumps(facts), flush=True)
    if "pytest" in steps:
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", str(ROOT / "tests")]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=max(30, min(300, deadline.left())))
            text, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            partial = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            text, rc = f"{partial}\nstopped after {e.timeout:.0f} s", 124
        (out / "pytest.txt").write_text(text)
        print(f"pytest -m gpu: exit {rc} in {time.perf_counter() - t0:.0f} s\n" + "\n".join(text.splitlines()[-15:]),
              flush=True)
    if "check" in steps:
        rows = rows_of(args.check)
        got = gpuplan.device_check_rows(rows, deadline=deadline)
        _write(out, "check", got)
        bad = [r for r in got if r["status"] != "ok"]
        print(f"check: {len(got)} runs of {len({(r['model'], r['layer']) for r in got})} of {len(rows)} kernels, "
              f"{len(bad)} not ok; max error {max((r['max_rel_error'] for r in got), default=float('nan')):.2e}",
              flush=True)
        _table("device check failures", bad[:30], ["model", "layer", "n", "max_rel_error", "status", "message"])
    if "loader" in steps and not deadline.over():
        rows = rows_of(args.check)[:3]
        got = gpuplan.loader_rows(rows)
        _write(out, "loader", got)
        _table("loader: torch and CuPy", got, list(got[0]) if got else [])
    if "speedup" in steps and not deadline.over():
        rows = rows_of(args.speedup)
        got = gpuplan.speedup_rows(rows, deadline)
        _write(out, "speedup", got)
        print(f"speedup: {len(got)} distinct shapes timed", flush=True)
        report_speedup(got)
    if "launches" in steps and not deadline.over():
        for name in [n for n in unpacked if n.startswith("sample-")]:
            got = gpuplan.measured_launches(unpacked[name], deadline)
            _write(out, f"launches-{name}", got)
            report_launches(got)
    if "conv" in steps and not deadline.over():
        for name in [n for n in unpacked if n.startswith("conv-")]:
            got = gpuplan.conv_rows(unpacked[name])
            _write(out, name, got)
            _table("implicit-im2col conv kernels on the device (µs at batch 4)", got,
                   ["case", "m", "k", "nnz", "tile", "status", "max_rel_error", "conv_us", "gemm_us", "cudnn_fp32_us",
                    "conv_registers", "gemm_registers", "conv_spill_bytes", "message"])
    print(f"plan done, {args.budget_s - deadline.left():.0f} s; tables in {out}", flush=True)


def report_speedup(rows: list[dict]) -> None:
    cols = ["model", "layer", "m", "k", "n", "nnz", "tile", "ours_us", "cublas_fp32_us", "cublas_tf32_us",
            "cublas_fp16_us", "cusparse_csr_us", "torch_csr_us", "estimate_us"]
    _table("µs per SpMM (median of 20, L2 flushed)", rows, cols)
    summary = gpuplan.speedup_summary(rows)
    _table("geometric-mean speedup of ours over each baseline", summary, list(summary[0]) if summary else [])


def report_launches(rows: list[dict]) -> None:
    done = [r for r in rows if np.isfinite(r["measured_us"])]
    print(f"launches: {len(done)} of {len(rows)} measured", flush=True)
    t4 = gpuplan.table4_rows(rows)
    _table("Table 4, measured: the proxy-chosen tile's full kernel vs the best full kernel of the top-K", t4,
           ["model", "layer", "m", "k", "n", "candidates", "best_tile", "best_us", "proxy_tile", "proxy_loss",
            "estimate_tile", "estimate_loss", "spearman_proxy_full"])
    print("(estimate_*: the datasheet estimate the sample was prepared with; `calibrate` scores a calibrated one)")
    for role in ("proxy", "full"):
        mine = [r for r in done if r["role"] == role and r["variant"] == ""]
        print(f"Spearman datasheet estimate vs measured, {role}: {gpuplan.spearman([r['estimate_us'] for r in mine], [r['measured_us'] for r in mine]):.3f} "
              f"over {len(mine)} launches", flush=True)
    ab = gpuplan.ab_rows(rows)
    _table("A/B (a_over_b < 1: a is faster)", ab, ["model", "layer", "tile", "a_b", "a_us", "b_us", "a_over_b",
                                                  "estimate_a_over_b", "a_spill_bytes", "b_spill_bytes"])


def report(args) -> None:
    import pyarrow.parquet as pq

    out = Path(args.out)
    if (out / "speedup.parquet").exists():
        report_speedup(pq.read_table(out / "speedup.parquet").to_pylist())
    for p in sorted(out.glob("launches-*.parquet")):
        report_launches(pq.read_table(p).to_pylist())


def calibrate(args) -> None:
    """Fit the estimate's physical parameters (timing.PHYSICAL_BOUNDS) to measured launches and
    report before/after on the launches it was fitted on and on those held out, and print the
    values to ship in lospmm.stages.timing.CALIBRATIONS. `--split layer` (default) holds out half of
    the layers (by a hash of model and layer: other matrices, other shapes) at every sparsity;
    `--split sparsity` trains on --train-sparsity and holds out the others."""
    import zlib

    import pyarrow.parquet as pq

    from lospmm.stages.devices import device_named
    from lospmm.stages.timing import CALIBRATED_DEVICE, CALIBRATED_PARAMS, EstimateParams, calibrated_estimate

    device, params = device_named(args.gpu), EstimateParams()
    if args.train_sparsity is not None and args.split != "sparsity":
        raise SystemExit("--train-sparsity goes with --split sparsity (--split layer holds out layers at every sparsity)")
    args.train_sparsity = args.train_sparsity or [0.9]

    def trains(r: dict) -> bool:
        if args.split == "sparsity":
            return r["sparsity"] in args.train_sparsity
        return zlib.crc32(f"{r['model']}/{r['layer']}".encode()) % 2 == 0

    sets: dict[str, list[dict]] = {}
    for path in args.launches:  # launch lists, or speedup tables (their emitted kernels)
        rows = pq.read_table(path).to_pylist()
        rows = gpuplan.speedup_launch_rows(rows) if Path(path).stem.startswith("speedup") else rows
        for r in rows:
            split = "train" if trains(r) else "held-out"
            sets.setdefault(f"{split} {Path(path).parent.name}/{Path(path).stem} s{r['sparsity']:g}", []).append(r)
    sets = dict(sorted(sets.items()))
    train = [r for name, rows in sets.items() if name.startswith("train") for r in rows
             if r["variant"] in ("", "outside-top-k") and np.isfinite(r["measured_us"])]
    t0 = time.perf_counter()
    fitted_device, fitted_params = calibrated_estimate([gpuplan.launch_work(r) for r in train],
                                                       [r["measured_us"] for r in train], device, params)
    layers = {(r["model"], r["layer"]) for r in train}
    print(f"fitted on {len(train)} launches of {len(layers)} layers ({args.split} split"
          + (f" at sparsity {', '.join(map(str, args.train_sparsity))}" if args.split == "sparsity" else "")
          + f") in {time.perf_counter() - t0:.1f} s")
    values = {f: round(float(getattr(fitted_params, f)), 4) for f in CALIBRATED_PARAMS}
    values |= {f: round(float(getattr(fitted_device, f)), 4) for f in CALIBRATED_DEVICE}
    print(f"calibrated values for {args.gpu}: {values}")
    rows = gpuplan.calibration_rows(sets, device, params, fitted_device, fitted_params)
    _table("the datasheet estimate (before) and the calibrated one (after): Spearman pooled and mean within a "
           "layer, median |log(estimate/measured)|, and the loss of the estimate's choice among the measured "
           "top-K against the best", rows, list(dict.fromkeys(k for r in rows for k in r)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="bundle emitted kernels and compile the sample (no GPU)")
    p.add_argument("--artifacts", default="artifacts", help="the artifact root of a completed `lospmm run`")
    p.add_argument("--run", default=None, help="run id (prefix) to take emitted kernels from; default the latest")
    p.add_argument("--emitted", nargs="*", default=list(DEFAULT_EMITTED), help="MODEL:SPARSITY[:MIN_NNZ[:MAX_KERNELS]]")
    p.add_argument("--sample", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--sample-sparsity", type=float, nargs="+", default=[0.9])
    p.add_argument("--per-model", type=int, default=gpuplan.SampleParams.per_model,
                   help="sampled layers per model (10: issue 24's ≥ 40 layers)")
    p.add_argument("--every-kept", action="store_true",
                   help="issue 24's Table 4: every kept candidate's full kernel too (one cubin per kept M1, N1 at launch)")
    p.add_argument("--conv", action=argparse.BooleanOptionalAction, default=True,
                   help="the implicit-im2col conv cases (gpuplan.CONV_CASES)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    p.add_argument("--staging", default="/tmp/lospmm-gpu-staging")
    p.add_argument("--bundle", default=gpuplan.BUNDLE_DIR, help="where the archives go (one folder per device call)")
    p.set_defaults(fn=prepare)
    p = sub.add_parser("wheels", help="download the wheels the GPU image lacks (no GPU)")
    p.add_argument("--dest", default=".whl")
    p.set_defaults(fn=wheels)
    p = sub.add_parser("run", help="the plan on a GPU machine")
    p.add_argument("out")
    p.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    p.add_argument("--budget-s", type=float, default=540.0, help="the plan stops by itself after this long")
    p.add_argument("--bundle", default=gpuplan.BUNDLE_DIR, help="folder of *.tar.xz bundles, relative to the checkout")
    p.add_argument("--unpack", default="/tmp/lospmm-gpu", help="where the bundles are unpacked")
    p.add_argument("--check", nargs="*", default=list(DEFAULT_CHECK),
                   help="bundles (MODEL-sSPARSITY[-nnzMIN]) whose kernels the check and loader steps run")
    p.add_argument("--speedup", nargs="*", default=list(DEFAULT_SPEEDUP), help="bundles the speedup step times")
    p.set_defaults(fn=run)
    p = sub.add_parser("report", help="the speedup, Table 4 and A/B tables again from a run's Parquet files")
    p.add_argument("out")
    p.set_defaults(fn=report)
    p = sub.add_parser("calibrate", help="fit the estimate to measured launches (no GPU)")
    p.add_argument("launches", nargs="+", help="launches-*.parquet and speedup.parquet files from `run`")
    p.add_argument("--train-sparsity", type=float, nargs="+", default=None,
                   help="with --split sparsity: launches at these sparsities (default 0.9) train the fit, all "
                        "others are held out")
    p.add_argument("--gpu", default="h100", help="the device table entry the fit starts from")
    p.add_argument("--split", choices=("layer", "sparsity"), default="layer",
                   help="hold out half of the layers (default) or the sparsities other than --train-sparsity")
    p.set_defaults(fn=calibrate)
    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
