"""Stage 4, constrain: A_tiles per M1 and a device -> (M1, N1) candidates, each kept or removed
with its reason (§3.2–3.4, Eq. 1).

Candidates: every M1 the reorder stage tiled, × N1 ∈ {32, 64, …, 1024} (multiples of the warp
size up to the per-block thread limit). Constraints apply in the paper's order and a candidate
records the first one it fails:

- register: the predicted registers per thread exceed the per-thread limit, or the block fails
  the launch check (devices.block_fits_registers: its warps rounded up to the register file's 4
  sub-partitions, each warp's registers allocated in units of `reg_alloc_unit`, against the block
  limit; cuda_occupancy.h's count, under which a block of 23 warps at 86 registers does not launch
  on an H100 though its own registers fit);
- utilisation: block_num = num_A_tiles · ceil(N/N1) < SMs/2 (Eq. 1 with the relaxed bound);
- load_balance: COV_row (coefficient of variation of nnz across A_tiles) > TH_row, or
  WASTE_col (padded share of the ceil(N/N1)·N1 columns) > TH_col;
- empty: the layer has no nonzero, so there is no kernel to tile.

When no candidate of a layer with tiles passes (e.g. N = 4, below every N1 — each CNN's classifier
at batch 4), the least-bad are kept as a fallback so every GEMM layer gets a kernel: of the
candidates removed only by utilisation or load balance (register and empty ones cannot run), the
`fallback_keep` with the smallest total overshoot of the constraints (column waste over TH_col,
COV_row over TH_row, and the shortfall of blocks under SMs/2, each as a fraction), flagged
`fallback` and kept; `removed_by` still names the constraint each one fails.

Register prediction follows Alg. 2's thread: M1 accumulators, `prefetch_regs` registers holding
B values (the current column and the prefetched next one), `overhead_regs` for pointers, indices
and the column bound, plus `extra_regs_per_row` · M1 for the loads ptxas keeps in flight, and never
below `min_regs` (ptxas uses that many anyway: at 32 per thread a full SM still runs 2,048
threads). The last two are calibrated against ptxas (NVRTC 13.5, sm_90, K = 768, sparsity 0.9):
uncapped, it used 32 registers for M1 = 2, 4, 8, 40 for 16 and 64 for 32 — exactly this formula;
for M1 ≥ 64 it hoists loads to 255 registers and spills, so those predictions are floors. The
prediction is kept in the artifact and becomes the kernel's --maxrregcount (a cap far above
ptxas's own choice made it hoist loads and spill, e.g. 64 or 96 for an M1 = 2 kernel that needs 32).
Kernels compile at ptxas -O1 (see compile.CompileOptions), where this cap held without spills.
A kernel is linked from one function per tile (see codegen); the call costs no register of the
prediction: every tile function of 30 sampled layer × M1 cases (sparsity 0.5-0.9, M1 8-32) spilled
0 bytes at this cap (`benchmarks/sass_efficiency.py --calibrate`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from lospmm.kernel.design import BASELINE, KernelDesign
from lospmm.devices import Device
from lospmm.devices import block_fits_registers, block_registers
from lospmm.kernel.registers import RegisterModel, predicted_registers
from lospmm.stages.reorder import TileStats


UPSTREAM_ERROR = "error"  # the layer failed before constrain: one row, no candidates
REMOVED_BY = ("register", "utilisation", "load_balance", "empty", UPSTREAM_ERROR)


@dataclass(frozen=True)
class ConstrainParams:
    """Defaults: th_row=0.25, th_col=0.25 (the paper's §3.4 thresholds), min_blocks_per_sm=0.5
    (Eq. 1 relaxed to SMs/2), prefetch_regs=2, overhead_regs=14, extra_regs_per_row=0.5,
    min_regs=32, fallback_keep=10 (when no candidate passes, keep this many least-bad ones; 0: none),
    vector_regs_per_column=8, loop_regs=12 (the designs' registers: the smallest caps without a
    spill over M1 = 1..16 of a 96×512 layer at 0.7, ptxas -O1, and BERT's query layer at M1 = 12,
    which spilled 24 B with a loop at 8), staged_regs=8, window_regs=8, split_regs_per_row=2
    (kernel.registers.RegisterModel)."""

    th_row: float = 0.25
    th_col: float = 0.25
    min_blocks_per_sm: float = 0.5
    prefetch_regs: int = RegisterModel.prefetch_regs
    overhead_regs: int = RegisterModel.overhead_regs
    extra_regs_per_row: float = RegisterModel.extra_regs_per_row
    min_regs: int = RegisterModel.min_regs
    fallback_keep: int = 10
    vector_regs_per_column: int = RegisterModel.vector_regs_per_column
    loop_regs: int = RegisterModel.loop_regs
    staged_regs: int = RegisterModel.staged_regs
    window_regs: int = RegisterModel.window_regs
    split_regs_per_row: int = RegisterModel.split_regs_per_row


@dataclass(frozen=True)
class Candidate:
    """One tile size (M1, N1) of a kernel design with everything the constraints looked at."""

    m1: int
    n1: int
    num_a_tiles: int
    num_b_tiles: int
    block_num: int
    threads: int
    pred_regs: int
    block_regs: int
    cov_row: float
    waste_col: float
    nnc_sum: int
    nnz_max: int
    max_nnc: int
    removed_by: str | None
    fallback: bool = False  # kept although it fails `removed_by`: nothing passed every constraint
    design: str = BASELINE.label  # the kernel design it is a tile of (KernelDesign.label)

    @property
    def kept(self) -> bool:
        return self.removed_by is None or self.fallback


def n1_choices(device: Device) -> list[int]:
    """Multiples of the warp size up to the per-block thread limit."""
    return list(range(device.warp_size, device.max_threads_per_block + 1, device.warp_size))


def design_n1s(design: KernelDesign, device: Device) -> list[int]:
    """The N1 the search tries for a kernel of `design`: a staged design's own (KernelDesign.fixed_n1),
    else every multiple of the warp up to the block's thread limit (n1_choices)."""
    return [design.fixed_n1] if design.fixed_n1 else n1_choices(device)


def constrained_candidates(
    n: int,
    tiles_by_m1: Mapping[int, TileStats],
    device: Device,
    params: ConstrainParams = ConstrainParams(),
    design: KernelDesign = BASELINE,
    fallback: bool = True,
    conv: bool = False,
) -> list[Candidate]:
    """Every (M1, N1) for a layer with N output columns, in (M1, N1) order, with `removed_by`, for a
    kernel of `design`: a block of N1 threads covers N1·V columns (V columns per thread) and walks
    `column_walks` column blocks, so B tiles are N1·V wide and blocks fewer by the walks; a staged
    block is N1 = 32·tile_warps threads for each of its tiles_per_block tiles (KernelDesign.fixed_n1). With
    `fallback`, the least-bad are kept when none passes (with_fallback). `conv`: the kernel is a
    convolution's implicit-im2col kernel (its registers: kernel.registers.predicted_registers)."""
    if n < 1:
        raise ValueError(f"N must be >= 1, got {n}")
    out = []
    width = design.columns_per_thread
    for m1 in sorted(tiles_by_m1):
        stats = tiles_by_m1[m1]
        regs = predicted_registers(m1, params, design, conv)
        for n1 in design_n1s(design, device):
            num_b = -(-n // (n1 * width))
            blocks = design.blocks_along_a(stats.num_tiles) * -(-num_b // design.column_walks)
            threads = design.block_threads(n1)
            block_regs = block_registers(regs, threads, device)
            waste = (num_b * n1 * width - n) / (num_b * n1 * width)
            if stats.num_tiles == 0:
                reason = "empty"
            elif not block_fits_registers(regs, threads, device) or design.block_problem(m1, n1):
                reason = "register"  # a block past the SM's registers (a sliced one's: its threads or shared memory)
            elif blocks < device.sms * params.min_blocks_per_sm:
                reason = "utilisation"
            elif stats.cov_nnz > params.th_row or waste > params.th_col:
                reason = "load_balance"
            else:
                reason = None
            out.append(Candidate(m1, n1, stats.num_tiles, num_b, blocks, threads, regs, block_regs,
                                 stats.cov_nnz, waste, stats.nnc_sum, stats.max_nnz, stats.max_nnc, reason,
                                 design=design.label))
    if fallback and params.fallback_keep > 0 and not any(c.kept for c in out):
        out = with_fallback(out, device, params)
    return out


def overshoot(c: Candidate, device: Device, params: ConstrainParams = ConstrainParams()) -> float:
    """How far a candidate misses the utilisation and load-balance constraints, summed as fractions
    (0 for one that passes them)."""
    min_blocks = device.sms * params.min_blocks_per_sm
    return (max(0.0, c.waste_col - params.th_col) + max(0.0, c.cov_row - params.th_row)
            + max(0.0, 1.0 - c.block_num / min_blocks))


def with_fallback(candidates: list[Candidate], device: Device, params: ConstrainParams = ConstrainParams()
                  ) -> list[Candidate]:
    """`candidates` with the `fallback_keep` least-bad ones (removed only by utilisation or load
    balance) flagged `fallback`, so kept; unchanged if none is eligible."""
    eligible = [c for c in candidates if c.removed_by in ("utilisation", "load_balance")]
    # the designs' order breaks a tie: the run's own (the first searched) before the others
    order = {label: i for i, label in enumerate(dict.fromkeys(c.design for c in candidates))}
    picked = {(c.m1, c.n1, c.design) for c in sorted(eligible, key=lambda c: (overshoot(c, device, params), c.m1,
                                                                             c.n1, order[c.design]))
              [:params.fallback_keep]}
    return [replace(c, fallback=True) if (c.m1, c.n1, c.design) in picked else c for c in candidates]


def layer_candidates(n: int, tiles_by_m1: Mapping[int, TileStats], device: Device,
                     params: ConstrainParams = ConstrainParams(), empty: bool = False,
                     design: KernelDesign = BASELINE, designs: Sequence[KernelDesign] = (), conv: bool = False
                     ) -> list[Candidate]:
    """`constrained_candidates` for one layer in `design`, or in each of `designs` when given (the
    design as a search dimension: every (M1, N1, design), design by design in the order given, each
    with its own registers, column multiple and walks); the least-bad are kept as a fallback only
    when no candidate of any design passes. An all-zero layer (`empty`) has no tiles, so it stands
    as M1 = 1 with zero tiles and every N1 is removed as `empty`. `conv`: the layer is served by an
    implicit-im2col conv kernel (its designs are conv forms: searched_designs)."""
    if empty:
        tiles_by_m1 = {1: TileStats(0, 0, 0.0, 0, 0, 0.0)}
    out = [c for d in (list(dict.fromkeys(designs)) or [design])
           for c in constrained_candidates(n, tiles_by_m1, device, params, d, fallback=False, conv=conv)]
    if params.fallback_keep > 0 and not any(c.kept for c in out):
        out = with_fallback(out, device, params)
    return out


def searched_designs(designs: Sequence[KernelDesign], op: str, implicit_conv: bool = True) -> tuple[KernelDesign, ...]:
    """The designs a layer's search spans: `designs`, each once; a convolution served by an
    implicit-im2col kernel (`op` "conv" and `implicit_conv`) spans the conv kernel of each
    (KernelDesign.conv_kernel: a baked design's grid order, walks and columns per thread in its number
    format, a streamed one's order, walks and columns per thread, a sliced one's slices, a staged one's
    blocking, the N:M kernel's), the kernel it is
    served by; where no design has one (the N:M kernel on sparse tensor cores) it stays an im2col GEMM in
    the first design (stages.emit.kernel_form)."""
    unique = tuple(dict.fromkeys(designs))
    if op == "conv" and implicit_conv:
        return tuple(dict.fromkeys(d.conv_kernel for d in unique if d.conv_kernel is not None)) or unique[:1]
    return unique


def reduction_counts(candidates: list[Candidate]) -> dict[str, int]:
    """Candidates left after each constraint in order (the paper's Fig. 3 in numbers)."""
    left = len(candidates)
    counts = {"total": left}
    reasons = np.array([c.removed_by or "" for c in candidates])
    counts["fallback"] = sum(c.fallback for c in candidates)  # kept although they fail a constraint
    for step in ("empty", "register", "utilisation", "load_balance"):
        left -= int(np.sum(reasons == step))
        counts[f"after_{step}"] = left
    return counts
