"""Registers per thread of Alg. 2's thread tile, predicted before compiling: what constrain's
register test, the compile's --maxrregcount and the reorder's pricing of orders all use. The
counts are calibrated against ptxas (stages/constrain.py's docstring says how)."""

from __future__ import annotations

from dataclasses import dataclass

from lospmm.kernel.design import BASELINE, KernelDesign


@dataclass(frozen=True)
class RegisterModel:
    """Defaults: prefetch_regs=2, overhead_regs=14, extra_regs_per_row=0.5, min_regs=32,
    vector_regs_per_column=8, loop_regs=12 (the smallest caps without a spill over M1 = 1..16 of a
    96×512 layer at 0.7, ptxas -O1, and BERT's query layer at M1 = 12, which spilled 24 B with a
    loop at 8), staged_regs=8 (the staged kernel on that layer at M1 = 12, 8 tiles a block: 2.7 KB
    spilled at the baked kernel's cap, none 8 above it), window_regs=8 (a streamed convolution at one walk
    keeps its pixel's window, input and output pointers and two masks, across its loop over columns
    beside the sums: 3×3 and 7×7 windows at M1 12-28 spilled 16-32 B at the GEMM's cap, none 6 above
    it; a looped one's loop_regs cover it), split_regs_per_row=2 (a K split: ptxas keeps each row's
    64-bit offset in C live across the sections that store and resume it; NVRTC sm_90 on a 64×4096
    layer at 0.9, walks 4-16, M1 2-16: no spill at 2·M1 + 2 above the prediction, spills below
    about 2·M1), lane_regs=12 (a baked conv kernel of V > 1 columns per thread keeps each lane's
    window, input and output pointers, masks and whether it is a pixel, and ptxas keeps the lanes'
    independent loads in flight: NVRTC sm_90 at ptxas -O2 on a 64-channel 3×3 layer at 0.9, M1 1-16,
    V 2 and 4, walks 1 and 4, spilled at most 16 B at 8 a lane above the GEMM's prediction, none at 12
    but one tile of V = 2, M1 = 4; a sliced conv kernel keeps its lanes' windows at V = 1 too: a 16-channel
    3×3 layer at 0.8, M1 4-24, 2-8 slices, padded, spilled up to 96 B at the mask's 2, none at 8),
    mask_regs=2 (a baked conv kernel of one pixel a thread keeps its
    window's mask of entries beside the sums: NVRTC sm_90, ptxas -O1, 3×3 and 7×7 layers at 0.8, M1
    1-12, spilled 16 B at the floor of 32 at M1 = 4, none 2 above), slice_regs=4 (a sliced tile of one
    column a thread keeps its slice, its shared address and whether it is inside N beside the sums:
    NVRTC sm_90, ptxas -O1, a 256×1024 layer at 0.9, N1 = 32 and 64, M1 4-24, 2-8 slices, chained loads:
    16-56 B spilled at the baked prediction, none 4 above; at V = 2 and 4 none at the prediction, kernel
    and proxy). ConstrainParams carries the same fields, these defaults, as run options (lane_regs,
    mask_regs, slice_regs: the model's own)."""

    prefetch_regs: int = 2
    overhead_regs: int = 14
    extra_regs_per_row: float = 0.5
    min_regs: int = 32
    vector_regs_per_column: int = 8
    loop_regs: int = 12
    staged_regs: int = 8
    window_regs: int = 8
    split_regs_per_row: int = 2
    lane_regs: int = 12
    mask_regs: int = 2
    slice_regs: int = 4


def predicted_registers(m1: int, params=RegisterModel(), design: KernelDesign = BASELINE, conv: bool = False) -> int:
    """Registers per thread for a kernel of `design` (`params`: a RegisterModel, or any object with
    its fields, such as ConstrainParams): with V columns per thread its accumulators and B values
    are V wide, and ptxas keeps more vector loads in flight (`vector_regs_per_column` per column); a
    looped design carries the walk's column and stride and B and C (`loop_regs`). A half design's
    sums are one register per row when packed, two when in fp32, three when promoted. The N:M kernel
    is not capped (255): its launch bounds leave ptxas the registers of its thread tile. `conv`: the
    kernel is an implicit-im2col convolution's (a streamed one at one walk keeps its pixel's window:
    `window_regs`). A K split (design section_fmas) keeps each row's offset in C across its sections
    (`split_regs_per_row`, and two more; counted whether or not a tile reaches the limit: the cap is
    the kernel's, for all its tiles)."""
    v = design.columns_per_thread
    if design.a_values == "nm":  # its thread tile is its blocking's (kernel.nm), bounded by __launch_bounds__
        return 255
    if design.half:
        # a packed sum holds a row's two columns in one register; an fp32 sum two floats (and each B
        # pair is unpacked to two); a promoted sum both
        packed = design.accumulate == "packed"
        sums = m1 * (1 if packed else 2) + (2 * m1 if design.promote_every else 0)
        regs = (sums + int(params.extra_regs_per_row * sums) + params.prefetch_regs * (1 if packed else 2)
                + params.overhead_regs)
    elif v == 1:
        regs = m1 + int(params.extra_regs_per_row * m1) + params.prefetch_regs + params.overhead_regs
    else:
        regs = m1 * v + int(params.extra_regs_per_row * m1 * v) + params.vector_regs_per_column * v + params.overhead_regs
    regs += params.loop_regs if design.looped else 0
    # a staged kernel keeps its copy loop's and the shared chunk's addresses beside the sums, above the
    # floor too (at the floor of 32 a tile of 4 rows spilled 16 B)
    staged = params.staged_regs if design.loads == "staged" else 0
    window = params.window_regs if conv and design.a_values == "streamed" and not design.looped else 0
    if conv and design.conv_lane_windows:  # each lane's window and loads
        window = getattr(params, "lane_regs", RegisterModel.lane_regs) * design.conv_lanes
    elif conv and design.a_values == "baked" and design.loads != "staged":  # its pixel's window mask
        window = getattr(params, "mask_regs", RegisterModel.mask_regs)
    split = params.split_regs_per_row * m1 + 2 if design.section_fmas else 0
    # a sliced tile of one column a thread: its slice, shared address and test of N beside the sums
    sliced = getattr(params, "slice_regs", RegisterModel.slice_regs) if design.k_slices > 1 and v == 1 else 0
    return max(params.min_regs, regs) + staged + window + split + sliced
