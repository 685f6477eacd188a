"""The ways one layer can be served, each priced by the estimate: the kernel of the tile the search
chose in the run's design and, for a `--design auto` run, in every design of DESIGN_CANDIDATES
that can serve it (its registers, the grid's limits, a convolution's implicit-im2col kernel in its
conv form: KernelDesign.conv_kernel); and the kernels of designs that need no tiles but a structure of A — today the
N:M kernel (lospmm.kernel.nm) of an A with an N:M pattern, in each blocking that fits, and in a half
run its form on sparse tensor cores (lospmm.kernel.sparse_mma) where the pattern allows. The emit
stage keeps the cheapest (stages.emit.cheapest_design) and renders it with `kernel_source(...,
served.design, nm=served.nm)`; a caller never asks which kind a choice is."""

from __future__ import annotations

from dataclasses import dataclass, replace

from lospmm.devices import block_fits_registers, launch_block_registers
from lospmm.kernel.design import KernelDesign, design_in, design_named
from lospmm.kernel.estimate import NMWork, estimate_timer, nm_registers, nm_timing
from lospmm.kernel.nm import NMTiling, held_pattern, nm_tilings
from lospmm.kernel.sparse_mma import MMATiling
from lospmm.kernel.registers import predicted_registers
from lospmm.kernel.layout import LaunchLayout
from lospmm.kernel.timing import LaunchUnderTest

NM_DESIGN = design_named("nm")
# the designs a `--design auto` run prices for each layer's tile: those the device program's A/B
# measured (benchmarks.sets.AB_DESIGNS), so that the estimate's choice is checked against the device's
DESIGN_CANDIDATES = ("baseline", "chained", "chained,column-x", "chained,walks=4", "chained,walks=16", "chained,v=2",
                     "chained,v=4", "chained,v=4,walks=4", "streamed,chained", "streamed,chained,v=4")
# designs the device program's A/B measures before `--design auto` prices them: a layer's designs compare
# by the fitted design price only where every one has a factor (estimate.DesignPricing), so a design
# joins DESIGN_CANDIDATES once a window has measured it and `python -m benchmarks.design_estimate` has
# fitted its factor; until then a run serves it with --design (the K split across a block's warps)
PENDING_DESIGNS = ("chained,slices=2", "chained,slices=4", "chained,v=2,slices=2")


@dataclass(frozen=True)
class Served:
    """One way to serve a layer: `label` (10_kernels' `design`: `M1×N1` for the baked kernel of that
    tile in the default design (the baseline, in its number format), `M1×N1 <design label>` in
    another, `nm N:M[:V],<block>,<thread>` for the N:M kernel), its estimate, the design it is
    rendered in and, for the N:M kernel, its blocking."""

    label: str
    estimate_us: float
    design: KernelDesign
    nm: "NMTiling | MMATiling | None" = None
    m1: int = 0  # the tile of a tiled kernel (0 for the N:M kernel)
    n1: int = 0
    # the price that compares it with the layer's other designs (EstimateTimer.design_price: the
    # device's fitted DesignPricing); None where there is none (an untiled kernel, a conv form, a
    # design without a factor, a device without a pricing): stages.emit then compares by the estimate
    price_us: float | None = None

    @property
    def design_price_us(self) -> float:
        """Its design price, else its estimate (10_kernels' design_price_us)."""
        return self.estimate_us if self.price_us is None else self.price_us

    @property
    def tiled(self) -> bool:
        """Whether it is rendered on the reordered tiles (the baked kernel of the searched tile)."""
        return self.nm is None


def served_options(matrix, tiles, m: int, k: int, n: int, n1: int, design: KernelDesign, device,
                   untiled: bool = True, designs: tuple[str, ...] = (), conv: bool = False) -> list[Served]:
    """Every way to serve a layer, each with its estimate on `device` (calibrated where a calibration
    is stored): the kernel of the chosen tile (`tiles`, `n1`) in `design` first (the run's: the
    search measured its proxies), then in each of `designs` (fp32 labels, taken in the run's number
    format and, for a convolution served by implicit-im2col kernels (`conv`), in their conv form where
    they have one, else as the GEMM on its im2col B) that can serve it (design_problem), then, with
    `untiled`, the kernels that need no tiles and can serve this A in this number format
    (untiled_options; a convolution's in their conv form). A label names its design unless it is the
    default one in its number format (a tile alone: the baseline), whatever the run's design: a
    `--design chained` run's convolution served by the baseline conv kernel is not taken for chained.
    An option's form is its design's (stages.emit.served_form); every tiled design has a conv form,
    and an untiled im2col GEMM's estimate adds the unfolding of X (untiled_options)."""
    if conv:  # an implicit-im2col conv kernel is served in its design's conv form (KernelDesign.conv_kernel)
        design = design.conv_kernel or design
    estimate = estimate_timer(device)
    options = []
    for d in tiled_designs(design, designs, conv):
        implicit = conv and d.serves_conv  # else an im2col GEMM
        if d != design and design_problem(d, tiles.m1, n1, n, device, implicit):
            continue
        if any(o.design == d for o in options):
            continue
        registers = predicted_registers(tiles.m1, design=d, conv=implicit)
        timing = estimate.time(LaunchUnderTest(tiles, m, k, n, n1, registers, design=d, matrix=matrix, conv=implicit))
        # the design price was fitted on GEMM kernels: a conv form's designs compare by the estimate alone
        options.append(Served(f"{tiles.m1}×{n1}" + ("" if d == design_in(d.number) else f" {d.label}"), float(timing.time_us), d,
                              None, tiles.m1, n1, None if implicit else estimate.design_price(timing, d)))
    return options + (untiled_options(matrix, n, device, design, conv) if untiled else [])


def tiled_designs(design: KernelDesign, designs: tuple[str, ...], conv: bool = False) -> list[KernelDesign]:
    """`design` and each of `designs` in its number format (those with a form in it) and, for an
    implicit-im2col convolution, their conv form (KernelDesign.conv_kernel; a half one's pair is two
    output pixels), each once, `design` first."""
    out = [design]
    for label in designs:
        try:
            d = design_in(design.number, design_named(label))
        except ValueError:  # no form in this number format (a half kernel's grid is the baseline's so far)
            continue
        out.append((d.conv_kernel or d) if conv else d)
    return list(dict.fromkeys(out))


def design_problem(design: KernelDesign, m1: int, n1: int, n: int, device, conv: bool = False) -> str:
    """Why the kernel of tile (m1, n1) in `design` (`conv`: a convolution's implicit-im2col kernel)
    cannot serve N columns ("" when it can): its predicted registers above the device's limit per
    thread or per block, a grid past its limits."""
    problem = design.block_problem(m1, n1)  # a sliced block's threads and shared memory, before its registers
    if problem:
        return problem
    registers = predicted_registers(m1, design=design, conv=conv)
    if registers > device.max_regs_per_thread:
        return f"{registers} registers predicted, over {device.max_regs_per_thread}"
    if not block_fits_registers(registers, design.block_threads(n1), device):
        # the launch fails (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: 5 kernels of the H200's A/B, v=2 and v=4
        # on tiles sized for the baseline's registers; one of the H100's resnet50 headline, 86 × 736)
        return (f"{registers} registers predicted × {design.block_threads(n1)} threads: the launch checks "
                f"{launch_block_registers(registers, design.block_threads(n1), device)} a block, over "
                f"{device.max_regs_per_block}")
    try:
        LaunchLayout(1, n1, design.columns_per_thread, design.column_walks, design.order).grid(n)
    except ValueError as e:
        return str(e)
    return ""


def untiled_options(matrix, n: int, device, design: KernelDesign, conv: bool = False) -> list[Served]:
    """The N:M kernel in each blocking that fits, in `design`'s number format (fp32, or a half format
    whose sums are packed or fp32: no promotion), when A holds an N:M pattern (nm.held_pattern); in a
    half format, also the N:M kernel on sparse tensor cores (fp32 sums, `mma`: at least as accurate as
    either) where the pattern keeps at most 2 of every 4 columns and `device` has sparse mma. `conv`:
    for a convolution's implicit-im2col kernel (the nm design's conv form: KernelDesign.conv_kernel, in
    fp32 or half on CUDA cores; the sparse tensor cores' kernel stays the GEMM on the im2col B, its
    estimate with the unfolding: EstimateTimer.unfold_us)."""
    try:
        nm_design = design_in(design.number, NM_DESIGN)
    except ValueError:  # a promoted half sum: no N:M kernel of it
        return []
    if conv:
        nm_design = nm_design.conv_kernel
        if nm_design is None:
            return []
    pattern = held_pattern(matrix)
    if pattern is None:
        return []
    designs = [nm_design]
    if nm_design.half and nm_design.accumulate != "mma" and device.tensor_fma_per_sm_cycle:
        designs.append(replace(nm_design, accumulate="mma"))
    # the sparse tensor cores' kernel is a GEMM's: a convolution's is the GEMM on its im2col B, unfolded first
    estimate = estimate_timer(device)
    return [s for d in designs
            for s in nm_options(pattern, *matrix.shape, n, device, d, conv and d.serves_conv,
                                estimate.unfold_us(matrix.shape[1], n, d.element_bytes) if conv and not d.serves_conv
                                else 0.0)]


def nm_options(pattern: tuple[int, int, int], m: int, k: int, n: int, device,
               design: KernelDesign = NM_DESIGN, conv: bool = False, unfold_us: float = 0.0) -> list[Served]:
    """The N:M kernel of pattern (N, M, V) on an m × k A over N columns in each blocking that fits
    (nm.nm_tilings), in the nm `design` (its number format), each with its estimate on `device`;
    `conv`: the implicit-im2col kernel's (its copies gather the pixels' inputs); `unfold_us` added to
    each (an im2col GEMM's unfolding, where a convolution's other options read X themselves)."""
    estimate = estimate_timer(device)
    number = design.number
    return [Served(f"nm {t.label}", float(nm_timing(NMWork(t, m, k, n, nm_registers(t, number), number, conv),
                                                    estimate.device, estimate.params).time_us) + unfold_us, design, t)
            for t in nm_tilings(*pattern, number=number)]


def untiled_served(matrix, n: int, device, design: KernelDesign, layer: str = "", conv: bool = False) -> Served:
    """The cheapest kernel of `design` (one that needs no tiles) for `matrix` over N columns (`conv`: a
    convolution's implicit-im2col kernel); ValueError naming the layer when `design` is tiled or
    cannot serve this A."""
    if design.tiled:
        raise ValueError(f"{layer}: design {design.label} is rendered on the search's tiles")
    if conv and design.conv_kernel is None:
        raise ValueError(f"{layer}: design {design.label} has no implicit-im2col form (its convolutions are im2col GEMMs)")
    # the kernels of this design only: a half nm design is not its form on tensor cores
    options = [o for o in untiled_options(matrix, n, device, design, conv) if o.design == design]
    if not options:
        raise ValueError(f"{layer}: its A holds no N:M pattern (prune it with --prune nm:N:M[:V], or bring N:M "
                         f"weights with --prune keep); the nm design serves N:M layers only")
    return min(options, key=lambda s: s.estimate_us)
