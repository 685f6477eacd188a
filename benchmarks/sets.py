"""The kernel sets the device program (benchmarks.device) measures, as jobs a bundle is built from
(benchmarks.bundle): each a `Planned` row (what it is: layer, tile, design, role) and how to render
it through the package's one entry point (lospmm.kernel.render). Nothing here needs a GPU.

- `ab`: every design of AB_DESIGNS on each A/B layer's tile as measured on the H100 (issue 20's A/B),
  or on AB_HELD_OUT_LAYERS' tiles (issue 35: the design price fitted on the A/B, checked on layers it never saw);
- `micro`: the diagnosis kernels (code footprint and code sharing, synthetic A);
- `headline`: every distinct zoo GEMM layer at 0.7/0.9/0.95, CNN batch 4 and 32, BERT 32×128, in
  one design, on the tile the search chooses (ranker top-10, proxies timed by the estimate);
- `half`: issue 23's set: the fp16 search's tile per layer, each half variant on it, and our fp32
  kernel of the same columns per thread (analysis.FP32_SAME_TILE);
- `sample`: issue 24's launch list: a sample of layers' proxies and top-K full kernels (and every
  kept candidate from one cubin per M1 reading N1 at launch), with the A/B variants of ptxas and
  prefetch on the largest layer of each model;
- `conv`: implicit-im2col convolution cases (baked, streamed, staged) beside the GEMM kernel of the same A and tile;
- `latency`: each A/B layer's kernel with deeper prefetch and more registers, and at ptxas -O3;
- `staged`: each A/B layer's kernel beside the staged design (B through shared memory) on its tiles.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import scipy.sparse as sp

from benchmarks.analysis import FP32_SAME_TILE
from benchmarks.bundle import NM_SPMM_MODEL
from lospmm.kernel.choices import DESIGN_CANDIDATES, PENDING_DESIGNS
from lospmm.kernel.design import KernelDesign, design_named
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.geometry import ConvGeometry
from lospmm.kernel.numbers import in_format
from lospmm.kernel.render import CodegenParams, kernel_source
from lospmm.kernel.spec import KernelSource
from lospmm.stages.extract import LayerShape, ZooParams, folded_duplicates, zoo_shapes

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("bert-base", "resnet50", "mobilenetv2", "shufflenetv2")

# The A/B set: the worst and best rows of the committed H100 results at 0.9 (per-nonzero
# efficiency against cuBLAS, call l) and the largest layers, each on the tile measured there.
AB_LAYERS = (
    ("bert-base", "pooler.dense"), ("resnet50", "layer4.0.conv2"), ("resnet50", "layer4.0.conv3"),
    ("resnet50", "conv1"), ("resnet50", "layer1.0.conv2"), ("resnet50", "layer2.0.conv2"),
    ("resnet50", "layer3.0.downsample.0"), ("mobilenetv2", "features.18"), ("mobilenetv2", "features.7.conv.2"),
    ("bert-base", "encoder.layer.0.attention.self.query"), ("bert-base", "encoder.layer.0.intermediate.dense"),
)
# Layers the design price (lospmm.kernel.estimate.DESIGN_PRICINGS) was not fitted on, each on its tile
# measured there too: a spread of shapes and sizes in every model, the largest layers of BERT and
# ResNet-50 among them (issue 35: the chosen design within 5% of the best on a held-out set)
AB_HELD_OUT_LAYERS = (
    ("bert-base", "encoder.layer.0.output.dense"), ("resnet50", "layer3.0.conv2"), ("resnet50", "layer2.0.conv3"),
    ("resnet50", "layer3.0.conv3"), ("resnet50", "layer4.0.downsample.0"), ("resnet50", "layer1.0.conv3"),
    ("mobilenetv2", "features.15.conv.0"), ("mobilenetv2", "features.3.conv.0"), ("mobilenetv2", "features.17.conv.2"),
    ("shufflenetv2", "conv5.0"), ("shufflenetv2", "stage3.0.branch2.0"),
)
AB_TILES_FROM = ROOT / "benchmarks/results/gpu-h100/l/speedup.parquet"
# `--design auto`'s designs and those waiting for their measured price (kernel.choices.PENDING_DESIGNS)
AB_DESIGNS = DESIGN_CANDIDATES + PENDING_DESIGNS
HALF_VARIANTS = ("fp16,chained", "fp16,acc=f32,chained", "fp16,promote=8,chained", "bf16,chained",
                 "bf16,acc=f32,chained")


@dataclass(frozen=True)
class Planned:
    """One kernel of a set, as its launch row describes it. `matrix` names the A it bakes (shared by
    the kernels of one layer; a half design's is rounded to its dtype); `role` is "full" or "proxy";
    `variant` "" for the flow's own kernel (else ptxas-O3, prefetch-K, outside-top-k, every-kept);
    `also_at`: a kernel reading N1 at launch (a proxy, or an every-kept kernel) is launched at these
    (N1, rank) too."""

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
    matrix: str
    chosen_by: str
    role: str = "full"
    variant: str = ""
    rank: int = -1
    prefetch: int = 1
    ptxas_level: int = 1
    n1_at_launch: bool = False
    also_at: tuple[tuple[int, int], ...] = ()
    conv: tuple[tuple[str, int], ...] = ()  # a conv kernel's ConvGeometry fields
    epilogue: str = ""  # "", "relu", "bias", "bias+relu" (a conv case's)
    order: str = "algorithm1"  # the row order of its tiles: a stages.reorder strategy, or "kept" (the flow's choice)
    prune: str = ""  # how its A is pruned: "" the zoo's seeded random, or a prune method (nm:N:M[:V])
    nm: tuple = ()  # the nm design's blocking: block rows, block columns, thread rows, thread columns, depth, gather
    extra_registers: int = 0  # registers allowed above the §3.2 prediction (--maxrregcount)

    def row(self) -> dict:
        """The launch row's description columns."""
        out = {k: v for k, v in vars(self).items() if k not in ("also_at", "conv")}
        return out | {"conv": str(dict(self.conv)) if self.conv else ""}


@dataclass(frozen=True)
class Job:
    """A planned kernel and how to make it: `source()` renders it; `matrix()` is the A it bakes (None
    for a proxy: nothing to check it against); `launch` holds what its launch rows carry besides (a
    proxy's cluster map and its Eq. 6 shared memory at each N1, `smem_at`; the estimate's work:
    per-tile loads and multiply-adds, zeroing blocks)."""

    planned: Planned
    source: Callable[[], KernelSource]
    matrix: Callable[[], sp.csr_matrix] | None
    launch: Mapping = field(default_factory=dict)


def _id(*parts) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(str(p) for p in parts))[:120]


# --- layers and their A -----------------------------------------------------------------------------


def gemm_shapes(model: str, cnn_batch: int = 4) -> list[LayerShape]:
    """The zoo model's distinct GEMM layers (dense convolutions and linear layers) at `cnn_batch`."""
    shapes = folded_duplicates(zoo_shapes(model, ZooParams(cnn_batch=cnn_batch)))
    return [s for s in shapes if s.ok and (s.op == "linear" or (s.op == "conv" and s.groups == 1))]


def pruned(shape: LayerShape, sparsity: float, method: str = "") -> sp.csr_matrix:
    """The layer's A as the flow prunes a zoo layer: seeded random (PruneParams' defaults), or by
    `method` (nm:N:M[:V]: random N:M positions)."""
    from lospmm.stages.prune import PruneParams, pruned_layer

    return pruned_layer(shape, sparsity, PruneParams(method=method) if method else PruneParams()).matrix


def micro_matrix(name: str) -> sp.csr_matrix:
    """The synthetic A of a micro kernel: `footprint-NNZ` is 2 rows × 2·NNZ columns at density 1/4
    (NNZ nonzeros, one tile); `sharing` is 64 rows × 4096 at density 1/16 (32 tiles of ~512)."""
    from lospmm.stages.prune import random_pruned

    if name.startswith("synthetic-footprint"):
        nnz = int(name.rsplit("-", 1)[1])
        return random_pruned(2, 2 * nnz, 0.75, np.random.default_rng(nnz))
    return random_pruned(64, 4096, 0.9375, np.random.default_rng(64))


@functools.lru_cache(maxsize=64)
def matrix_of(p: Planned) -> sp.csr_matrix:
    """The A a planned kernel bakes in: the layer pruned as the flow prunes it (a half design's
    rounded to its dtype, as a half run rounds it)."""
    if p.model == "synthetic":
        return micro_matrix(p.matrix)
    if p.model == "conv-case":
        return in_format(conv_case_matrix(int(p.layer.split(":", 1)[0]), p.sparsity, p.prune),
                         design_named(p.design).number)[0]
    if p.model == NM_SPMM_MODEL:
        return nm_spmm_matrix(p.m, p.k, p.prune)
    shape = next(s for s in gemm_shapes(p.model, p.batch if p.model != "bert-base" else 4) if s.layer == p.layer)
    return in_format(pruned(shape, p.sparsity, p.prune), design_named(p.design).number)[0]


def tile_work(tiles, matrix: sp.csr_matrix | None = None, design: str = "") -> dict:
    """The estimate's work of a full kernel on `tiles`: per-tile loads and multiply-adds, zeroing blocks,
    and a staged design's copies per block and chunk of K and each tile's loads and multiply-adds per
    chunk (of `matrix`: flattened, with its chunks)."""
    from lospmm.kernel.estimate import full_kernel_work

    kind = design_named(design) if design else design_named("baseline")
    work = full_kernel_work(tiles, 1, 1, 1, 1, 0, design=kind, matrix=matrix)
    staged = {} if work.staged_counts is None else {
        "staged_chunks": int(work.staged_counts.shape[1]), "staged_counts": [int(x) for x in work.staged_counts.ravel()],
        "chunk_loads": [int(x) for x in work.chunk_loads.ravel()], "chunk_fmas": [int(x) for x in work.chunk_fmas.ravel()]}
    return {"tile_loads": [int(x) for x in work.tile_loads], "tile_fmas": [int(x) for x in work.tile_fmas],
            "zero_blocks": int(work.zero_blocks), **staged}


def ordered(a: sp.csr_matrix, p: Planned):
    """The tiles of a planned kernel in its `order`: Algorithm 1's (every set but reorder), the
    identity's, or the order the flow keeps for its layer (stages.reorder.layer_orders over the
    flow's M1s at its N, the flow's defaults, priced on an H100)."""
    from lospmm.search import DEFAULT_M1
    from lospmm.stages.reorder import ReorderParams, distinct_m1s, identity_tiles, layer_orders, reordered_tiles

    if p.order == "algorithm1":
        return reordered_tiles(a, p.m1)
    if p.order == "identity":
        return identity_tiles(a, p.m1)
    if p.order == "kept":  # as the flow decides it: the layer's M1s compete for the partitioner's budget
        return layer_orders(a, sorted({*DEFAULT_M1, p.m1}), p.n, ReorderParams())[distinct_m1s(a, (p.m1,))[0]].tiles
    raise ValueError(f"{p.id}: no row order {p.order!r} (algorithm1, identity, kept)")


def planned_job(p: Planned, matrix: Callable[[], sp.csr_matrix] | None = None) -> Job:
    """The job of a planned full kernel: its A (`matrix()`, default matrix_of) reordered for its M1,
    rendered in its design."""
    matrix = matrix or (lambda: matrix_of(p))

    @functools.lru_cache(maxsize=1)
    def parts():
        a = matrix()
        tiles = ordered(a, p)
        geometry = ConvGeometry(**dict(p.conv)) if p.conv else None
        bias = tuple(float(v) for v in np.random.default_rng(p.m).standard_normal(p.m).astype(np.float32)) \
            if "bias" in p.epilogue else ()
        params = CodegenParams(prefetch=p.prefetch, design=design_named(p.design), n1_at_launch=p.n1_at_launch)
        return kernel_source(a, tiles, p.n1, params, Epilogue(bias, "relu" if "relu" in p.epilogue else ""),
                             geometry), tile_work(tiles, a, p.design)

    if p.nm:
        return nm_job(p, matrix)
    return Job(p, lambda: parts()[0], matrix, _Lazy(lambda: parts()[1]))


def nm_tiling_of(p: Planned):
    """A planned N:M kernel's blocking, with the pattern its A is pruned to (p.prune)."""
    from lospmm.stages.prune import nm_pattern

    pattern = nm_pattern(p.prune)
    return nm_tiling_from(pattern, p.nm, p.design)


def nm_tiling_from(pattern, blocking, design: str = ""):
    """The tiling of an N:M pattern and a planned blocking: block rows and columns, thread rows and
    columns, and where given the stage depth and whether stages gather (1/0: a Parquet list holds ints);
    for a design whose sums are in tensor cores (acc=mma), the sparse tensor-core kernel's: block rows
    and columns, warp rows and columns, the stage depth."""
    from lospmm.kernel.nm import NMTiling
    from lospmm.kernel.sparse_mma import MMATiling

    blocking = [int(x) for x in blocking]
    if design and design_named(design).accumulate == "mma":
        return MMATiling(pattern.n, pattern.m, pattern.vector, *blocking[:5])
    return NMTiling(pattern.n, pattern.m, pattern.vector, *blocking[:5], *(bool(g) for g in blocking[5:6]))


# the N:M kernel on sparse tensor cores, in fp16: cuSPARSELt's own terms (2:4, fp16 B and C, fp32 sums)
MMA_DESIGN = "nm,fp16,acc=mma"


def mma_planned(id_: str, set_: str, model: str, layer: str, m: int, k: int, n: int, pattern, count: int,
                matrix: str, why: str, method: str, device) -> "Planned | None":
    """The sparse tensor-core kernel of an N:M layer in the blocking the estimate prices lowest on
    `device`, or None for a pattern it cannot take (more than 2 of some 4 columns)."""
    from lospmm.kernel.choices import nm_options

    options = nm_options((pattern.n, pattern.m, pattern.vector), m, k, n, device, design_named(MMA_DESIGN))
    if not options:
        return None
    best = min(options, key=lambda s: s.estimate_us).nm
    return Planned(id_, set_, model, layer, m, k, n, pattern.sparsity, count, design_named(MMA_DESIGN).label,
                   best.block_rows, best.threads, matrix, f"{why}: {best.label}", prune=method, variant="mma",
                   nm=(best.block_rows, best.block_columns, best.warp_rows, best.warp_columns, best.depth))


def nm_job(p: Planned, matrix: Callable[[], sp.csr_matrix]) -> Job:
    """The job of a planned N:M kernel (design nm): its A in natural row order, and the estimate's
    figure for it (kernel.estimate.nm_timing on an H100, registers predicted) as its launch rows'."""
    from lospmm.devices import device_named
    from lospmm.kernel.estimate import NMWork, estimate_timer, nm_registers, nm_timing

    tiling = nm_tiling_of(p)
    timer = estimate_timer(device_named("h100"))

    design = design_named(p.design)
    geometry = ConvGeometry(**dict(p.conv)) if p.conv else None

    def estimate() -> dict:
        work = NMWork(tiling, p.m, p.k, p.n, nm_registers(tiling, design.number), design.number, bool(p.conv))
        return {"estimate_us": float(nm_timing(work, timer.device, timer.params).time_us)}

    def source() -> KernelSource:
        a = matrix()
        bias = tuple(float(v) for v in np.random.default_rng(p.m).standard_normal(p.m).astype(np.float32)) \
            if "bias" in p.epilogue else ()
        return kernel_source(a, None, 0, CodegenParams(design=design),
                             Epilogue(bias, "relu" if "relu" in p.epilogue else ""), geometry, nm=tiling)

    return Job(p, source, matrix, _Lazy(estimate))


class _Lazy(Mapping):
    """A mapping computed on first use (a job's estimate work needs its A reordered)."""

    def __init__(self, make):
        self._make, self._value = make, None

    def _get(self) -> dict:
        if self._value is None:
            self._value = self._make()
        return self._value

    def __getitem__(self, key):
        return self._get()[key]

    def __iter__(self):
        return iter(self._get())

    def __len__(self):
        return len(self._get())


# --- the A/B and the diagnosis kernels (issue 20) -----------------------------------------------------


def ab_plan(designs=AB_DESIGNS, layers=AB_LAYERS, sparsity: float = 0.9) -> list[Planned]:
    """Every design on each A/B layer's tile as measured in the committed results (today's kernel's)."""
    import pyarrow.parquet as pq

    measured = {(r["model"], r["layer"]): r for r in pq.read_table(AB_TILES_FROM).to_pylist()
                if r["sparsity"] == sparsity}
    out = []
    for model, layer in layers:
        shape = next(s for s in gemm_shapes(model) if s.layer == layer)
        m1, n1 = (int(x) for x in measured[(model, layer)]["tile"].replace("x", "×").split("×"))
        for design in designs:
            d = design_named(design)
            try:
                tile_n1 = sliced_n1(d, m1, n1)
            except ValueError as e:
                raise ValueError(f"{model} {layer}: {e}") from None
            narrowed = f"; N1 {tile_n1}, the widest whole warps its block launches at" if tile_n1 != n1 else ""
            out.append(Planned(_id("ab", model, layer, design), "ab", model, layer, shape.m, shape.k, shape.n, sparsity,
                               4 if model != "bert-base" else 32, d.label, m1, tile_n1, _id(model, layer, sparsity),
                               f"today's tile (H100 call l, {AB_TILES_FROM.parent.name}){narrowed}"))
    return out


def sliced_n1(design: KernelDesign, m1: int, n1: int) -> int:
    """The N1 a tile of `m1`×`n1` launches at in `design`: its own, but a sliced block's threads and
    shared memory bound its N1, and a slice is whole warps: the widest multiple of 32 up to n1 that it
    launches at (n1 itself under 32). ValueError where it launches at none."""
    if design.k_slices == 1 or (not design.block_problem(m1, n1) and n1 % 32 == 0):
        return n1
    fits = [w for w in range(32, n1 + 1, 32) if not design.block_problem(m1, w)] or \
        ([n1] if not design.block_problem(m1, n1) else [])
    if not fits:
        raise ValueError(f"design {design.label} launches at no N1 up to the tile's {m1}×{n1} "
                         f"({design.block_problem(m1, n1)})")
    return max(fits)


def reorder_plan(layers=AB_LAYERS, sparsity: float = 0.9, orders=("identity", "algorithm1", "kept")) -> list[Planned]:
    """Issue 33's device step: each A/B layer's baseline kernel on today's tile in each row order,
    everything else the same, so that time can be set against Σ nnc (the launch rows' tile_loads)."""
    return [replace(p, id=_id("reorder", p.model, p.layer, order), set="reorder", order=order,
                    chosen_by=f"{p.chosen_by}; rows in the {order} order")
            for p in ab_plan(designs=("baseline",), layers=layers, sparsity=sparsity) for order in orders]


# the latency A/B's variants: (prefetch depth, registers above the prediction, ptxas level); the
# first is the kernel the flow emits
LATENCY_VARIANTS = ((1, 0, 1), (4, 4, 1), (8, 8, 1), (16, 16, 1), (1, 16, 3))


def latency_plan(layers=AB_LAYERS, sparsity: float = 0.9, design: str = "chained",
                 variants=LATENCY_VARIANTS) -> list[Planned]:
    """The latency A/B (issue 30 item 3, diagnosis): on the H200 the A/B's worst kernels spent 87-94%
    of their stalls waiting on B's loads (long_scoreboard) with 3-28% issue activity, and the flow's
    kernels keep about one load in flight a thread: prefetch 1 at ptxas -O1, which keeps the emitted
    schedule, under a register cap at the prediction. Each A/B layer's kernel in `design` on its A/B
    tile with B loaded P columns ahead (and P registers more room), and at -O3 with 16 more registers
    (ptxas hoists loads itself), everything else the same."""
    out = []
    for p in ab_plan(designs=(design,), layers=layers, sparsity=sparsity):
        for prefetch, extra, level in variants:
            label = f"prefetch-{prefetch},regs+{extra},O{level}"
            out.append(replace(p, id=_id("latency", p.model, p.layer, label), set="latency", variant=label,
                               prefetch=prefetch, extra_registers=extra, ptxas_level=level,
                               chosen_by=f"{p.chosen_by}; {label}"))
    return out


# the prefetch-tiles set's depths: B loaded P columns ahead with P more registers (the latency A/B's
# variants), each on the tile the estimate prices lowest at that depth
PREFETCH_DEPTHS = (4, 8)


def cheapest_tile_at_depth(a: sp.csr_matrix, shape: LayerShape, prefetch: int, design, device, timer,
                           tiles=None) -> tuple[int, int, float] | None:
    """The kept candidate (M1, N1) the estimate prices lowest when B is loaded `prefetch` columns ahead
    under `prefetch` more registers than the §3.2 prediction (0 more at depth 1, the flow's kernel),
    with that price in µs; tiles in the flow's kept row order (search.layer_tiles). None for an
    empty layer or where no candidate's block fits the registers at that depth."""
    from lospmm.devices import block_fits_registers
    from lospmm.kernel.estimate import estimated_timing, full_kernel_work
    from lospmm.kernel.registers import predicted_registers
    from lospmm.search import layer_tiles
    from lospmm.stages.constrain import layer_candidates
    from lospmm.stages.reorder import tile_stats

    if a is None or a.nnz == 0:
        return None
    tiles = tiles or layer_tiles(a, shape.n)
    extra = prefetch if prefetch > 1 else 0
    best = None
    for c in layer_candidates(shape.n, {m1: tile_stats(t) for m1, t in tiles.items()}, device, design=design):
        registers = predicted_registers(c.m1, design=design) + extra
        if not c.kept or not block_fits_registers(registers, design.block_threads(c.n1), device):
            continue
        work = full_kernel_work(tiles[c.m1], shape.m, shape.k, shape.n, c.n1, registers, prefetch=prefetch,
                                design=design)
        # the timer's own device: a calibrated estimate's memory latency and bandwidths are its, not the table's
        us = estimated_timing(work, timer.device, timer.params).time_us
        if best is None or us < best[2]:
            best = (c.m1, c.n1, float(us))
    return best


def prefetch_tiles_plan(layers=AB_LAYERS, sparsity: float = 0.9, design: str = "chained",
                        depths=PREFETCH_DEPTHS, gpu: str = "h100") -> list[Planned]:
    """Tall tiles fed by deep prefetch (issue 30 item 3, issue 35): the headline found B's L2 traffic
    binding at about one multiply-add a loaded element, which taller tiles cut, but a tall tile's
    walk is one long chain of loads, each waiting a load's latency over (1 + prefetch), and the latency
    A/B moved the prefetch depth on the flow's short tiles only. Here, per A/B layer in `design`:
    the estimate's cheapest tile at depth 1 (`prefetch-1`, the flow's kernel), and for each depth P
    its cheapest tile at depth P (`prefetch-P`, with P more registers) and that same tile at depth 1
    (`prefetch-P-tile`: what the tile alone does); a kernel already planned for the layer (the same
    tile at the same depth) is not planned again. The launch rows carry each kernel's estimate at its
    depth, so the step's table sets the measured ratio beside it."""
    from lospmm.devices import device_named
    from lospmm.kernel.estimate import estimate_timer
    from lospmm.search import layer_tiles

    device, kernel_design = device_named(gpu), design_named(design)
    timer = estimate_timer(device)
    out = []
    for model, layer in layers:
        shape = next(s for s in gemm_shapes(model) if s.layer == layer)
        a = pruned(shape, sparsity)
        tiles = layer_tiles(a, shape.n)
        batch = 4 if model != "bert-base" else 32
        matrix = _id(model, layer, sparsity)

        def planned(label: str, tile, prefetch: int, why: str) -> Planned:
            return Planned(_id("prefetch-tiles", model, layer, label), "prefetch-tiles", model, layer, shape.m,
                           shape.k, shape.n, sparsity, batch, kernel_design.label, tile[0], tile[1], matrix,
                           why, variant=label, prefetch=prefetch, extra_registers=prefetch if prefetch > 1 else 0,
                           order="kept")

        flow = cheapest_tile_at_depth(a, shape, 1, kernel_design, device, timer, tiles)
        if flow is None:
            continue
        kernels = [("prefetch-1", flow, 1, f"the estimate's cheapest tile at depth 1 ({flow[2]:.1f} µs)")]
        for depth in depths:
            deep = cheapest_tile_at_depth(a, shape, depth, kernel_design, device, timer, tiles)
            if deep is not None:
                kernels += [(f"prefetch-{depth}", deep, depth,
                             f"the estimate's cheapest tile at depth {depth} ({deep[2]:.1f} µs), {depth} more registers"),
                            (f"prefetch-{depth}-tile", deep, 1, f"the depth-{depth} tile at depth 1")]
        planned_here: set = set()
        for label, tile, depth, why in kernels:  # the same kernel once: device seconds are scarce
            if (tile[0], tile[1], depth) not in planned_here:
                planned_here.add((tile[0], tile[1], depth))
                out.append(planned(label, tile, depth, why))
    return out


# (tiles a block, warps a tile): one warp a tile, and four (a tile's code fetched once for 128 columns:
# what the calibrated estimate's instruction supply asks for)
STAGED_VARIANTS = ((4, 1), (8, 1), (4, 4))


def staged_plan(layers=AB_LAYERS, sparsity: float = 0.9, variants=STAGED_VARIANTS) -> list[Planned]:
    """The staged A/B (issue 30 item 3, what the diagnosis points to): each A/B layer's `chained`
    kernel on its A/B tile, and the staged design (B through shared memory a block's tiles share,
    render.staged) with 4 and 8 tiles a block of one warp each (N1 = 32) and 4 tiles of 4 warps
    (N1 = 128), on the same tiles (M1 and row order). Its launch rows carry the estimate's staged
    model (kernel.estimate.staged_timing) on each block's copies, so the step's table sets the
    measured ratio beside the predicted one."""
    out = []
    for p in ab_plan(designs=("chained",), layers=layers, sparsity=sparsity):
        out.append(replace(p, id=_id("staged", p.model, p.layer, "chained"), set="staged", variant="chained",
                           chosen_by=f"{p.chosen_by}; the reference"))
        for g, w in variants:
            design = design_named(f"staged,tiles={g},warps={w}")
            label = f"staged,tiles={g}" + (f",warps={w}" if w != 1 else "")
            out.append(replace(p, id=_id("staged", p.model, p.layer, f"tiles-{g}" + (f"-warps-{w}" if w != 1 else "")),
                               set="staged", design=design.label, n1=design.fixed_n1, variant=label,
                               chosen_by=f"{p.chosen_by}; its M1 and rows, {g} tiles a block of {design.fixed_n1} "
                                         f"columns"))
    return out


MICRO_SPLIT = 256  # the micro set's K split: footprint-256's code a section


def micro_plan(n: int = 65536) -> list[Planned]:
    """The diagnosis kernels (synthetic A, M1 = 2, N1 = 128, chained loads):
    - footprint: one tile of 2 rows whose code grows from ~12 KB to ~0.8 MB, walked once by each of
      N/128 blocks (walks=1) or 16 column blocks by each block (walks=16): where the second is no
      faster per walk, the tile's code no longer fits the cache that served the repeats;
    - sharing: 32 tiles of ~512 nonzeros (~24 KB of code each), blocks of one tile dispatched
      together (column-x) or apart (tile-x), walked once or 16 times;
    - split: the footprint tiles larger than footprint-256 walked 16 times in a K split of MICRO_SPLIT
      nonzeros a section (footprint-256's code, which the repeats found cached): where the split's
      walks cost what footprint-256's do per nonzero, the split recovers the cliff (512 and 1024,
      whose whole code may still be cached, show what the split costs where it saves nothing)."""
    out = []
    for nnz in (256, 512, 1024, 2048, 4096, 16384):  # one function: ptxas is superlinear past ~16k
        for walks in (1, 16):
            design = design_named(f"chained,walks={walks}").label
            out.append(Planned(_id("micro-footprint", nnz, walks), "micro", "synthetic", f"footprint-{nnz}", 2,
                               2 * nnz, n, 0.75, 0, design, 2, 128, _id("synthetic-footprint", nnz), "fixed"))
        if nnz > MICRO_SPLIT:
            design = design_named(f"chained,walks=16,split={MICRO_SPLIT}").label
            out.append(Planned(_id("micro-footprint", nnz, 16, "split", MICRO_SPLIT), "micro", "synthetic",
                               f"footprint-{nnz}", 2, 2 * nnz, n, 0.75, 0, design, 2, 128,
                               _id("synthetic-footprint", nnz), "fixed", variant="split"))
    for order in ("tile-x", "column-x"):
        for walks in (1, 16):
            design = design_named(f"chained,{order},walks={walks}").label
            out.append(Planned(_id("micro-sharing", order, walks), "micro", "synthetic", "sharing-32x512", 64,
                               4096, n, 0.9375, 0, design, 2, 128, "synthetic-sharing", "fixed"))
    return out


# --- tiles the search chooses: the headline and the half set (issues 20, 23) ---------------------------


def headline_plan(design: str, sparsities=(0.7, 0.9, 0.95), batches=(4, 32), models=MODELS,
                  gpu: str = "h100") -> list[Planned]:
    """Every distinct zoo GEMM layer at each sparsity and CNN batch (BERT at 32×128 once), in
    `design`, on the tile the search chooses: the shipped ranker's top-10, timed by the estimate
    (the flow's choice without a GPU; registers predicted, not compiled)."""
    from lospmm.devices import device_named
    from lospmm.kernel.estimate import estimate_timer
    from lospmm.search import SearchParams

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


def searched_tile(shape: LayerShape, sparsity: float, design, device, timer, method: str = "") -> tuple[int, int] | None:
    """The tile the search chooses for the layer's pruned A (a half design's: A rounded to its dtype)
    in `design`: the shipped ranker of the design's kind, its top-10 proxies timed by `timer` (the
    flow's choice, search.choice). None for an empty layer."""
    from lospmm.kernel.timing import LaunchUnderTest
    from lospmm.search import SearchParams, choice, layer_search
    from lospmm.stages.pad import proxy_dynamic_shared

    a = pruned(shape, sparsity, method)
    if a is None or a.nnz == 0:
        return None
    a = in_format(a, design.number)[0]
    booster = _shipped_booster(design.half)
    search = layer_search(a, shape.n, sparsity, device, booster, SearchParams(design=design))
    timings = {(c.m1, c.n1, c.design): timer.time(LaunchUnderTest(
        search.tiles[c.m1], shape.m, shape.k, shape.n, c.n1, c.pred_regs,
        smem_bytes=proxy_dynamic_shared(search.launches[(c.m1, c.n1, c.design)].smem_bytes,
                                        search.clusters[(c.m1, c.design)], design_named(c.design), c.n1),
        clusters=search.clusters[(c.m1, c.design)], design=design)) for c in search.chosen}
    picked = choice(timings, timer.measures, {(c.m1, c.n1, c.design): c.pred_regs for c in search.chosen})
    return None if picked is None else picked[:2]


# NM-SpMM's ratios (M = 32, vector-wise: 32 rows share each pattern, as its 32 columns do), and 2:4
# element-wise (cuSPARSELt's pattern)
NM_PATTERNS = ("nm:16:32:32", "nm:12:32:32", "nm:8:32:32", "nm:4:32:32", "nm:2:4")


def nm_plan(patterns=NM_PATTERNS, layers=AB_LAYERS, design: str = "baseline", gpu: str = "h100") -> list[Planned]:
    """Issue 34's device step: each A/B layer that the pattern fits (K a multiple of M, rows of V),
    pruned to each N:M pattern (random positions, as the zoo) and, beside it, seeded random at the same
    sparsity, each baked on the tile the search chooses for its own A; and the N:M kernel (design nm)
    of the N:M A in the blocking the estimate prices lowest, as the flow's emit prices it: an N:M
    layer against our unstructured kernel, both of our N:M kernels against each other."""
    from lospmm.devices import device_named
    from lospmm.kernel.choices import nm_options
    from lospmm.kernel.estimate import estimate_timer
    from lospmm.search import SearchParams
    from lospmm.stages.prune import nm_pattern

    device, kernel_design = device_named(gpu), design_named(design)
    timer = estimate_timer(device)
    out = []
    for model, layer in layers:
        shape = next(s for s in gemm_shapes(model) if s.layer == layer)
        for method in patterns:
            pattern = nm_pattern(method)
            if pattern.problem(layer, shape.k):
                continue
            for prune in (method, ""):
                tile = searched_tile(shape, pattern.sparsity, kernel_design, device, timer, prune)
                if tile is None:
                    continue
                kind = prune or "random"
                out.append(Planned(_id("nm", model, layer, method, kind), "nm", model, layer, shape.m, shape.k, shape.n,
                                   pattern.sparsity, 4 if model != "bert-base" else 32, kernel_design.label, tile[0],
                                   tile[1], _id(model, layer, pattern.sparsity, kind),
                                   f"search: ranker top-{SearchParams().rank.top_k}, proxies timed by {timer.name}; "
                                   f"A {kind}, the {method} case", prune=prune))
            best = min(nm_options((pattern.n, pattern.m, pattern.vector), shape.m, shape.k, shape.n, device),
                       key=lambda s: s.estimate_us).nm
            out.append(Planned(_id("nm", model, layer, method, "nm-kernel"), "nm", model, layer, shape.m, shape.k,
                               shape.n, pattern.sparsity, 4 if model != "bert-base" else 32, design_named("nm").label,
                               best.block_rows, best.threads, _id(model, layer, pattern.sparsity, method),
                               f"the N:M kernel's blocking of least estimate ({timer.name}): {best.label}", prune=method,
                               nm=(best.block_rows, best.block_columns, best.thread_rows, best.thread_columns,
                                   best.depth)))
            tensor = mma_planned(_id("nm", model, layer, method, "mma-kernel"), "nm", model, layer, shape.m, shape.k,
                                 shape.n, pattern, 4 if model != "bert-base" else 32,
                                 _id(model, layer, pattern.sparsity, method),
                                 f"the sparse tensor-core kernel's blocking of least estimate ({timer.name}), fp16",
                                 method, device)
            if tensor is not None:
                out.append(tensor)
    return out


# NM-SpMM's LLaMA-like GEMMs (weights rows × K; tokens the N): too large to carry their A, so a bundle
# keeps none and the measurement regenerates it from its seed (nm_spmm_matrix)
NM_SPMM_SHAPES = ((4096, 4096), (11008, 4096), (4096, 11008))
NM_SPMM_TOKENS = (256, 4096)


def nm_spmm_matrix(rows: int, k: int, method: str) -> sp.csr_matrix:
    """The seeded N:M A of an NM-SpMM shape: the same on every machine (the seed is the shape's)."""
    from lospmm.stages.prune import nm_pattern, random_nm_pruned

    seed = int.from_bytes(hashlib.sha256(f"{rows}x{k}:{method}".encode()).digest()[:8], "little")
    return random_nm_pruned(rows, k, nm_pattern(method), np.random.default_rng(seed))


def nm_spmm_plan(patterns=NM_PATTERNS[:4], shapes=NM_SPMM_SHAPES, tokens=NM_SPMM_TOKENS,
                 tensor_cores: bool = True) -> list[Planned]:
    """NM-SpMM's own comparison: its ratios (16/12/8/4 of 32, rows in vectors of 32) on LLaMA-like
    GEMMs at 256 and 4096 tokens, our N:M kernel in the blocking the estimate prices lowest, against
    SGEMM (the baked kernel is left out: its code grows with A, 22 M nonzeros here); and on the same
    shapes 2:4 in fp16 on sparse tensor cores (variant `mma`, with `tensor_cores`), cuSPARSELt's own case."""
    from lospmm.devices import device_named
    from lospmm.kernel.choices import nm_options
    from lospmm.kernel.estimate import estimate_timer
    from lospmm.stages.prune import nm_pattern

    device = device_named("h100")
    timer = estimate_timer(device)
    out = []
    for rows, k in shapes:
        for n in tokens:
            for method in patterns:
                pattern = nm_pattern(method)
                options = nm_options((pattern.n, pattern.m, pattern.vector), rows, k, n, device)
                best = min(options, key=lambda s: s.estimate_us).nm
                # where the estimate takes a deeper stage, the best 32-column one beside it: the device
                # tells the gathered stage's gain from the depth's
                shallow = min((s for s in options if s.nm.depth == 32), key=lambda s: s.estimate_us).nm
                # and where that one gathers B's rows, the same blocking copying whole chunks (the kernel the
                # H200 measured first): what the gathered stages gain, on the same GPU
                try:
                    whole = replace(shallow, gather=False) if shallow.gathers else None
                except ValueError:  # a whole chunk over the shared memory a block may declare: no control
                    whole = None
                variants = ((best, ""), *(((shallow, "stage-32"),) if shallow != best else ()),
                            *(((whole, "whole-chunk"),) if whole is not None else ()))
                for tiling, variant in variants:
                    why = {"": f"the N:M kernel's blocking of least estimate ({timer.name}): {tiling.label}",
                           "stage-32": f"the 32-column stage of least estimate beside the chosen {best.label}",
                           "whole-chunk": f"{tiling.label}: the 32-column stage copying whole chunks"}[variant]
                    out.append(Planned(_id(NM_SPMM_MODEL, rows, k, n, method, *([variant] if variant else [])),
                                       NM_SPMM_MODEL, NM_SPMM_MODEL, f"{rows}x{k}", rows, k, n, pattern.sparsity, n,
                                       design_named("nm").label, tiling.block_rows, tiling.threads,
                                       _id(NM_SPMM_MODEL, rows, k, method), why, variant=variant, prune=method,
                                       nm=(tiling.block_rows, tiling.block_columns, tiling.thread_rows,
                                           tiling.thread_columns, tiling.depth, int(tiling.gather))))
    # cuSPARSELt's case on the same shapes: 2:4 element-wise, fp16, our kernel on sparse tensor cores
    for rows, k in shapes if tensor_cores else ():
        for n in tokens:
            pattern = nm_pattern(MMA_PATTERN)
            tensor = mma_planned(_id(NM_SPMM_MODEL, rows, k, n, MMA_PATTERN, "mma"), NM_SPMM_MODEL, NM_SPMM_MODEL,
                                 f"{rows}x{k}", rows, k, n, pattern, n, _id(NM_SPMM_MODEL, rows, k, MMA_PATTERN),
                                 f"2:4 on sparse tensor cores against cuSPARSELt's fp16, blocking of least estimate "
                                 f"({timer.name})", MMA_PATTERN, device)
            if tensor is not None:
                out.append(tensor)
    return out


MMA_PATTERN = "nm:2:4"


@functools.lru_cache(maxsize=None)
def _shipped_booster(half: bool):
    """The shipped ranker of a design's kind, loaded once for every layer of a plan."""
    from lospmm.flows.storage.ranker_store import load_ranker, shipped_ranker

    return load_ranker(shipped_ranker(half=half))[0]


def half_plan(sparsities=(0.9, 0.95), batches=(4, 32), models=MODELS, layers: tuple | None = None,
              variants=HALF_VARIANTS, gpu: str = "h100") -> list[Planned]:
    """Each distinct zoo GEMM layer (only `layers`, (model, layer) pairs, when given) at each
    sparsity and CNN batch (BERT at 32×128 once): the tile the fp16 search chooses (its design
    `fp16,chained`, the half ranker, the estimate), built in each half variant and as the fp32
    kernel of the same columns per thread and block (FP32_SAME_TILE) — issue 23's "our own fp32
    kernel on the same tiles"."""
    from lospmm.devices import device_named
    from lospmm.kernel.estimate import estimate_timer

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


# --- implicit-im2col convolutions (issue 13) ------------------------------------------------------------

CONV_CASES = (  # (label, Cout, geometry fields, epilogue): padding borders, stride 2, a 7×7 first layer
    ("7x7 stride 2 pad 3 (ResNet-50 conv1)", 64, dict(cin=3, h=224, w=224, kh=7, kw=7, stride=2, pad=3), "bias+relu"),
    ("3x3 stride 1 pad 1 (ResNet-50 layer1)", 64, dict(cin=64, h=56, w=56, kh=3, kw=3, stride=1, pad=1), ""),
    ("3x3 stride 2 pad 1 (ResNet-50 layer2.0)", 128, dict(cin=128, h=56, w=56, kh=3, kw=3, stride=2, pad=1), "relu"),
    ("3x3 dilation 2 pad 2", 32, dict(cin=32, h=28, w=28, kh=3, kw=3, stride=1, pad=2, dilation=2), "bias"),
    ("1x1 (ResNet-50 layer1 conv3)", 256, dict(cin=64, h=56, w=56, kh=1, kw=1), "relu"),
)


def conv_case_matrix(i: int, sparsity: float, method: str = "") -> sp.csr_matrix:
    """Conv case i's A: seeded random at `sparsity`, or by `method` (nm:N:M[:V]: random N:M positions)."""
    from lospmm.stages.prune import nm_pattern, random_nm_pruned, random_pruned

    _, cout, fields, _ = CONV_CASES[i]
    k = ConvGeometry(**fields).k
    if method:
        return random_nm_pruned(cout, k, nm_pattern(method), np.random.default_rng(i))
    return random_pruned(cout, k, sparsity, np.random.default_rng(i))


CONV_NM = "nm:2:4"  # the conv step's N:M pruning (cases whose K = Cin·kh·kw is a multiple of 4)
CONV_SLICED = "chained,slices=4"  # the conv step's sliced conv kernel: a tile's walk split over 4 groups of warps
CONV_HALF = "fp16"  # the conv step's tiled half conv kernel: fp16 X and Y, packed sums (a half run's default)


def conv_plan(sparsity: float = 0.9, m1: int = 2, n1: int = 256, batch: int = 4, nm: bool = True) -> list[Planned]:
    """Each conv case's implicit-im2col kernel (N = batch·h_out·w_out), the streamed design's
    implicit-im2col kernel of the same A and tile (issue 35: one loop whatever the layer, where the
    baked kernel's code grows with it), the staged design's (8 tiles of M1 rows a block over 32
    pixels: each block gathers its tiles' union of window inputs once a chunk), the baked conv kernel of
    two pixels a thread (v=2: each literal feeds two multiply-adds, the code serves twice the pixels a
    warp; issue 35, item 2), the sliced one (CONV_SLICED: each tile's columns walked by 4 groups of N1
    threads, at most 1024 a block, its shared rows reduced), the tiled half conv kernel of the same A rounded to fp16 and the same tile
    (CONV_HALF: its pair two pixels; against cuDNN in fp16), and the GEMM kernel of
    the same A and tile on the im2col matrix (what the search emits for the im2col GEMM); with `nm`,
    for each case whose K allows it, the N:M conv kernel in fp32 and fp16 and the baked conv kernel of
    its A pruned CONV_NM (issue 34: conv_nm_planned)."""
    from lospmm.stages.prune import nm_pattern

    out = []
    for i, (label, cout, fields, epilogue) in enumerate(CONV_CASES):
        g = ConvGeometry(**fields)
        conv = tuple(sorted(vars(g).items()))
        common = dict(model="conv-case", layer=f"{i}: {label}", m=cout, k=g.k, n=g.n(batch), sparsity=sparsity,
                      batch=batch, design=design_named("baseline").label, m1=m1, n1=n1, matrix=f"conv-case-{i}",
                      chosen_by="fixed")
        out.append(Planned(_id("conv", i, "conv"), "conv", conv=conv, epilogue=epilogue, **common))
        out.append(Planned(_id("conv", i, "streamed"), "conv", conv=conv, epilogue=epilogue, variant="streamed",
                           **(common | {"design": design_named("streamed").label})))
        staged = design_named("staged,tiles=8")  # its tiles share one warp's pixels: N1 = 32
        out.append(Planned(_id("conv", i, "staged"), "conv", conv=conv, epilogue=epilogue, variant="staged",
                           **(common | {"design": staged.label, "n1": staged.fixed_n1})))
        out.append(Planned(_id("conv", i, "v2"), "conv", conv=conv, epilogue=epilogue, variant="v2",
                           **(common | {"design": design_named("v=2").label})))
        sliced = design_named(CONV_SLICED)  # its block's threads and partial sums bound N1 (sliced_n1)
        out.append(Planned(_id("conv", i, "sliced"), "conv", conv=conv, epilogue=epilogue, variant="sliced",
                           **(common | {"design": sliced.label, "n1": sliced_n1(sliced, m1, n1)})))
        half = design_named(CONV_HALF)  # its A rounded to fp16: a matrix of its own in the bundle
        out.append(Planned(_id("conv", i, "fp16"), "conv", conv=conv, epilogue=epilogue, variant="fp16",
                           **(common | {"design": half.label, "matrix": _id("conv-case", i, half.dtype)})))
        out.append(Planned(_id("conv", i, "gemm"), "conv", variant="im2col-gemm", **common))
        if nm and g.k % nm_pattern(CONV_NM).m == 0:
            out += conv_nm_planned(i, g, common, epilogue)
    return out


# the conv step's half N:M conv kernel: fp16 B and C, packed sums (a half run's default)
CONV_NM_HALF = "nm,fp16"


def conv_nm_planned(i: int, g: ConvGeometry, common: dict, epilogue: str, device: str = "h100") -> list[Planned]:
    """Conv case i pruned CONV_NM: the N:M kernel's implicit-im2col form in the blocking the estimate
    prices lowest for a convolution on `device`, in fp32 and in fp16 (CONV_NM_HALF, its A rounded; against
    cuDNN in fp16), and the baked conv kernel of the same A at the case's tile (an N:M layer must never be
    slower than our unstructured kernel)."""
    from lospmm.devices import device_named
    from lospmm.kernel.choices import nm_options
    from lospmm.stages.prune import nm_pattern

    pattern = nm_pattern(CONV_NM)
    nm_common = common | {"sparsity": pattern.sparsity, "matrix": _id("conv-case", i, CONV_NM)}
    conv = tuple(sorted(vars(g).items()))

    def nm_kernel(variant: str, label: str) -> Planned:
        design = design_named(label)
        number = design.number  # a half kernel's A is rounded: a matrix of its own in the bundle
        matrix = nm_common["matrix"] if not number.is_half else _id("conv-case", i, CONV_NM, number.dtype)
        best = min(nm_options((pattern.n, pattern.m, pattern.vector), common["m"], g.k, common["n"],
                              device_named(device), design, conv=True), key=lambda s: s.estimate_us).nm
        return Planned(_id("conv", i, variant), "conv", conv=conv, epilogue=epilogue, variant=variant, prune=CONV_NM,
                       nm=(best.block_rows, best.block_columns, best.thread_rows, best.thread_columns, best.depth,
                           int(best.gather)),
                       **(nm_common | {"design": design.label, "m1": best.block_rows, "n1": best.threads,
                                       "matrix": matrix,
                                       "chosen_by": f"the estimate's cheapest N:M conv blocking: {best.label}"}))

    return [nm_kernel("nm", "nm"), nm_kernel("nm-fp16", CONV_NM_HALF),
            Planned(_id("conv", i, "nm-baked"), "conv", conv=conv, epilogue=epilogue, variant="nm-baked",
                    prune=CONV_NM, **nm_common)]


# --- the search's quality: Table 4's launch list (issue 24) ----------------------------------------------


@dataclass(frozen=True)
class SampleParams:
    """Defaults: 3 layers per model at sparsity 0.9 with at most 60k nonzeros (their full kernels
    compile in seconds), the ranker's top-10, and A/B variants on the largest sampled layer of each
    model: ptxas -O3 against the flow's -O1, and prefetch depths 0, 2, 4, 8 against 1. every_kept
    (issue 24's Table 4): besides, every kept candidate's full kernel, from one cubin per kept M1
    that reads N1 at launch (CodegenParams.n1_at_launch), launched at each of its kept N1."""

    sparsity: float = 0.9
    per_model: int = 3
    max_nnz: int = 60_000
    top_k: int = 10
    gpu: str = "h100"
    ptxas_levels: tuple[int, ...] = (3,)
    prefetch: tuple[int, ...] = (0, 2, 4, 8)
    models: tuple[str, ...] = MODELS
    every_kept: bool = False


def sampled_shapes(shapes, params: SampleParams) -> list:
    """Per model, `per_model` distinct GEMM shapes spread evenly over the sizes that fit max_nnz."""
    out = []
    for model in params.models:
        seen, fit = set(), []
        for s in shapes:
            key = (s.m, s.k, s.n)
            if s.model == model and s.ok and key not in seen and s.m * s.k * (1 - params.sparsity) <= params.max_nnz:
                seen.add(key)
                fit.append(s)
        fit.sort(key=lambda s: (s.m * s.k, s.n))
        if fit:
            picks = np.unique(np.linspace(0, len(fit) - 1, min(params.per_model, len(fit))).round().astype(int))
            out.extend(fit[i] for i in picks)
    return out


def sample_jobs(params: SampleParams = SampleParams()) -> list[Job]:
    """`sampled_shapes` of the zoo, each layer searched (the shipped ranker's top-K): its proxies
    (one per chosen M1, launched at each chosen N1) and top-K full kernels (variant ""), the
    best-ranked kept candidate of the other kind where the top-K holds only M1 = 1 or none
    ("outside-top-k"), every kept candidate (`every_kept`), and on each model's largest sampled
    layer the A/B variants of the top-ranked candidate's full kernel."""
    from lospmm.devices import device_named

    device = device_named(params.gpu)
    booster = _shipped_booster(False)
    picked = sampled_shapes([s for model in params.models for s in zoo_shapes(model)], params)
    largest = {s.model: s for s in picked}  # sampled_shapes lists each model's shapes smallest first
    return [job for s in picked for job in _layer_jobs(s, params, booster, device, largest[s.model] is s)]


def _layer_jobs(shape, params: SampleParams, booster, device, variants: bool) -> list[Job]:
    from lospmm.kernel.estimate import proxy_work
    from lospmm.search import SearchParams, layer_search, proxy_sources
    from lospmm.stages.pad import proxy_dynamic_shared
    from lospmm.stages.prune import pruned_layer
    from lospmm.stages.rank import RankParams

    a = pruned_layer(shape, params.sparsity).matrix
    search = layer_search(a, shape.n, params.sparsity, device, booster, SearchParams(rank=RankParams(top_k=params.top_k)))
    ranks = {(r.candidate.m1, r.candidate.n1): r.rank for r in search.ranked}
    tag = _id(shape.model, shape.layer)
    matrix = _id(shape.model, shape.layer, params.sparsity)
    base = dict(set="sample", model=shape.model, layer=shape.layer, m=shape.m, k=shape.k, n=shape.n,
                sparsity=params.sparsity, batch=4 if shape.model != "bert-base" else 32, matrix=matrix,
                chosen_by=f"search: ranker top-{params.top_k}")
    jobs = []
    proxies = proxy_sources(search, shape.m, shape.k)
    for (m1, label), kernel in proxies.items():  # one proxy per chosen M1 (one design), at each chosen N1 of it
        n1s = sorted(n1 for (pm1, n1, pl) in search.launches if (pm1, pl) == (m1, label))
        cl = search.clusters[(m1, label)]
        work = proxy_work(cl, shape.m, shape.k, shape.n, n1s[0], 0, 0)
        p = Planned(f"{tag}-p{m1}", design=design_named("baseline").label, m1=m1, n1=n1s[0], role="proxy",
                    rank=ranks[(m1, n1s[0])], also_at=tuple((n1, ranks[(m1, n1)]) for n1 in n1s[1:]), **base)
        jobs.append(Job(p, lambda kernel=kernel: kernel, None,
                        {"cluster_of": [int(x) for x in cl.cluster_of],
                         "smem_at": {n1: proxy_dynamic_shared(int(search.launches[(m1, n1, label)].smem_bytes), cl,
                                                              design_named(label), n1) for n1 in n1s},
                         "tile_loads": [int(x) for x in work.tile_loads], "tile_fmas": [int(x) for x in work.tile_fmas],
                         "zero_blocks": 0}))

    def full(c, variant="", prefetch=1, level=1, at_launch=False, also_at=()):
        suffix = f"-{variant}" if variant else ""
        p = Planned(f"{tag}-f{c.m1}x{c.n1}{suffix}", design=design_named("baseline").label, m1=c.m1, n1=c.n1,
                    variant=variant, rank=ranks.get((c.m1, c.n1), -1), prefetch=prefetch, ptxas_level=level,
                    n1_at_launch=at_launch, also_at=also_at, **base)
        return planned_job(p, lambda: a)

    jobs += [full(c) for c in search.chosen]
    # "does M1 = 1 really win where the estimate says so" needs both kinds measured on every layer
    kinds = {c.m1 == 1 for c in search.chosen}
    for want_one in (True, False):
        other = [r for r in search.ranked if (r.candidate.m1 == 1) == want_one]
        if want_one not in kinds and other:
            jobs.append(full(min(other, key=lambda r: r.rank).candidate, "outside-top-k"))
    if params.every_kept:  # one cubin per kept M1, launched at each of its kept N1 (variant every-kept)
        for m1 in sorted({c.m1 for c in search.kept}):
            kept = sorted((c for c in search.kept if c.m1 == m1), key=lambda c: c.n1)
            jobs.append(full(kept[0], "every-kept", at_launch=True,
                             also_at=tuple((c.n1, ranks.get((m1, c.n1), -1)) for c in kept[1:])))
    if variants and search.chosen:
        top = min((r for r in search.ranked if r.chosen), key=lambda r: r.rank).candidate
        jobs += [full(top, f"ptxas-O{level}", level=level) for level in params.ptxas_levels]
        jobs += [full(top, f"prefetch-{depth}", prefetch=depth) for depth in params.prefetch]
    return jobs


# --- a set by name -------------------------------------------------------------------------------------


def set_jobs(name: str, **options) -> list[Job]:
    """The jobs of a set by name (the device program's bundles): ab, micro, headline, half, conv,
    reorder, nm, nm-spmm, latency, staged, prefetch-tiles, sample; `options` are its plan's parameters."""
    if name == "sample":
        return sample_jobs(SampleParams(**options))
    plans = {"ab": ab_plan, "micro": micro_plan, "headline": headline_plan, "half": half_plan, "conv": conv_plan,
             "reorder": reorder_plan, "nm": nm_plan, "nm-spmm": nm_spmm_plan, "latency": latency_plan,
             "staged": staged_plan, "prefetch-tiles": prefetch_tiles_plan}
    if name not in plans:
        raise ValueError(f"no kernel set {name!r}: choose one of {', '.join([*plans, 'sample'])}")
    return [planned_job(p) for p in plans[name](**options)]
