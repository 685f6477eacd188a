"""The ways one layer can be served, each priced by the estimate: the baked kernel of the tile the
search chose (in the run's design), and the kernels of designs that need no tiles but a structure
of A — today the N:M kernel (lospmm.kernel.nm) of an A with an N:M pattern, in each blocking that
fits. The emit stage keeps the cheapest (stages.emit.cheapest_design) and renders it with
`kernel_source(..., nm=served.nm)`; a caller never asks which kind a choice is."""

from __future__ import annotations

from dataclasses import dataclass

from lospmm.kernel.design import KernelDesign, design_named
from lospmm.kernel.estimate import NMWork, estimate_timer, nm_registers, nm_timing
from lospmm.kernel.nm import NMTiling, held_pattern, nm_tilings
from lospmm.kernel.registers import predicted_registers
from lospmm.kernel.timing import LaunchUnderTest

NM_DESIGN = design_named("nm")


@dataclass(frozen=True)
class Served:
    """One way to serve a layer: `label` (10_kernels' `design`: `M1×N1` for the baked kernel of that
    tile in the run's design, `nm N:M[:V],<block>,<thread>` for the N:M kernel), its estimate, the
    design it is rendered in and, for the N:M kernel, its blocking."""

    label: str
    estimate_us: float
    design: KernelDesign
    nm: NMTiling | None = None

    @property
    def tiled(self) -> bool:
        """Whether it is rendered on the reordered tiles (the baked kernel of the searched tile)."""
        return self.nm is None


def served_options(matrix, tiles, m: int, k: int, n: int, n1: int, design: KernelDesign, device,
                   untiled: bool = True) -> list[Served]:
    """Every way to serve a layer, each with its estimate on `device` (calibrated where a calibration
    is stored): the baked kernel of the chosen tile (`tiles`, `n1`) in `design` first, then, with
    `untiled`, the kernels that need no tiles and can serve this A in this number format
    (untiled_options)."""
    estimate = estimate_timer(device)
    baked = estimate.time(LaunchUnderTest(tiles, m, k, n, n1, predicted_registers(tiles.m1, design=design),
                                          design=design))
    options = [Served(f"{tiles.m1}×{n1}", float(baked.time_us), design)]
    return options + (untiled_options(matrix, n, device, design) if untiled else [])


def untiled_options(matrix, n: int, device, design: KernelDesign) -> list[Served]:
    """The N:M kernel in each blocking that fits, when A holds an N:M pattern (nm.held_pattern) and
    `design` is fp32 (the N:M kernel's only format so far)."""
    if design.half:
        return []
    pattern = held_pattern(matrix)
    if pattern is None:
        return []
    estimate = estimate_timer(device)
    m, k = matrix.shape
    return [Served(f"nm {t.label}", float(nm_timing(NMWork(t, m, k, n, nm_registers(t)), estimate.device,
                                                    estimate.params).time_us), NM_DESIGN, t)
            for t in nm_tilings(*pattern)]


def untiled_served(matrix, n: int, device, design: KernelDesign, layer: str = "") -> Served:
    """The cheapest kernel of `design` (one that needs no tiles) for `matrix` over N columns;
    ValueError naming the layer when `design` is tiled or cannot serve this A."""
    if design.tiled:
        raise ValueError(f"{layer}: design {design.label} is rendered on the search's tiles")
    options = untiled_options(matrix, n, device, design)
    if not options:
        raise ValueError(f"{layer}: its A holds no N:M pattern (prune it with --prune nm:N:M[:V], or bring N:M "
                         f"weights with --prune keep); the nm design serves N:M layers only")
    return min(options, key=lambda s: s.estimate_us)
