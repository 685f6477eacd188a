"""The search of one layer, composed from the stages in DAG order: tiles (reorder) -> candidates
(constrain) -> ranked and chosen (rank) -> proxy clusters (cluster) -> proxy launches (pad), and,
given a timer's results, the choice (emit). The flow runs the same functions stage by stage with an
artifact after each; the benchmarks call `layer_search`, `train-ranker` its reorder and constrain steps.
"""

from __future__ import annotations

import time

from dataclasses import dataclass, field
from typing import Callable, Mapping

import scipy.sparse as sp

from lospmm.stages.cluster import ClusterParams, ProxyClusters, chosen_proxy_clusters
from lospmm.kernel.design import BASELINE, KernelDesign, design_named
from lospmm.kernel.render import CodegenParams, kernel_source, proxy_source
from lospmm.kernel.spec import KernelSource
from lospmm.stages.compile import compiled_kernel, kernel_options
from lospmm.stages.constrain import Candidate, ConstrainParams, layer_candidates, predicted_registers, searched_designs
from lospmm.devices import Device
from lospmm.stages.emit import fastest_proxy
from lospmm.stages.pad import ProxyLaunch, proxy_dynamic_shared, proxy_launch
from lospmm.stages.rank import FEATURES, RankedCandidate, RankParams, chosen_candidates, feature_row
from lospmm.stages.reorder import ReorderParams, Tiles, layer_orders, tile_stats
from lospmm.status import Status
from lospmm.kernel.timing import LaunchUnderTest, Timer, Timing

# M1 (rows of a thread's output tile): 1 to 256. The register constraint removes the tallest
# (M1 = 256 needs > 255 registers); Table 3 of the paper trains on 2..128.
DEFAULT_M1 = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


@dataclass(frozen=True)
class SearchParams:
    """Every parameter of a layer's search. Defaults: M1 in DEFAULT_M1, each stage's defaults and
    the baseline kernel design (the constraints, proxies and full kernels follow `design`), designs=()
    (more than one: each layer's candidates span these designs, ranked together by a design-aware
    ranker; `searched` says which)."""

    m1s: tuple[int, ...] = DEFAULT_M1
    reorder: ReorderParams = field(default_factory=ReorderParams)
    constrain: ConstrainParams = field(default_factory=ConstrainParams)
    rank: RankParams = field(default_factory=RankParams)
    cluster: ClusterParams = field(default_factory=ClusterParams)
    design: KernelDesign = BASELINE
    designs: tuple[KernelDesign, ...] = ()  # several: the design is a search dimension (`--design auto`), `design` first

    def searched(self, op: str = "", implicit_conv: bool = True) -> tuple[KernelDesign, ...]:
        """The designs a layer's search spans (stages.constrain.searched_designs): `designs`, or `design` alone."""
        return searched_designs(self.designs or (self.design,), op, implicit_conv)


@dataclass(frozen=True)
class LayerSearch:
    """What the search decides for one layer before anything is compiled. A proxy is keyed by its
    (M1, design label), a launch by its (M1, N1, design label): with one design searched, every
    label is `design`'s."""

    tiles: dict[int, Tiles]  # per M1 (reorder)
    candidates: list[Candidate]  # every (M1, N1, design), each with removed_by (constrain)
    ranked: list[RankedCandidate]  # the kept ones, scored (rank)
    clusters: dict[tuple[int, str], ProxyClusters]  # per (M1, design) of a chosen candidate (cluster)
    launches: dict[tuple[int, int, str], ProxyLaunch]  # per chosen (M1, N1, design) (pad)
    seconds: dict[str, float] = field(default_factory=dict, compare=False)  # wall seconds per stage (reorder … pad)
    design: KernelDesign = BASELINE  # the kernel design it searched for first (the only one, unless `designs`)
    designs: tuple[KernelDesign, ...] = ()  # every design it searched (`design` first)

    @property
    def kept(self) -> list[Candidate]:
        return [c for c in self.candidates if c.kept]

    @property
    def chosen(self) -> list[Candidate]:
        return [r.candidate for r in self.ranked if r.chosen]

    def design_of(self, label: str) -> KernelDesign:
        """The searched design with this label."""
        return next((d for d in self.designs or (self.design,) if d.label == label), None) or design_named(label)


def layer_tiles(matrix: sp.csr_matrix, n: int, m1s=DEFAULT_M1, params: ReorderParams = ReorderParams()) -> dict[int, Tiles]:
    """The reorder stage's kept order (stages.reorder.ordered_tiles, priced for N = `n`) for every
    distinct M1 worth tiling."""
    return {m1: r.tiles for m1, r in layer_orders(matrix, m1s, n, params).items()}


def chosen_by_proxy(chosen: list) -> dict[tuple[int, str], list]:
    """Chosen candidates (objects or rows) grouped by (M1, design label): one proxy per group, in
    that order."""
    get = (lambda c: (c["m1"], c.get("design") or BASELINE.label)) if chosen and isinstance(chosen[0], dict) \
        else (lambda c: (c.m1, c.design))
    out: dict[tuple[int, str], list] = {}
    for c in chosen:
        out.setdefault(get(c), []).append(c)
    return dict(sorted(out.items()))


def layer_search(matrix: sp.csr_matrix, n: int, sparsity: float, device: Device, booster=None,
                 params: SearchParams = SearchParams(), features: tuple[str, ...] = FEATURES, op: str = "",
                 implicit_conv: bool = True) -> LayerSearch:
    """Stages 3–7 for one pruned layer (`booster`: the ranker, on its `features`; None only with
    rank.use_rank=False; `op` "conv": a convolution, whose designs are those of its implicit-im2col
    kernel where several are searched)."""
    seconds, clock = {}, time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[stage], clock = now - clock, now

    tiles = layer_tiles(matrix, n, params.m1s, params.reorder)
    lap("reorder")
    designs = params.searched(op, implicit_conv)
    candidates = layer_candidates(n, {m1: tile_stats(t) for m1, t in tiles.items()}, device, params.constrain,
                                  empty=matrix.nnz == 0, designs=designs, conv=op == "conv" and implicit_conv)
    kept = [c for c in candidates if c.kept]
    lap("constrain")
    scores, ranks, chosen = chosen_candidates([feature_row(c, sparsity, matrix.shape[1]) for c in kept], booster,
                                              params.rank, features)
    ranked = [RankedCandidate(c, float(s), int(r), bool(ch)) for c, s, r, ch in zip(kept, scores, ranks, chosen)]
    picked = [r.candidate for r in ranked if r.chosen]
    lap("rank")
    by_label = {d.label: d for d in designs}
    clusters = {(m1, label): chosen_proxy_clusters(matrix, tiles[m1], group, sparsity, device, params.cluster,
                                                   by_label[label])[0]
                for (m1, label), group in chosen_by_proxy(picked).items()}
    lap("cluster")
    launches = {(c.m1, c.n1, c.design): proxy_launch(c.num_a_tiles, n, c.m1, c.n1, c.pred_regs, device,
                                                     by_label[c.design]) for c in picked}
    lap("pad")
    return LayerSearch(tiles, candidates, ranked, clusters, launches, seconds, designs[0], designs)


def proxy_sources(search: LayerSearch, m: int, k: int) -> dict[tuple[int, str], KernelSource]:
    """The proxy kernel of each chosen (M1, design) (stage 8's input)."""
    return {(m1, label): proxy_source(m, k, cl, CodegenParams(design=search.design_of(label)))
            for (m1, label), cl in search.clusters.items()}


def full_source(matrix: sp.csr_matrix, search: LayerSearch, m1: int, n1: int, design: str = "") -> KernelSource:
    """The full Alg. 2 kernel of one tile in the design with label `design` (the search's first by
    default): stage 10's output, or compile-all's every candidate."""
    return kernel_source(matrix, search.tiles[m1], n1,
                         CodegenParams(design=search.design_of(design) if design else search.design))


def choice(timings: Mapping[tuple[int, int, str], Timing], measured: bool = False,
           registers: Mapping[tuple[int, int, str], int] | None = None) -> tuple[int, int, str] | None:
    """The (M1, N1, design label) emit takes from a layer's proxy timings, by the flow's emit rule:
    measured timings (`measured`) within EmitParams.tie_band of the fastest are ties (broken by the
    larger M1, then fewer `registers` where given, then the time); estimates have no band."""
    from lospmm.stages.emit import EmitParams

    rows = [{"m1": m1, "n1": n1, "design": label, "time_us": t.time_us, "status": t.status,
             "registers": (registers or {}).get((m1, n1, label))} for (m1, n1, label), t in timings.items()]
    best = fastest_proxy(rows, EmitParams().tie_band if measured else 0.0)
    return None if best is None else (best["m1"], best["n1"], best["design"])


def full_kernel_time(timer: Timer, matrix: sp.csr_matrix, tiles: Tiles, m: int, k: int, n: int, n1: int,
                     design: KernelDesign = BASELINE) -> float:
    """µs of the full kernel of `tiles` in blocks of `n1`: compiled and run where the timer runs
    binaries (inf if it does not compile), else the timer's estimate at the §3.2 register
    prediction (what the search assumes). train-ranker and the proxy-fidelity benchmark time
    candidates with it."""
    launch = LaunchUnderTest(tiles, m, k, n, n1, predicted_registers(tiles.m1, design=design), design=design,
                             matrix=matrix)
    if timer.runs_binary:
        kernel = kernel_source(matrix, tiles, n1, CodegenParams(design=design))
        out = compiled_kernel(kernel, kernel_options(timer.device.arch, tiles.m1, design=design))
        if out.status != Status.OK:
            return float("inf")
        launch = LaunchUnderTest(tiles, m, k, n, n1, out.registers, out.thread_spill_bytes, spec=kernel.spec, matrix=matrix,
                                 cubin=out.cubin)
    return timer.time(launch).time_us


def proxy_timings(search: LayerSearch, m: int, k: int, n: int, timer: Timer,
                  compiled_of: Callable | None = None) -> dict[tuple[int, int, str], Timing]:
    """Stages 8 and 9 for one layer, as the flow runs them: each chosen (M1, design)'s proxy compiled
    (`compiled_of(kernel, m1)`, default compile.compiled_kernel at the register prediction) and every
    chosen candidate of that M1 and design timed by `timer` with its Eq. 6 shared memory; a proxy that
    does not compile times none of its candidates."""
    compiled_of = compiled_of or (lambda kernel, m1: compiled_kernel(kernel, kernel_options(
        timer.device.arch, m1, design=kernel.spec.design)))
    out = {}
    for (m1, label), kernel in proxy_sources(search, m, k).items():
        compiled = compiled_of(kernel, m1)
        if compiled.status != Status.OK:
            continue
        for (cm1, n1, clabel), launch in search.launches.items():
            if (cm1, clabel) == (m1, label):
                clusters = search.clusters[(m1, label)]
                out[(m1, n1, label)] = timer.time(LaunchUnderTest(
                    None, m, k, n, n1, compiled.registers, compiled.thread_spill_bytes,
                    proxy_dynamic_shared(launch.smem_bytes, clusters, kernel.spec.design, n1), clusters=clusters,
                    spec=kernel.spec,
                    cubin=compiled.cubin if timer.runs_binary else None))
    return out
