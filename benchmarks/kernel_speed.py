"""Kernel speed on the device (issue 20): today's kernel against the new designs on the same tiles,
the diagnosis microbenchmarks, and the headline table against cuBLAS.

    # here, no GPU: kernels compiled for sm_90 into a bundle (.gpu/ is git-ignored), SASS statistics
    python -m benchmarks.kernel_speed build ab --bundle .gpu/ks-ab --jobs 2        # designs × layers at 0.9
    python -m benchmarks.kernel_speed build micro --bundle .gpu/ks-micro           # diagnosis kernels
    python -m benchmarks.kernel_speed sass --bundle .gpu/ks-ab                     # per-design SASS table
    python -m benchmarks.kernel_speed pack .gpu/ks-ab .gpu/ks-micro --into .gpu/carry  # xz: ~13× smaller, to carry
    # the headline set (every zoo GEMM layer at 0.7/0.9/0.95, CNN batch 4 and 32, BERT 32×128) in one
    # design, tiles chosen by the search's estimate; compiled where it runs (16 cores on the GPU machine)
    python -m benchmarks.kernel_speed build headline --design chained --bundle .gpu/ks-head --jobs 16
    # on the GPU (carry .gpu/carry): every kernel checked (N in 1, 31, 32, 4096 and the layer's N, C
    # poisoned with NaN), ours and cuBLAS FP32 (TF32 off), TF32 and FP16 timed the same way
    # (runtime.graph_timed); a bundle may be a folder or its .tar.xz
    python -m benchmarks.kernel_speed run OUT --bundle .gpu/carry/ks-ab.tar.xz --budget-s 500
    python -m benchmarks.kernel_speed report OUT/kernel-speed-ks-ab.parquet
    # issue 23's half set: the fp16 search's tile per layer, each half variant (fp16/bf16, packed / fp32
    # / promoted sums) and our fp32 kernel of the same columns per thread on it; `--layers ab` for the
    # A/B layers (built here), every GEMM layer by default (built on the device's cores)
    python -m benchmarks.kernel_speed build half --layers ab --bundle .gpu/ks-half --jobs 2
    python -m benchmarks.kernel_speed run OUT --bundle .gpu/carry/ks-half.tar.xz   # + OUT/half-precision-ks-half.parquet

A bundle is a folder: kernels.parquet (a row per kernel: its layer, tile, design, launch layout,
compile and SASS facts), <id>.cubin, and the pruned A of every layer under a/ (for the device
check). `run` writes OUT/kernel-speed-<bundle>.parquet with the issue's columns (model, layer, m,
k, n, nnz, sparsity, design, ours_us, sgemm_us, tf32_us, fp16_us, spread) and OUT/checks-<bundle>.parquet;
for half kernels also OUT/half-precision-<bundle>.parquet with issue 23's (model, layer, m, k, n,
nnz, sparsity, dtype, ours_us, cublas_same_dtype_us, ours_fp32_us, max_rel_error, cublas_max_rel_error):
half kernels are checked against the float64 product of the same rounded A and B within their
rounding bound, and cuBLAS's error in the same dtype is measured on the same data.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from benchmarks.gpuplan import Deadline, geomean, packed
from lospmm.sparse_file import read_matrix, write_matrix
from lospmm.stages.codegen import CodegenParams, KernelSource, LaunchLayout, design_named
from lospmm.stages.codegen_half import error_bound, precision_of, rounded_matrix
from lospmm.stages.extract import LayerShape, ZooParams, folded_duplicates, zoo_shapes
from lospmm.stages.reorder import reordered_tiles
from lospmm.stages.sources import kernel_source

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("bert-base", "resnet50", "mobilenetv2", "shufflenetv2")
CHECK_NS = (1, 31, 32, 4096)
WORK_BOUND_US = 15.0  # the work-bound layers: cuBLAS SGEMM at least this long at that N

# The A/B set: the worst and best rows of the committed H100 results at 0.9 (per-nonzero
# efficiency against cuBLAS, call l) and the largest layers, each on the tile measured there.
AB_LAYERS = (
    ("bert-base", "pooler.dense"), ("resnet50", "layer4.0.conv2"), ("resnet50", "layer4.0.conv3"),
    ("resnet50", "conv1"), ("resnet50", "layer1.0.conv2"), ("resnet50", "layer2.0.conv2"),
    ("resnet50", "layer3.0.downsample.0"), ("mobilenetv2", "features.18"), ("mobilenetv2", "features.7.conv.2"),
    ("bert-base", "encoder.layer.0.attention.self.query"), ("bert-base", "encoder.layer.0.intermediate.dense"),
)
AB_TILES_FROM = ROOT / "benchmarks/results/gpu-h100/l/speedup.parquet"
AB_DESIGNS = ("baseline", "chained", "chained,column-x", "chained,walks=4", "chained,walks=16", "chained,v=2",
              "chained,v=4", "chained,v=4,walks=4", "streamed,chained", "streamed,chained,v=4")


@dataclass(frozen=True)
class Planned:
    """One kernel to build: a layer's pruned A on a tile in a design."""

    id: str
    set: str
    model: str
    layer: str
    m: int
    k: int
    n: int
    sparsity: float
    batch: int
    design: str
    m1: int
    n1: int
    matrix: str  # file under a/
    chosen_by: str


# --- the sets -------------------------------------------------------------------------------------


def gemm_shapes(model: str, cnn_batch: int = 4) -> list[LayerShape]:
    """The zoo model's distinct GEMM layers (dense convolutions and linear layers) at `cnn_batch`."""
    shapes = folded_duplicates(zoo_shapes(model, ZooParams(cnn_batch=cnn_batch)))
    return [s for s in shapes if s.ok and (s.op == "linear" or (s.op == "conv" and s.groups == 1))]


def pruned(shape: LayerShape, sparsity: float) -> sp.csr_matrix:
    """The layer's A as the flow prunes a zoo layer (seeded random, PruneParams' defaults)."""
    from lospmm.stages.prune import pruned_layer

    return pruned_layer(shape, sparsity).matrix


def _tile_of(text: str) -> tuple[int, int]:
    m1, n1 = (int(x) for x in text.replace("x", "×").split("×"))
    return m1, n1


def _id(*parts) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(str(p) for p in parts))[:120]


def ab_plan(designs=AB_DESIGNS, layers=AB_LAYERS, sparsity: float = 0.9) -> list[Planned]:
    """Every design on each A/B layer's tile as measured in the committed results (today's kernel's)."""
    import pyarrow.parquet as pq

    measured = {(r["model"], r["layer"]): r for r in pq.read_table(AB_TILES_FROM).to_pylist()
                if r["sparsity"] == sparsity}
    out = []
    for model, layer in layers:
        shape = next(s for s in gemm_shapes(model) if s.layer == layer)
        m1, n1 = _tile_of(measured[(model, layer)]["tile"])
        for design in designs:
            out.append(Planned(_id("ab", model, layer, design), "ab", model, layer, shape.m, shape.k, shape.n, sparsity,
                               4 if model != "bert-base" else 32, design_named(design).label, m1, n1,
                               _id(model, layer, sparsity), f"today's tile (H100 call l, {AB_TILES_FROM.parent.name})"))
    return out


def micro_plan(n: int = 65536) -> list[Planned]:
    """The diagnosis kernels (synthetic A, M1 = 2, N1 = 128, chained loads):
    - footprint: one tile of 2 rows whose code grows from ~12 KB to ~0.8 MB, walked once by each of
      N/128 blocks (walks=1) or 16 column blocks by each block (walks=16): where the second is no
      faster per walk, the tile's code no longer fits the cache that served the repeats;
    - sharing: 32 tiles of ~512 nonzeros (~24 KB of code each), blocks of one tile dispatched
      together (column-x) or apart (tile-x), walked once or 16 times."""
    out = []
    for nnz in (256, 512, 1024, 2048, 4096, 16384):  # one function: ptxas is superlinear past ~16k
        for walks in (1, 16):
            design = design_named(f"chained,walks={walks}").label
            out.append(Planned(_id("micro-footprint", nnz, walks), "micro", "synthetic", f"footprint-{nnz}", 2,
                               2 * nnz, n, 0.75, 0, design, 2, 128, _id("synthetic-footprint", nnz), "fixed"))
    for order in ("tile-x", "column-x"):
        for walks in (1, 16):
            design = design_named(f"chained,{order},walks={walks}").label
            out.append(Planned(_id("micro-sharing", order, walks), "micro", "synthetic", "sharing-32x512", 64,
                               4096, n, 0.9375, 0, design, 2, 128, "synthetic-sharing", "fixed"))
    return out


def micro_matrix(name: str) -> sp.csr_matrix:
    """The synthetic A of a micro kernel: `footprint-NNZ` is 2 rows × 2·NNZ columns at density 1/4
    (NNZ nonzeros, one tile); `sharing` is 64 rows × 4096 at density 1/16 (32 tiles of ~512)."""
    from lospmm.stages.prune import random_pruned

    if name.startswith("synthetic-footprint"):
        nnz = int(name.rsplit("-", 1)[1])
        return random_pruned(2, 2 * nnz, 0.75, np.random.default_rng(nnz))
    return random_pruned(64, 4096, 0.9375, np.random.default_rng(64))


def headline_plan(design: str, sparsities=(0.7, 0.9, 0.95), batches=(4, 32), models=MODELS,
                  gpu: str = "h100") -> list[Planned]:
    """Every distinct zoo GEMM layer at each sparsity and CNN batch (BERT at 32×128 once), in
    `design`, on the tile the search chooses: the shipped ranker's top-10, timed by the estimate
    (the flow's choice without a GPU; registers predicted, not compiled)."""
    from lospmm.stages.devices import device_named
    from lospmm.stages.search import SearchParams
    from lospmm.stages.timing import estimate_timer

    device, kernel_design = device_named(gpu), design_named(design)
    timer = estimate_timer(device)
    out = []
    for model in models:
        for batch in (batches if model != "bert-base" else (32,)):
            for shape in gemm_shapes(model, batch):
                for sparsity in sparsities:
                    tile = searched_tile(shape, sparsity, kernel_design, device, timer)
                    if tile is None:
                        continue
                    out.append(Planned(_id("head", model, shape.layer, sparsity, batch, kernel_design.label),
                                       "headline", model, shape.layer, shape.m, shape.k, shape.n, sparsity, batch,
                                       kernel_design.label, tile[0], tile[1], _id(model, shape.layer, sparsity),
                                       f"search: ranker top-{SearchParams().rank.top_k}, proxies timed by {timer.name}"))
    return out


def searched_tile(shape: LayerShape, sparsity: float, design, device, timer) -> tuple[int, int] | None:
    """The tile the search chooses for the layer's pruned A (a half design's: A rounded to its dtype)
    in `design`: the shipped ranker of the design's kind, its top-10 proxies timed by `timer` (the
    flow's choice, search.choice). None for an empty layer."""
    from lospmm.stages.search import SearchParams, choice, layer_search
    from lospmm.stages.timing import LaunchUnderTest

    a = pruned(shape, sparsity)
    if a is None or a.nnz == 0:
        return None
    if design.half:
        a = rounded_matrix(a, design.dtype)[0]
    booster = _shipped_booster(design.half)
    search = layer_search(a, shape.n, sparsity, device, booster, SearchParams(design=design))
    timings = {(c.m1, c.n1): timer.time(LaunchUnderTest(
        search.tiles[c.m1], shape.m, shape.k, shape.n, c.n1, c.pred_regs,
        smem_bytes=search.launches[(c.m1, c.n1)].smem_bytes, clusters=search.clusters[c.m1],
        design=design)) for c in search.chosen}
    return choice(timings, timer.measures, {(c.m1, c.n1): c.pred_regs for c in search.chosen})


@functools.lru_cache(maxsize=None)
def _shipped_booster(half: bool):
    """The shipped ranker of a design's kind, loaded once for every layer of a plan."""
    from lospmm.flows.storage.ranker_store import load_ranker, shipped_ranker

    return load_ranker(shipped_ranker(half=half))[0]


# The half-precision set (issue 23): every variant of the half kernel on the tile the half search
# chooses, and the fp32 kernel with the same columns per thread and block on that tile.
HALF_VARIANTS = ("fp16,chained", "fp16,acc=f32,chained", "fp16,promote=8,chained", "bf16,chained",
                 "bf16,acc=f32,chained")
FP32_SAME_TILE = "chained,v=2"


def half_plan(sparsities=(0.9, 0.95), batches=(4, 32), models=MODELS, layers: tuple | None = None,
              variants=HALF_VARIANTS, gpu: str = "h100") -> list[Planned]:
    """Each distinct zoo GEMM layer (only `layers`, (model, layer) pairs, when given) at each
    sparsity and CNN batch (BERT at 32×128 once): the tile the fp16 search chooses (its design
    `fp16,chained`, the half ranker, the estimate), built in each half variant and as the fp32
    kernel of the same columns per thread and block (FP32_SAME_TILE) — issue 23's "our own fp32
    kernel on the same tiles"."""
    from lospmm.stages.devices import device_named
    from lospmm.stages.timing import estimate_timer

    device = device_named(gpu)
    timer, searched = estimate_timer(device), design_named("fp16,chained")
    out = []
    for model in models:
        for batch in (batches if model != "bert-base" else (32,)):
            for shape in gemm_shapes(model, batch):
                if layers is not None and (model, shape.layer) not in layers:
                    continue
                for sparsity in sparsities:
                    tile = searched_tile(shape, sparsity, searched, device, timer)
                    if tile is None:
                        continue
                    for variant in (*variants, FP32_SAME_TILE):
                        design = design_named(variant)
                        out.append(Planned(_id("half", model, shape.layer, sparsity, batch, design.label), "half",
                                           model, shape.layer, shape.m, shape.k, shape.n, sparsity, batch,
                                           design.label, tile[0], tile[1],
                                           _id(model, shape.layer, sparsity, design.dtype),
                                           f"the {searched.dtype} search: half ranker top-10, proxies timed by "
                                           f"{timer.name}"))
    return out


# --- build: compile into a bundle (no GPU) --------------------------------------------------------


def matrix_of(p: Planned) -> sp.csr_matrix:
    """The A a planned kernel bakes in: the layer pruned as the flow prunes it (a half design's
    rounded to its dtype, as a half run rounds it)."""
    if p.model == "synthetic":
        return micro_matrix(p.matrix)
    shape = next(s for s in gemm_shapes(p.model, p.batch if p.model != "bert-base" else 4) if s.layer == p.layer)
    design = design_named(p.design)
    a = pruned(shape, p.sparsity)
    return rounded_matrix(a, design.dtype)[0] if design.half else a


def source_of(p: Planned, a: sp.csr_matrix) -> KernelSource:
    return kernel_source(a, reordered_tiles(a, p.m1), p.n1, CodegenParams(design=design_named(p.design)))


def build(plan: list[Planned], bundle: Path, jobs: int = 2, arch: str = "sm_90", cache: Path | None = None,
          sass: bool = True, say=print) -> Path:
    """Compile every planned kernel (through the compile cache under `cache`, units on `jobs`
    threads) into `bundle`; a kernel that fails to compile is a row with its status. Returns the
    bundle's kernels.parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lospmm.flows.storage.compile_cache import cached_kernel
    from lospmm.flows.execution.units import threads
    from lospmm.stages.compile import kernel_options

    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / "a").mkdir(exist_ok=True)
    cache = cache or ROOT / ".gpu" / "compile-cache"
    units = threads(jobs)
    matrices: dict[str, sp.csr_matrix] = {}
    rows = []
    for i, p in enumerate(plan):
        if p.matrix not in matrices:
            matrices[p.matrix] = matrix_of(p)
            write_matrix(bundle / "a" / f"{p.matrix}.parquet", matrices[p.matrix])
        a = matrices[p.matrix]
        t0 = time.perf_counter()
        row = {**vars(p), "nnz": int(a.nnz)}
        try:
            src = source_of(p, a)
            design = design_named(p.design)
            result, hit = cached_kernel(cache, src, kernel_options(arch, p.m1, design=design), units)
            row |= {"kernel": src.name, "launch": json.dumps(src.layout.facts()), "status": str(result["status"]),
                    "message": "" if result["status"] == "ok" else result["log"][-500:],
                    "registers": int(result["registers"]), "spill_bytes": int(result["thread_spill_bytes"]),
                    "compile_seconds": float(result["cost_seconds"]), "tiles": src.num_tiles}
            if result["status"] == "ok":
                cubin = (Path(cache) / result["paths"]["cubin"]).read_bytes()
                (bundle / f"{p.id}.cubin").write_bytes(cubin)
                if sass:
                    row |= sass_facts(cubin, src, a)
        except Exception as e:  # one kernel's failure is its row
            row |= {"status": "error", "message": f"{type(e).__name__}: {e}"[:500]}
        rows.append(row)
        say(f"[{i + 1}/{len(plan)}] {p.id}: {row['status']}, {row.get('registers', '?')} registers, "
            f"{row.get('instructions', '?')} instructions, {time.perf_counter() - t0:.1f} s")
    table = bundle / "kernels.parquet"
    pq.write_table(pa.Table.from_pylist(rows), table)
    return table


def sass_facts(cubin: bytes, src: KernelSource, a: sp.csr_matrix) -> dict:
    """The SASS statistics of a kernel (nvdisasm): instructions in all, per useful multiply-add
    (nnz × columns per thread), FFMA and LDG counts, and code bytes per tile function (16 bytes an
    instruction): the mean and the largest. {} when nvdisasm is missing."""
    from lospmm.sass import BYTES_PER_INSTRUCTION, NvdisasmMissing, function_sizes, sass_counts

    try:
        counts = sass_counts(cubin, src.name)
        sizes = [size for name, size in function_sizes(cubin).items() if name.startswith("tile_")]
    except (NvdisasmMissing, OSError):
        return {}
    useful = a.nnz * src.layout.columns_per_thread
    size = BYTES_PER_INSTRUCTION
    return {"instructions": counts["total"], "instructions_per_fma": counts["total"] / max(useful, 1),
            "ffma": counts["FFMA"], "hfma2": counts["HFMA2"], "ldg": counts["LDG"],
            "spill_instructions": counts["LDL"] + counts["STL"],
            "code_bytes": size * counts["total"],
            # a streamed kernel has no tile functions: its one loop is all its code
            "tile_code_bytes_mean": size * float(np.mean(sizes)) if sizes else float(size * counts["total"]),
            "tile_code_bytes_max": size * int(max(sizes)) if sizes else size * counts["total"]}


def sass_table(kernels: Path) -> list[dict]:
    """Per design: median instructions per useful multiply-add, code bytes per tile, registers, spills."""
    import pyarrow.parquet as pq

    rows = [r for r in pq.read_table(kernels).to_pylist() if r["status"] == "ok" and r.get("instructions")]
    out = []
    for design in dict.fromkeys(r["design"] for r in rows):
        mine = [r for r in rows if r["design"] == design]
        out.append({"design": design, "kernels": len(mine),
                    "instructions/fma (median)": float(np.median([r["instructions_per_fma"] for r in mine])),
                    "tile code KB (median)": float(np.median([r["tile_code_bytes_mean"] for r in mine])) / 1024,
                    "largest tile code KB": max(r["tile_code_bytes_max"] for r in mine) / 1024,
                    "registers (median)": float(np.median([r["registers"] for r in mine])),
                    "kernels spilling": sum(r["spill_bytes"] > 0 for r in mine),
                    "compile s (sum)": sum(r["compile_seconds"] for r in mine)})
    return out


# --- run: on the device ---------------------------------------------------------------------------


def packed_parts(bundle: Path, into: Path, max_mib: float = 28.0, ratio: float = 5.0) -> list[Path]:
    """The bundle as .tar.xz archives of at most about `max_mib` each (`ratio`: xz's on these cubins,
    5-13 on the A/B bundle, the big BERT kernels the least): one archive if it fits, else parts
    `<name>-<i>of<n>`, each a bundle of its own (its rows' cubins and matrices), split at row
    boundaries in the bundle's order."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = bundle_rows(bundle)
    size = [(bundle / f"{r['id']}.cubin").stat().st_size if r["status"] == "ok" else 0 for r in rows]
    budget = max_mib * 2**20 * ratio
    if sum(size) <= budget:
        return [packed(bundle, into / f"{bundle.name}.tar.xz")]
    groups, current, total = [], [], 0
    for r, s in zip(rows, size):
        if current and total + s > budget:
            groups.append(current)
            current, total = [], 0
        current.append(r)
        total += s
    groups.append(current)
    out = []
    for i, group in enumerate(groups, 1):
        part = Path("/tmp/lospmm-kernel-speed-parts") / f"{bundle.name}-{i}of{len(groups)}"
        shutil.rmtree(part, ignore_errors=True)
        (part / "a").mkdir(parents=True)
        for r in group:
            if r["status"] == "ok":
                shutil.copyfile(bundle / f"{r['id']}.cubin", part / f"{r['id']}.cubin")
            shutil.copyfile(bundle / "a" / f"{r['matrix']}.parquet", part / "a" / f"{r['matrix']}.parquet")
        pq.write_table(pa.Table.from_pylist(group), part / "kernels.parquet")
        out.append(packed(part, into / f"{part.name}.tar.xz"))
        shutil.rmtree(part)
    return out


def opened(bundle: Path, into: Path = Path("/tmp/lospmm-kernel-speed")) -> Path:
    """A bundle folder, or the folder a .tar.xz bundle unpacks to under `into`."""
    if bundle.is_dir():
        return bundle
    import tarfile

    with tarfile.open(bundle, "r:xz") as tar:
        tar.extractall(into, filter="data")
        top = {Path(name).parts[0] for name in tar.getnames()}
    if len(top) != 1:
        raise SystemExit(f"{bundle}: not one bundle folder inside ({sorted(top)})")
    return into / top.pop()


def bundle_rows(bundle: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(bundle / "kernels.parquet").to_pylist()


def checked(row: dict, bundle: Path, ns=CHECK_NS) -> list[dict]:
    """The kernel against scipy at each N (fresh B, C poisoned with NaN): a row per N. A half
    kernel's error is its normalised error against the float64 product of the same rounded A and B,
    within its rounding bound (codegen_half.error_bound)."""
    from lospmm.runtime import check_full_kernel, check_half_kernel

    cubin, layout = (bundle / f"{row['id']}.cubin").read_bytes(), LaunchLayout(**json.loads(row["launch"]))
    a = read_matrix(bundle / "a" / f"{row['matrix']}.parquet")
    precision = precision_of(design_named(row["design"]))
    bound, eta = error_bound(a, precision) if precision else (1e-5, 0.0)
    out = []
    for n in sorted({*ns, row["n"]}):
        try:
            if precision:
                error = check_half_kernel(cubin, row["kernel"], layout, a, n, precision, eta, seed=n)
            else:
                error = check_full_kernel(cubin, row["kernel"], layout, a, n=n, seed=n)
            message = ""
        except Exception as e:
            error, message = float("inf"), f"{type(e).__name__}: {e}"[:300]
        out.append({"id": row["id"], "n": n, "max_rel_error": error, "bound": bound,
                    "status": "ok" if error <= bound else ("error" if message else "wrong"), "message": message})
    return out


def cublas_half_error(a: sp.csr_matrix, n: int, dtype: str, seed: int) -> float:
    """cuBLAS's normalised error in `dtype` (the tensor-core GEMM through torch) on the data a half
    kernel's check at this N uses (the same rounded A, the same B: checked's seed), against the
    float64 product: the accuracy bar's other side (issue 23: ours within 2× of it)."""
    import torch

    from lospmm.stages.codegen_half import from_dtype_bits, normalised_error, random_b_bits

    kind = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    b = from_dtype_bits(random_b_bits(a.shape[1], n, dtype, seed), dtype)  # the B checked() drew at this N
    with torch.no_grad():
        c = torch.matmul(torch.tensor(a.toarray(), device="cuda").to(kind), torch.tensor(b, device="cuda").to(kind))
    c64 = c.double().cpu().numpy()
    if not np.isfinite(c64).all():
        return float("inf")
    return normalised_error(c64, a, b, error_bound(a, precision_of(design_named(dtype)))[1])


def timed_ours(row: dict, bundle: Path, launches: int, repeats: int) -> tuple[float, float]:
    """(median µs, spread) of the kernel at the layer's N, by runtime.graph_timed."""
    import torch

    from lospmm.runtime import LoadedKernel, graph_timed

    layout = LaunchLayout(**json.loads(row["launch"]))
    n = layout.launch_columns(row["n"])
    kernel = LoadedKernel((bundle / f"{row['id']}.cubin").read_bytes(), row["kernel"])
    element = torch.float16 if design_named(row["design"]).half else torch.float32  # a bf16 kernel: the same bytes
    b = torch.randn(row["k"], n, device="cuda", dtype=element)
    c = torch.empty(row["m"], n, device="cuda", dtype=element)
    args = [("ptr", b.data_ptr()), ("ptr", c.data_ptr()), ("int", n)]
    grid, block = layout.grid(n), layout.block()
    us, spread, _ = graph_timed(lambda: kernel.launch(grid, block, args, 0, torch.cuda.current_stream().cuda_stream),
                                launches, repeats)
    return us, spread


def timed_cublas(m: int, k: int, n: int, launches: int, repeats: int, max_spread: float = 0.10,
                 bf16: bool = False) -> dict:
    """cuBLAS on the dense M×K·K×N through torch, timed as ours: FP32 (TF32 off), TF32, FP16 (and BF16),
    each re-measured once when its repeats spread more than `max_spread`, flagged if it still does."""
    import torch

    from lospmm.runtime import graph_timed
    from lospmm.stages.timing import settled

    out = {}
    libraries = (("sgemm", torch.float32, False), ("tf32", torch.float32, True), ("fp16", torch.float16, False))
    for name, dtype, tf32 in libraries + ((("bf16", torch.bfloat16, False),) if bf16 else ()):
        try:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a, b = torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype)
            c = torch.empty(m, n, device="cuda", dtype=dtype)
            t = settled(lambda: graph_timed(lambda: torch.matmul(a, b, out=c), launches, repeats)[:2], max_spread)
            out[f"{name}_us"], out[f"{name}_spread"], out[f"{name}_spread_flag"] = t.us, t.spread, t.flagged
        except Exception as e:  # one failing library is a NaN and its message
            out[f"{name}_us"], out[f"{name}_spread"] = float("nan"), float("nan")
            out[f"{name}_message"] = f"{type(e).__name__}: {e}"[:300]
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
    return out


def run(bundle: Path, out: Path, budget_s: float = 500.0, launches: int = 20, repeats: int = 3,
        max_spread: float = 0.05, say=print) -> Path:
    """Check and time every kernel of the bundle (a kernel whose repeats spread more than
    `max_spread` is timed once more; if it still does, `spread_flag` says so), cuBLAS on each
    distinct shape (the same rule at 10%: the issue's bound for library baselines); stops at the
    budget. Writes kernel-speed-<bundle>.parquet and checks-<bundle>.parquet."""
    from lospmm.stages.timing import settled

    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch  # noqa: F401  (before anything loads NVRTC: see runtime.SPIN_PTX)

    deadline = Deadline.after(budget_s)
    rows, checks, baselines = [], [], {}
    kernels = bundle_rows(bundle)
    for i, row in enumerate(kernels):
        if deadline.over():
            say(f"stopped at the time budget after {i} of {len(kernels)} kernels")
            break
        result = {k: row.get(k) for k in ("id", "set", "model", "layer", "m", "k", "n", "nnz", "sparsity", "batch",
                                          "design", "m1", "n1", "registers", "spill_bytes", "instructions",
                                          "instructions_per_fma", "tile_code_bytes_mean", "chosen_by")}
        precision = precision_of(design_named(row["design"]))
        if precision:  # on every half row, a failed one too: the half table must show its failures
            result |= {"dtype": precision.dtype, "accumulate": precision.label}
        if row["status"] != "ok":
            rows.append(result | {"status": "not compiled", "ours_us": float("inf")})
            continue
        mine = checked(row, bundle)
        checks.extend(mine)
        if any(c["status"] != "ok" for c in mine):
            rows.append(result | {"status": "failed check", "ours_us": float("inf")})
            continue
        try:
            timed = settled(lambda: timed_ours(row, bundle, launches, repeats), max_spread)
            us, spread = timed.us, timed.spread
        except Exception as e:
            rows.append(result | {"status": "error", "ours_us": float("inf"), "message": f"{type(e).__name__}: {e}"[:300]})
            continue
        shape = (row["m"], row["k"], row["n"])
        if shape not in baselines and row["set"] != "micro":
            baselines[shape] = timed_cublas(*shape, launches, repeats, bf16=any(
                design_named(r["design"]).dtype == "bf16" for r in kernels))
        result |= {"status": "ok", "ours_us": us, "spread": spread, "spread_flag": timed.flagged,
                   **baselines.get(shape, {})}
        if precision:  # the accuracy bar: ours and cuBLAS in the same dtype on the same data (the check at N)
            result |= {"max_rel_error": next(c["max_rel_error"] for c in mine if c["n"] == row["n"]),
                       "cublas_max_rel_error": cublas_half_error(read_matrix(bundle / "a" / f"{row['matrix']}.parquet"),
                                                                 row["n"], precision.dtype, row["n"])}
        rows.append(result)
        say(f"[{i + 1}/{len(kernels)}] {row['id']}: {us:.2f} us (spread {spread:.1%})"
            + (f", sgemm {result['sgemm_us']:.2f} us" if "sgemm_us" in result else ""))
    out.mkdir(parents=True, exist_ok=True)
    speed = out / f"kernel-speed-{bundle.name}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), speed)
    half = half_rows(rows)
    if half:
        pq.write_table(pa.Table.from_pylist(half), out / f"half-precision-{bundle.name}.parquet")
    if checks:
        pq.write_table(pa.Table.from_pylist(checks), out / f"checks-{bundle.name}.parquet")
    return speed


# --- report: anywhere -----------------------------------------------------------------------------

HALF_WORK_BOUND_US = 10.0  # issue 23's work-bound layers: cuBLAS FP16 at least this long


def half_rows(rows: list[dict]) -> list[dict]:
    """Issue 23's table from a run's rows: one per half kernel with its time, cuBLAS's in the same
    dtype, our fp32 kernel's on the same tile (FP32_SAME_TILE: same model, layer, sparsity, batch and
    tile), and both errors on the same data."""
    fp32_label = design_named(FP32_SAME_TILE).label
    fp32 = {(r["model"], r["layer"], r["sparsity"], r["batch"], r["m1"], r["n1"]): r for r in rows
            if r.get("set") == "half" and r["design"] == fp32_label}
    out = []
    for r in rows:
        if r.get("set") != "half" or not r.get("dtype"):
            continue
        same = fp32.get((r["model"], r["layer"], r["sparsity"], r["batch"], r["m1"], r["n1"]), {})
        out.append({k: r.get(k) for k in ("model", "layer", "m", "k", "n", "nnz", "sparsity", "batch", "dtype",
                                          "accumulate", "design", "m1", "n1", "spread", "status")}
                   | {"ours_us": r.get("ours_us", float("inf")), "cublas_same_dtype_us": r.get(f"{r['dtype']}_us"),
                      "ours_fp32_us": same.get("ours_us", float("nan")), "max_rel_error": r.get("max_rel_error"),
                      "cublas_max_rel_error": r.get("cublas_max_rel_error")})
    return out


def chosen_accumulation(rows: list[dict], dtype: str = "fp16") -> str | None:
    """Issue 23's rule for the default sums of `dtype`: of the accumulations whose every measured
    kernel meets the accuracy bar (error ≤ 2× cuBLAS's on the same data), the fastest (geomean over
    the kernels all of them ran; ties to the earlier in HALF_VARIANTS' order); None if none meets it."""
    by = {}
    for r in rows:
        if r.get("dtype") == dtype:
            by.setdefault(r["accumulate"], {})[(r["model"], r["layer"], r["sparsity"], r["batch"])] = r
    # a variant with a kernel that failed (not compiled, wrong, unmeasured) meets nothing
    meeting = {label: kernels for label, kernels in by.items()
               if all(r.get("status") == "ok" and r.get("cublas_max_rel_error") is not None
                      and r["max_rel_error"] <= 2 * r["cublas_max_rel_error"] for r in kernels.values())}
    if not meeting:
        return None
    common = set.intersection(*(set(k) for k in meeting.values()))
    speed = {label: geomean([kernels[key]["ours_us"] for key in common]) if common else float("inf")
             for label, kernels in meeting.items()}
    return min(speed, key=lambda label: speed[label])


def half_summary(rows: list[dict]) -> list[dict]:
    """Per accumulation (fp16/bf16 and its sums) and sparsity, over the work-bound rows (cuBLAS FP16
    ≥ 10 µs): geomean speedup over cuBLAS in the same dtype and over our fp32 kernel on the same
    tile, and how many kernels meet the accuracy bar (error ≤ 2× cuBLAS's on the same data)."""
    out = []
    ok = [r for r in rows if r.get("status") == "ok" and math.isfinite(r["ours_us"] or math.inf)
          and (r.get("cublas_same_dtype_us") or 0) > 0]
    for label in dict.fromkeys(r["accumulate"] for r in ok):
        for s in sorted({r["sparsity"] for r in ok if r["accumulate"] == label}):
            xs = [r for r in ok if r["accumulate"] == label and r["sparsity"] == s]
            work = [r for r in xs if r["cublas_same_dtype_us"] >= HALF_WORK_BOUND_US]
            fp32 = [r for r in work if r.get("ours_fp32_us") and math.isfinite(r["ours_fp32_us"])]
            out.append({"kernels": label, "sparsity": s, "work-bound": len(work), "all": len(xs),
                        "vs cuBLAS same dtype (geomean, work-bound)":
                            geomean([r["cublas_same_dtype_us"] / r["ours_us"] for r in work]) if work else float("nan"),
                        "vs ours fp32, same tile": geomean([r["ours_fp32_us"] / r["ours_us"] for r in fp32])
                        if fp32 else float("nan"),
                        "within 2x cuBLAS error": sum(r["max_rel_error"] <= 2 * r["cublas_max_rel_error"] for r in xs
                                                      if r.get("cublas_max_rel_error") is not None),
                        "error vs cuBLAS (median)": float(np.median([r["max_rel_error"] / r["cublas_max_rel_error"]
                                                                    for r in xs if r.get("cublas_max_rel_error")]))
                        if any(r.get("cublas_max_rel_error") for r in xs) else float("nan")})
    return out


def efficiency(r: dict) -> float:
    """Per-nonzero efficiency: our useful FLOP/s over cuBLAS SGEMM's dense FLOP/s on the same shape."""
    return r["nnz"] * r["sgemm_us"] / (r["m"] * r["k"] * r["ours_us"])


def headline_summary(rows: list[dict], peak_tflops: float = 66.9) -> list[dict]:
    """Per sparsity over the work-bound rows (SGEMM ≥ 15 µs; the fastest design of each layer and N):
    median per-nonzero efficiency, geomean speedup over SGEMM, TF32 and FP16, slower-than-SGEMM count,
    and the largest layers' share of FP32 peak; then the same over every row."""
    best: dict = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("sgemm_us") and math.isfinite(r["ours_us"]):
            key = (r["model"], r["layer"], r["sparsity"], r["n"])
            if key not in best or r["ours_us"] < best[key]["ours_us"]:
                best[key] = r
    out = []
    for scope, keep in (("work-bound", lambda r: r["sgemm_us"] >= WORK_BOUND_US), ("all", lambda r: True)):
        for s in sorted({r["sparsity"] for r in best.values()}):
            xs = [r for r in best.values() if r["sparsity"] == s and keep(r)]
            if not xs:
                continue
            useful = [2 * r["nnz"] * r["n"] / (r["ours_us"] * 1e-6) / 1e12 for r in xs]
            out.append({"scope": scope, "sparsity": s, "layers": len(xs),
                        "efficiency (median)": float(np.median([efficiency(r) for r in xs])),
                        "vs SGEMM (geomean)": geomean([r["sgemm_us"] / r["ours_us"] for r in xs]),
                        "vs TF32": geomean([r["tf32_us"] / r["ours_us"] for r in xs if r.get("tf32_us")]),
                        "vs FP16": geomean([r["fp16_us"] / r["ours_us"] for r in xs if r.get("fp16_us")]),
                        "slower than SGEMM": sum(r["ours_us"] > r["sgemm_us"] for r in xs),
                        "% FP32 peak (max)": 100 * max(useful) / peak_tflops})
    return out


def ab_summary(rows: list[dict]) -> list[dict]:
    """Per A/B layer: today's kernel's µs and each design's time over it (< 1: faster)."""
    by_layer: dict = {}
    for r in rows:
        if r.get("set") == "ab":
            by_layer.setdefault((r["model"], r["layer"]), {})[r["design"]] = r
    baseline = design_named("baseline").label
    out = []
    for (model, layer), designs in by_layer.items():
        base = designs.get(baseline, {}).get("ours_us", float("nan"))
        out.append({"model": model, "layer": layer, "baseline_us": base,
                    **{d: designs[d]["ours_us"] / base for d in designs if d != baseline}})
    return out


def _print(title: str, rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*[f"{v:.3g}" if isinstance(v, float) else str(v if v is not None else "") for v in
                        (r.get(c) for c in columns)])
    Console(width=200).print(table)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile a set into a bundle (no GPU)")
    b.add_argument("set", choices=("ab", "micro", "headline", "half"))
    b.add_argument("--bundle", type=Path, required=True)
    b.add_argument("--design", default="chained", help="headline: the design (design_named's tokens)")
    b.add_argument("--designs", nargs="+", default=list(AB_DESIGNS), help="ab: the designs")
    b.add_argument("--sparsity", type=float, nargs="+", default=[0.7, 0.9, 0.95], help="headline")
    b.add_argument("--batch", type=int, nargs="+", default=[4, 32], help="headline: CNN batches")
    b.add_argument("--models", nargs="+", default=list(MODELS), help="headline, half")
    b.add_argument("--layers", nargs="+", default=None,
                   help="half: only these MODEL:LAYER (default: every GEMM layer; `ab` for the A/B layers)")
    b.add_argument("--variants", nargs="+", default=list(HALF_VARIANTS), help="half: the half designs")
    b.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    b.add_argument("--no-sass", action="store_true", help="skip nvdisasm's statistics")
    s = sub.add_parser("sass", help="the per-design SASS table of a bundle")
    s.add_argument("--bundle", type=Path, required=True)
    k = sub.add_parser("pack", help="bundles as .tar.xz archives, to carry to the GPU machine")
    k.add_argument("bundles", type=Path, nargs="+")
    k.add_argument("--into", type=Path, required=True)
    k.add_argument("--max-mib", type=float, default=28.0,
                   help="split a bundle whose archive would be larger into parts (a device call carries 64 MiB in all)")
    r = sub.add_parser("run", help="on the GPU: check and time a bundle's kernels and cuBLAS")
    r.add_argument("out", type=Path)
    r.add_argument("--bundle", type=Path, required=True)
    r.add_argument("--budget-s", type=float, default=500.0)
    r.add_argument("--launches", type=int, default=20)
    r.add_argument("--repeats", type=int, default=3)
    p = sub.add_parser("report", help="the tables of a run's kernel-speed parquet")
    p.add_argument("files", type=Path, nargs="+")
    args = ap.parse_args(argv)
    if args.command == "build":
        layers = None if args.layers is None else (AB_LAYERS if args.layers == ["ab"] else
                                                    tuple(tuple(x.split(":", 1)) for x in args.layers))
        half_sparsities = [s for s in args.sparsity if s != 0.7] or args.sparsity  # the issue's: 0.9, 0.95
        plan = {"ab": lambda: ab_plan(args.designs), "micro": micro_plan,
                "headline": lambda: headline_plan(args.design, args.sparsity, args.batch, args.models),
                "half": lambda: half_plan(half_sparsities, args.batch, args.models, layers,
                                          tuple(args.variants))}[args.set]()
        table = build(plan, args.bundle, args.jobs, sass=not args.no_sass)
        _print(f"SASS per design ({table})", sass_table(table))
    elif args.command == "sass":
        _print(f"SASS per design ({args.bundle})", sass_table(args.bundle / "kernels.parquet"))
    elif args.command == "pack":
        for bundle in args.bundles:
            for archive in packed_parts(bundle, args.into, args.max_mib):
                print(f"{archive}: {archive.stat().st_size / 2**20:.1f} MiB")
    elif args.command == "run":
        speed = run(opened(args.bundle), args.out, args.budget_s, args.launches, args.repeats)
        main(["report", str(speed)])
    else:
        import pyarrow.parquet as pq

        rows = [r for f in args.files for r in pq.read_table(f).to_pylist()]
        if any(r.get("set") == "ab" for r in rows):
            _print("A/B: each design's time over today's kernel on the same tile (< 1 is faster)", ab_summary(rows))
        if any(r.get("set") == "micro" for r in rows):
            _print("Diagnosis kernels (µs)", [{k: r.get(k) for k in ("layer", "design", "ours_us", "spread",
                                                                      "tile_code_bytes_mean")}
                                             for r in rows if r.get("set") == "micro"])
        half = half_rows(rows) if any(r.get("set") == "half" for r in rows) else \
            [r for r in rows if "cublas_same_dtype_us" in r]
        if half:
            _print("Half precision: against cuBLAS in the same dtype (tensor cores) and our fp32 kernel on the "
                   "same tile", half_summary(half))
            for dtype in ("fp16", "bf16"):
                print(f"{dtype}: the fastest sums meeting the accuracy bar on every kernel (the default to ship): "
                      f"{chosen_accumulation(half, dtype) or 'none meets it'}")
        if any(r.get("set") != "half" and "sgemm_us" in r for r in rows):
            _print("Against cuBLAS (the fastest design per layer and N)",
                   headline_summary([r for r in rows if r.get("set") != "half"]))


if __name__ == "__main__":
    main()
