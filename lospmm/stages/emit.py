"""Stage 10, emit: the timed proxies of one layer -> the chosen tile, and what its full kernel's
directory says about it (§6.1). Pure: the flow compiles, checks and writes what these decide.

The choice: the fastest proxy that timed ok (ties: fastest_proxy's rule). Its kernel in the run's
design, in the other designs a `--design auto` run prices (EmitParams.designs) and, for a layer
whose A holds an N:M pattern, the data-driven N:M kernel (lospmm.kernel.nm) in each blocking are
priced by the estimate (lospmm.kernel.choices) and the cheapest is emitted (`cheapest_design`: a
design's tiles ranked by the estimate, the designs by the device's fitted design price; the
runner-up is recorded with its estimate and price). Where the run's timer measures, the estimate only prunes:
the full kernels of its few cheapest (`measured_contenders`) are timed and the fastest that passes
its check is served (`fastest_measured`). The full kernel of that
tile is compiled and checked (lospmm.kernel.check: one metric and tolerance per number format): on
the device when the run's timer runs binaries (`cuda`), else on the host from the same source under
AddressSanitizer, with N = 2·N1 + 3 columns (two full column blocks and a partial one; a
convolution: two images). A speedup over dense is only ever a ratio of two measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from lospmm.kernel.design import BASELINE, KernelDesign, conv_served_implicitly
from lospmm.stages.rank import RankParams
from lospmm.status import Status


@dataclass(frozen=True)
class EmitParams:
    """Defaults: verify=True (check every emitted kernel; its tolerance is its number format's),
    device_check_n=77 (columns of B in the device check of a GEMM kernel), chosen_by="" (filled
    from the rank parameters by `emit_params`), implicit_conv=True (a dense convolution whose
    geometry is known gets a kernel that reads its NCHW input itself, §6.2, instead of the im2col
    GEMM's; same tile, bias and activation left to the caller), tie_band=0.05 (measured proxies within
    5% of the fastest are ties, broken by fastest_proxy's rule: our kernels repeat within about 6%
    between calls on the H100, so a smaller difference says nothing), nm_kernel=True (a layer whose
    A holds an N:M pattern (a convolution's in its implicit-im2col form) is served by the N:M kernel where the estimate prices it below the baked
    kernel of its chosen tile), designs=() (other designs, by label, in which the chosen tile's kernel is
    priced beside the run's, the cheapest emitted: a `--design auto` run's kernel.choices.DESIGN_CANDIDATES),
    measure_designs=3, measure_within=1.5 (where the run's timer measures, the full kernels of the 3
    ways to serve a layer the estimate prices lowest, those within 1.5× of the cheapest, and the
    fastest proxy's kernel where they leave it out, are compiled, checked and timed, and the fastest is served (fastest_measured, ties within tie_band to the
    estimate's order): the estimate prunes, the device decides; 1: the estimate's choice alone)."""

    verify: bool = True
    device_check_n: int = 77
    chosen_by: str = ""
    implicit_conv: bool = True
    tie_band: float = 0.05
    nm_kernel: bool = True
    designs: tuple[str, ...] = ()
    measure_designs: int = 3
    measure_within: float = 1.5


def chosen_by(rank: RankParams) -> str:
    """How the emitted tile was chosen, for the `chosen_by` column and kernel.json."""
    return (f"top-1 proxy of the ranker's top-{rank.top_k}" if rank.use_rank
            else "top-1 proxy of every kept candidate")


def emit_params(rank: RankParams, verify: bool = True, implicit_conv: bool = True, nm_kernel: bool = True,
                designs: tuple[str, ...] = ()) -> EmitParams:
    return EmitParams(verify=verify, chosen_by=chosen_by(rank), implicit_conv=implicit_conv, nm_kernel=nm_kernel,
                      designs=designs)


def served_design(p) -> str | None:
    """The design a way to serve a layer renders a tile in (its label), None for an untiled kernel
    (the N:M kernel: no tiles, no design price)."""
    return p.design.label if getattr(p, "nm", None) is None and getattr(p, "design", None) is not None else None


def _order(value: float, index: int) -> tuple:
    # an infinite or NaN price (it cannot run) never wins over a finite one; ties keep the earlier
    return (not math.isfinite(value), value if math.isfinite(value) else 0.0, index)


def _scale(prices: Sequence):
    """How `prices`' tiled designs compare: their design prices where every one has one (the device's
    fitted DesignPricing; `price_us`), else all by the estimate — never one design's price against
    another's estimate."""
    tiled = [p for p in prices if served_design(p) is not None]
    if tiled and all(getattr(p, "price_us", None) is not None for p in tiled):
        return lambda p: p.price_us
    return lambda p: p.estimate_us


def ranked_designs(prices: Sequence) -> list:
    """`prices` cheapest first (issue 35, item 4). The tiled kernels in two levels: a design's tiles
    by the estimate (`estimate_us`: it ranks a layer's tiles better), the designs by their best
    tile's design price (`price_us`: lospmm.kernel.estimate.DesignPricing, fitted and held out on
    measured designs; the estimate where a design has none, _scale): every design's best tile,
    cheapest design first, then the other tiles by their design's rank. The untiled kernels (N:M),
    which no design price covers, merge in by the estimate, the tiled kernels' first standing at
    their lowest estimate: an N:M kernel is first exactly where it was before the design price (its
    estimate under every tiled kernel's). Ties keep the earlier (the baked kernel of the searched tile
    is priced first)."""
    groups: dict = {}
    untiled = []
    for i, p in enumerate(prices):
        label = served_design(p)
        (groups.setdefault(label, []) if label is not None else untiled).append((i, p))
    for members in groups.values():
        members.sort(key=lambda ip: _order(ip[1].estimate_us, ip[0]))
    scale = _scale(prices)
    order = sorted(groups.values(), key=lambda members: _order(scale(members[0][1]), members[0][0]))
    tiled = [members[0] for members in order] + [ip for members in order for ip in members[1:]]
    # the merge's keys are estimates: the tiled kernels' first stands at their lowest, the others at
    # their own but never under the one before (their order is the price's)
    keyed, lowest = [], min((_order(p.estimate_us, i) for i, p in tiled), default=None)
    for i, p in tiled:
        keyed.append((max(keyed[-1][0], _order(p.estimate_us, i)) if keyed else lowest, p))
    # the tiled keys never fall, so a stable sort keeps the price's order among them
    return [p for _, p in sorted(keyed + [(_order(p.estimate_us, i), p) for i, p in untiled], key=lambda kp: kp[0])]


def cheapest_design(prices: Sequence) -> tuple:
    """The cheapest of `prices` (kernel.choices.Served, or anything with an `estimate_us`) and the
    runner-up (None when there is one), in ranked_designs' order."""
    if not prices:
        raise ValueError("no design priced")
    ranked = ranked_designs(prices)
    return ranked[0], (ranked[1] if len(ranked) > 1 else None)


def measured_contenders(prices: Sequence, count: int, within: float) -> list:
    """The ways to serve a layer whose full kernels a measuring timer times (`EmitParams.measure_designs`):
    the `count` first in ranked_designs' order within `within`× the cheapest on their own scale (a tiled
    kernel's design price against the cheapest tiled one's, _scale; an N:M kernel's estimate against
    the lowest estimate); the first alone when `count` <= 1 (or its figure is not finite)."""
    ranked = ranked_designs(prices)
    if not ranked:
        raise ValueError("no design priced")
    scale = _scale(prices)
    tiled = [p for p in ranked if served_design(p) is not None]
    best_tiled = scale(tiled[0]) if tiled else math.inf
    best_estimate = min((p.estimate_us for p in ranked if math.isfinite(p.estimate_us)), default=math.inf)

    def close(p, factor: float) -> bool:
        """Its figure on its own scale is finite and within `factor`× the cheapest there."""
        value, best = (scale(p), best_tiled) if served_design(p) is not None else (p.estimate_us, best_estimate)
        return math.isfinite(value) and value <= factor * best

    if count <= 1 or not close(ranked[0], math.inf):
        return ranked[:1]
    return [p for p in ranked if close(p, within)][:count]


def fastest_measured(times: Sequence[float], tie_band: float = 0.0) -> int | None:
    """Index of the fastest of the contenders' measured full-kernel times (given in ranked_designs'
    order), None when none is finite. Times within `tie_band` of the fastest tie, and a tie keeps the
    one ranked first (the earlier): a difference inside the device's repeatability says nothing."""
    finite = [(t, i) for i, t in enumerate(times) if t is not None and math.isfinite(t)]
    if not finite:
        return None
    fastest = min(t for t, _ in finite)
    return min(i for t, i in finite if t <= fastest * (1 + tie_band))


def timed_rows(timed: Sequence[dict]) -> list[dict]:
    """The candidates that timed ok (a finite time), in their rows' order."""
    return [r for r in timed if r["status"] == Status.OK and np.isfinite(r["time_us"])]


def timed_ok(timed: Sequence[dict]) -> int:
    """How many proxies timed ok: the candidates behind the choice."""
    return len(timed_rows(timed))


def fastest_proxy(timed: Sequence[dict], tie_band: float = 0.0) -> dict | None:
    """The timed row (with m1, n1, time_us, status) whose proxy ran fastest; None if none timed ok.
    Rows within `tie_band` (relative) of the fastest time are ties, broken by a stated rule rather
    than by noise: fewer spilled bytes, then the larger M1 (fewer B loads and instructions per
    nonzero), fewer registers, and last the time itself (then the smaller N1). Not N1 first: on the
    committed H100 samples preferring the larger N1 among ties lost 2.6 points of mean loss at 0.7."""
    ok = timed_rows(timed)
    if not ok:
        return None
    fastest = min(r["time_us"] for r in ok)
    tied = [r for r in ok if r["time_us"] <= fastest * (1.0 + tie_band)]
    return min(tied, key=lambda r: (r.get("spill_bytes") or 0, -r["m1"], r.get("registers") or 0, r["time_us"],
                                    r["n1"]))


def host_check_columns(n1: int) -> int:
    """N of the host check: two full column blocks and a partial third."""
    return 2 * n1 + 3


def speedup(dense_us: float, full_us: float, measured: bool) -> float:
    """dense / full when both are measurements, else NaN (an estimate is never a speedup)."""
    if not measured or not (math.isfinite(dense_us) and math.isfinite(full_us)) or full_us <= 0:
        return float("nan")
    return dense_us / full_us


def check_column(where: str, result) -> tuple[float, str]:
    """(the error, the `check` column) of an emitted kernel's check (kernel.check.CheckResult, or
    None: not run) on the `host` (under AddressSanitizer) or the `device`."""
    if result is None:
        return float("nan"), "not run"
    if result.ok:
        return result.error, "host-asan" if where == "host" else "device"
    return result.error, f"{where}: FAILED"


def kernel_form(shape: dict, params: EmitParams = EmitParams(), design: KernelDesign = BASELINE) -> str:
    """`implicit-conv` for a convolution (a grouped one as its block-diagonal dense form) with its geometry
    when params ask for it and an implicit-im2col kernel may serve it (design.conv_served_implicitly: the
    design's conv form — a baked design's grid order, walks and columns per thread in its number format, a
    streamed one's order, walks and columns per thread, a staged one's blocking — or the N:M kernel's on CUDA cores, fp32 or
    half), else `gemm` (a linear layer, or a convolution on an im2col B: the design the search searched).
    Each way to serve an `implicit-conv` layer takes its own form (served_form): the N:M kernel on sparse
    tensor cores is the im2col GEMM's beside the conv forms of the others."""
    conv = shape.get("op") == "conv" and shape.get("groups", 0) >= 1 and shape.get("h_in", 0) > 0
    return ("implicit-conv" if params.implicit_conv and conv and conv_served_implicitly(design, params.nm_kernel)
            else "gemm")


def served_form(design: KernelDesign, conv: bool) -> str:
    """The form of a layer's kernel in `design`: `implicit-conv` where the layer is a convolution given
    its geometry (`conv`: kernel_form's implicit-conv) and the design is a conv kernel's, else `gemm`."""
    return "implicit-conv" if conv and design.serves_conv else "gemm"


def emit_failed(compile_status: str, check: str) -> bool:
    """A layer's emit failed when its full kernel did not compile or its check failed."""
    return compile_status != Status.OK or "FAILED" in check
