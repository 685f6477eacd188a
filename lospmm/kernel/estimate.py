"""The `estimate` timer: an analytic model of one launch of a kernel (no GPU needed).

Its figures are ESTIMATES and every row that carries one says `timer = "estimate"` (or
"estimate:<calibration>" when a device's calibration is used). The `cuda` timer (measured, on a
GPU) lives in `lospmm.kernel.cuda`; both fill the same `Timing` (lospmm.kernel.timing).

The model, per launch of a full kernel or proxy with tile (M1, N1) in a kernel design
(kernel.design.KernelDesign: V columns per thread, W column walks per block, based or chained B
addresses) over N columns. Every parameter is a physical quantity; those a calibration fits have a
hardware bound (PHYSICAL_BOUNDS) it never leaves, the others are read from the SASS or the datasheet.
- Work per walk of A_tile t by one warp: loads_t B loads (its non-empty columns, or NNC_p for a
  proxy), fmas_t·V multiply-adds, M1 stores. Instructions: fmas_t·V + (1 + addr)·loads_t +
  store·M1 + block overhead + call (+ the loop per walk of a looped design); addr = 3 for based
  addresses (IMAD.WIDE and a 64-bit add), 1 for chained (one IMAD.WIDE), as read from the SASS.
- Occupancy: resident blocks per SM from registers (allocated per warp in 256s), threads, the
  block limit and shared memory (a proxy's Eq. 6 padding counts).
- Issue: all warps' instructions over the SMs' issue rate (4 warp-instructions per SM-cycle, the
  hardware's) and the FFMA rate (FP32 lanes / 32 per cycle), whichever binds; a streamed kernel's
  loads (each column's entry, B and M1 values) also through the load/store units, one a cycle an SM.
- A half design (fp16/bf16: two columns per thread as one packed pair): one HFMA2 per nonzero
  (it issues at the FFMA rate and does both columns), or two FFMAs per nonzero and an unpack per
  load when it sums in fp32; B and C move 2 bytes an element.
- Instruction supply: straight-line code is fetched, not cached, except where a block walks its
  tile again and the tile's code fits the instruction cache (`icache_bytes`). Every block fetches
  its tile's code (16 bytes an instruction) once per walk otherwise; the SMs receive code at
  `fetch_bytes_per_sm_cycle` each. On the H100 this term, not arithmetic or bytes of data, followed
  the measured times of the baseline kernels (issue 20).
- Memory: DRAM bytes (B and C once, plus spills) over DRAM bandwidth, and L2 bytes (every block's
  B column reads, C stores, spills) over L2 bandwidth.
- Latency: each warp waits `mem_latency / 2 · (2 / (1 + prefetch))^prefetch_exponent` per load
  (`load_wait`: half the latency at the flow's depth 1; deeper prefetch saves less than 1/(1 + P) — the
  H200's same-tile pairs, fitted by benchmarks/prefetch_fit.py) (a streamed kernel's loop, which
  keeps no load ahead across its iterations, `mem_latency + data_latency` per column: its entry's
  and B's); resident warps overlap.
- A K split (design section_fmas): each tile's code in sections of at most that many multiply-adds,
  each walked before the next, so a walk refetches a section's code only where the section, not
  the tile, passes the instruction cache; each section after the first reads its rows' partial sums
  back and each before the last stores them (instructions, and C's bytes through L2).
- A sliced tile (design k_slices = W: a block is W groups of N1 threads, each walking a slice of the
  tile's columns): the same loads and multiply-adds, each group's own set-up and call, each reduced
  row's partial stored and loaded through shared memory and added (`slice_instructions`, every row
  counted as reduced: an upper bound); W times the warps a block, with its partial sums' shared
  memory, in the occupancy; a tile's serial walk is its slice's, about 1/W of it, then a barrier and
  the owner's sums.
- A convolution's implicit-im2col kernel is priced as the GEMM of its im2col shape in its design
  (the window test of its loads, or of a staged block's copies, is not counted).
- Time = launch floor + max(issue, instruction supply, memory, latency, longest single block).

The staged kernel (design loads="staged": blocks of G tiles over N1 = 32·W columns, each tile walked
by its own W warps, B copied per chunk of K into shared memory once for the block's tiles) has its own terms,
`staged_timing`: the copies and barriers as instructions, B's reads from shared memory as one
instruction and wavefront each, each block's union of columns (kernel.staging) through L2, and a
block's chunks one after another, each waiting for its copies and then its slowest warp.

The N:M kernel (design `nm`, lospmm.kernel.nm) has its own model, `nm_timing`: its code is one
small loop, so what binds is the busiest SM's work — its blocks' instructions at the issue rate,
their FFMAs at the FP32 rate, their shared-memory wavefronts (one per SM-cycle), all at the share of
that rate the loop reaches with the warps resident (`nm_issue_efficiency`, `nm_warps_to_fill`:
fitted to the H200's measured launches), and a memory latency per chunk its resident blocks do not
hide — or the bytes: B's staged rows read by every row block from L2, B, the compressed A and C once
from DRAM. Its sparse tensor-core form (lospmm.kernel.sparse_mma), `mma_timing`: the busiest SM's
mma.sp at its tensor cores' rate (Device.tensor_fma_per_sm_cycle, a sparse m16n8k32 doing 16·8·16
multiply-adds) or its instructions at the issue rate, at `mma_efficiency` of it; the same latency and
bytes terms.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from lospmm.devices import Device, resident_blocks
from lospmm.kernel.design import BASELINE, KernelDesign
from lospmm.kernel.sparse_mma import MMATiling
from lospmm.kernel.staging import chunk_count, design_work, staged_shared_bytes
from lospmm.kernel.timing import LaunchUnderTest, Timing
from lospmm.status import Status


@dataclass(frozen=True)
class EstimateParams:
    """Defaults: launch_us=3.0 (a launch's floor); addr_instr_per_load=3, chained_addr_instr_per_load=1,
    block_overhead_instr=24, call_instr=6 (a tile is a function: the call, its argument moves and
    the EXIT that ends it), store_instr=2, loop_instr_per_walk=6 — all read from the SASS by
    benchmarks/sass_efficiency.py; sass_bytes_per_instr=16 (sm_70 and later); issue_per_sm_cycle=4
    (four schedulers); fetch_bytes_per_sm_cycle=32.0 (an SM's share of L2 bandwidth: the datasheet
    guess a calibration replaces); icache_bytes=128 KiB (the cache repeated walks hit in; a prior
    until looped kernels are measured). A half design's (read from its SASS, sm_90, NVRTC 13):
    unpack_instr_per_load=2 (an fp32-accumulating kernel turns each B pair into two floats: two
    HADD2.F32, or a shift and a LOP3 for bf16), pack_instr=1 (its F2FP per row at the store),
    promote_instr=4 (a packed sum moved into fp32: two HADD2.F32 and two FADD). The N:M kernel's
    loop (fitted to the H200's nm-spmm step, 24 launches, 2026-11-26: `python -m benchmarks.calibrate
    --nm`): nm_issue_efficiency=0.51 (the share of the issue bound its loop reaches: a shared-memory
    load's latency per slot and a barrier per chunk) and nm_warps_to_fill=1.77 (resident warps per
    scheduler it needs for that; one block of 4 warps an SM issues at 1/1.77 of it); a stage's copies
    (read from its SASS, sm_90, NVRTC 13, 2026-11-27: the chunk loop is straight code on the 16-byte
    path, `python -m benchmarks.sass_efficiency --nm`): nm_copy_instr=6 (a 16-byte copy, its share of
    the loop's set-up included: 69 instructions a chunk past the slots' at 16:32 for 11 copies),
    nm_listed_copy_instr=12 (a copy of a row a gathering stage's list names: the entry's load, its test
    and the row's address too; 139 past the slots' at 4:32:32 in stages of 128 for 8 such and 3 plain),
    nm_chunk_instr=40 (a stage's set-up, its commit and wait, two barriers and the loop: what is left of
    the SASS's count past slots and copies, 13-44 over eight tilings) and
    nm_gather_instr=12 (an implicit-im2col kernel's 4-byte gather: its window entry's load, one shift and
    test of the pixel's window mask, the address; 347 and 353 more instructions a chunk than the GEMM
    form's at 2:4 in 64×128 and 16×64 blocks, for 32 gathers in place of 8 copies; 21 before the mask)
    and nm_half_gather_instr=9 (a 16-bit one: a load and a store to shared memory, no cp.async; 266-278
    more a chunk than the fp16 GEMM form's at 8:32:8 and 2:4 in 16×64 and 64×128 blocks). The rate was fitted when a copy
    took 28-31 instructions (a loop of divisions and bounds) though priced at 6, so it absorbed that
    cost: until the nm-spmm step measures the straight copies, it prices the N:M kernel high. The staged
    kernel's (read from its SASS, sm_90, NVRTC 13, 8 tiles a block; not yet fitted to a measured
    launch): staged_copy_instr=10 (a column's copy: its offset from the table, B's address, the
    load, the st.shared, the loop's share: 38-41 instructions per 4 copies, ptxas unrolling the copy
    loop by staged_copy_unroll=4), staged_chunk_instr=24 (a chunk's loop set-up and remainder, two
    barriers and the tests that choose the warp's part); smem_latency_cycles=30 (an ld.shared's latency
    on sm_80/sm_90, the published microbenchmarks' figure: a prior). The streamed loop's:
    data_latency_cycles=33 (its column's entry, read from the data before the column's B load can
    start: an L1 hit, the published microbenchmarks' figure), lsu_per_sm_cycle=1.0 (an SM's 32
    load/store units take one warp's load instruction a cycle: its M1 value loads a column, each a
    broadcast of one address, go through them as its B loads do; the datasheet's). The sparse
    tensor-core kernel's: mma_efficiency=0.5 (the share of the tensor cores' or the issue rate, whichever
    binds, its loop reaches between two barriers a stage: a prior, not fitted until the device program's
    nm step measures it). prefetch_exponent=0.2 (load_wait: a load's wait at prefetch depth P is
    (2 / (1 + P))^0.2 of its wait at depth 1; fitted 2026-11-27 by `python -m benchmarks.prefetch_fit
    --gpu h100` on the H200's 16 same-tile pairs at depths 4 and 8, priced as the bundle priced them
    (the H100 calibration): mean squared log error of the depth-P / depth-1 ratio 0.0084, 0.011 with each
    layer left out, where the old exponent 1, 1/(1 + P), had 0.28; 0.15 with the H200's own datasheet
    model)."""

    launch_us: float = 3.0
    addr_instr_per_load: int = 3
    chained_addr_instr_per_load: int = 1
    block_overhead_instr: int = 24
    call_instr: int = 6
    store_instr: int = 2
    loop_instr_per_walk: int = 6
    sass_bytes_per_instr: int = 16
    issue_per_sm_cycle: int = 4
    fetch_bytes_per_sm_cycle: float = 32.0
    icache_bytes: int = 128 * 1024
    unpack_instr_per_load: int = 2
    pack_instr: int = 1
    promote_instr: int = 4
    nm_issue_efficiency: float = 0.51
    nm_warps_to_fill: float = 1.77
    nm_copy_instr: int = 6
    nm_listed_copy_instr: int = 12
    nm_chunk_instr: int = 40
    nm_gather_instr: int = 12
    nm_half_gather_instr: int = 9
    mma_efficiency: float = 0.5
    staged_copy_instr: int = 10
    staged_chunk_instr: int = 24
    staged_copy_unroll: int = 4
    smem_latency_cycles: float = 30.0
    data_latency_cycles: float = 33.0
    lsu_per_sm_cycle: float = 1.0
    prefetch_exponent: float = 0.2


@dataclass(frozen=True)
class KernelWork:
    """What one launch does, per A_tile (block row): per-thread loads and multiply-adds (of one
    column: a design with V columns per thread does V times the multiply-adds per load)."""

    m: int
    k: int
    n: int
    m1: int
    n1: int
    tile_loads: np.ndarray
    tile_fmas: np.ndarray
    registers: int
    spill_bytes: int = 0  # per thread, stores + loads
    smem_bytes: int = 0  # dynamic, per block
    zero_blocks: int = 0  # full kernel: blocks that zero empty rows
    prefetch: int = 1
    design: KernelDesign = BASELINE
    # a staged design's columns of B each block of its tiles copies per chunk of K (blocks × chunks:
    # kernel.staging.staged_counts); None for the others
    staged_counts: np.ndarray | None = None
    # a staged design's loads and multiply-adds of each tile in each chunk (tiles × chunks:
    # kernel.staging.chunk_work); None where not known (the walk is then priced whole)
    chunk_loads: np.ndarray | None = None
    chunk_fmas: np.ndarray | None = None
    # an implicit-im2col conv kernel's: each B load its window input, at a literal offset from its pixel's
    # corner, whatever the design's loads say (a sliced conv form keeps `chained` in its name only)
    conv: bool = False

    @property
    def lane_loads(self) -> int:
        """B loads per column of a tile and thread: 1 (one load of the thread's V columns), or a conv
        kernel's lanes (KernelDesign.conv_lanes: each lane loads its own pixel's input, adjacent output
        pixels not being adjacent inputs)."""
        return self.design.conv_lanes if self.conv else 1

    @property
    def row_blocks(self) -> int:
        """Blocks along A: the tiles and the zeroing blocks."""
        return len(self.tile_loads) + self.zero_blocks


def full_kernel_work(tiles, m: int, k: int, n: int, n1: int, registers: int, spill_bytes: int = 0,
                     prefetch: int = 1, design: KernelDesign = BASELINE, matrix=None, conv: bool = False) -> KernelWork:
    """The full Alg. 2 kernel of `tiles` (a reorder.Tiles); a staged design's needs the A (`matrix`)
    its blocks' copies are the unions of (ValueError without it). `conv`: an implicit-im2col conv
    kernel's (priced as the GEMM of its im2col shape in its design, but a baked one of V lanes loads V
    times: KernelWork.lane_loads)."""
    zero = -(-len(tiles.empty_rows) // max(tiles.m1, 1)) if len(tiles.empty_rows) else 0
    staged, chunk_loads, chunk_fmas = None, None, None
    if design.loads == "staged":
        if matrix is None:
            raise ValueError(f"design {design.label}: its estimate needs the layer's A (its blocks copy the unions "
                             f"of their tiles' columns)")
        staged, chunk_loads, chunk_fmas = design_work(matrix, tiles, design)
    return KernelWork(m, k, n, tiles.m1, n1, np.asarray(tiles.tile_nnc, np.int64), np.asarray(tiles.tile_nnz, np.int64),
                      registers, spill_bytes, 0, zero, prefetch, design, staged, chunk_loads, chunk_fmas,
                      conv)


def address_instructions(work: KernelWork, params: "EstimateParams") -> float:
    """Instructions a B load's address takes beside the load: chained loads' (from the previous load's
    address), or based ones' (from the thread's column); a conv kernel's window loads are priced as the
    baked conv kernel's, whatever its design's loads."""
    chained = work.design.loads == "chained" and not work.conv
    return params.chained_addr_instr_per_load if chained else params.addr_instr_per_load


def proxy_work(clusters, m: int, k: int, n: int, n1: int, registers: int, smem_bytes: int, spill_bytes: int = 0,
               prefetch: int = 1, design: KernelDesign = BASELINE) -> KernelWork:
    """The M1 proxy (a cluster.ProxyClusters) launched for candidate (M1, N1); a staged proxy copies
    what the full kernel's blocks copy (ProxyClusters.staged_counts), and each tile's cluster walks its
    columns chunk by chunk."""
    loads = np.asarray(clusters.nnc_p, np.int64)[clusters.cluster_of]
    fmas = loads * np.asarray(clusters.cpl, np.int64)[clusters.cluster_of]
    staged, chunk_loads, chunk_fmas = None, None, None
    if design.loads == "staged":
        staged = np.asarray(clusters.staged_counts)
        chunks = chunk_count(k, design.staged_rows)
        per_cluster = np.array([np.bincount(np.asarray(c, np.int64) // design.staged_rows, minlength=chunks)[:chunks]
                                for c in clusters.columns], np.int64).reshape(-1, chunks)
        chunk_loads = per_cluster[clusters.cluster_of]
        chunk_fmas = chunk_loads * np.asarray(clusters.cpl, np.int64)[clusters.cluster_of][:, None]
    return KernelWork(m, k, n, clusters.m1, n1, loads, fmas, registers, spill_bytes, smem_bytes, 0, prefetch, design,
                      staged, chunk_loads, chunk_fmas)


def fma_instructions_per_nonzero(design: KernelDesign) -> float:
    """Multiply-add instructions a thread issues per nonzero: one per column (FFMA), except a packed
    half sum's one HFMA2 per pair of columns."""
    v = design.columns_per_thread
    return v / 2 if design.half and design.accumulate == "packed" else float(v)


def tile_sections(work: KernelWork) -> np.ndarray:
    """Sections of each tile's code under the design's K split (1 each without one), approximately:
    its nonzeros over section_fmas, rounded up (render.common.k_sections keeps a column whole, so a
    tile of columns large against the limit has more, and one column past it is one section)."""
    fmas = work.tile_fmas.astype(np.float64)
    if not work.design.section_fmas:
        return np.ones_like(fmas)
    return np.maximum(1.0, np.ceil(fmas / work.design.section_fmas))


def walk_instructions(work: KernelWork, params: EstimateParams = EstimateParams()) -> np.ndarray:
    """Instructions one warp executes per walk of each tile (the straight-line code it fetches; a
    streamed kernel's loop, see streamed_instructions); a K split's sections each resume and store
    their rows' sums and run their own loop."""
    d = work.design
    if d.a_values == "streamed":
        return streamed_instructions(work, params)
    addr = address_instructions(work, params)
    fmas = work.tile_fmas.astype(np.float64)
    per_load, per_row = 1 + addr, params.store_instr
    extra = 0.0
    if d.half and d.accumulate == "f32":
        per_load += params.unpack_instr_per_load
        per_row += params.pack_instr
    elif d.half and d.promote_every:  # every row's sum moved about nnz / promote_every times, packed at the end
        extra = params.promote_instr * fmas / d.promote_every
        per_row += params.pack_instr
    sections = tile_sections(work)
    instr = (fmas * fma_instructions_per_nonzero(d) + per_load * work.lane_loads * work.tile_loads.astype(np.float64) + extra
             + per_row * work.m1 + params.block_overhead_instr + params.call_instr
             + (params.loop_instr_per_walk * sections if d.looped else 0)
             + (sections - 1) * 2 * params.store_instr * work.m1)  # a section's partial store and resume
    return instr + work.spill_bytes / 4.0


def load_wait(latency_cycles: float, prefetch: int, params: EstimateParams = EstimateParams()) -> float:
    """Cycles a warp waits per B load with `prefetch` loads kept ahead: half the latency at depth 1
    (as the model always had it), (2 / (1 + P))^prefetch_exponent of that at depth P — the exponent 1
    is the old 1/(1 + P), which said depth 4 and 8 save 3× what the H200 measured on the same tiles."""
    return latency_cycles / 2 * (2 / (1 + prefetch)) ** params.prefetch_exponent


def slice_instructions(work: KernelWork, params: EstimateParams = EstimateParams()) -> np.ndarray:
    """Instructions a sliced tile's warps execute past the unsliced walk's (walk_instructions), per tile
    and warp of one group, summed over its W groups: each further group's set-up and call, each group's
    slice and shared address, and every row's partials (counted as reduced, an upper bound: a stored
    partial, its load and V adds for each group but the owner) and a barrier; 0 for other designs."""
    d = work.design
    if d.k_slices == 1:
        return np.zeros(len(work.tile_loads))
    w = d.k_slices
    per_tile = ((w - 1) * (params.block_overhead_instr + params.call_instr) + 4 * w
                + work.m1 * (w - 1) * (2 + d.columns_per_thread) + 2 * w)
    return np.full(len(work.tile_loads), float(per_tile))


# a streamed kernel's loop per non-empty column: the column's offset, its B load and address, each
# row's value from data, the FFMAs of every row (a zero where a row has none), the loop's own two
STREAMED_LOOP_INSTR = 2


def streamed_instructions(work: KernelWork, params: EstimateParams = EstimateParams()) -> np.ndarray:
    """Instructions one warp of a streamed kernel executes per walk of each tile: per non-empty column
    its offset and B load (with its address; a conv kernel's V lanes one each), M1 value loads and
    M1·V FFMAs (dense: the column's rows without a nonzero multiply a zero), the loop; then the stores."""
    d = work.design
    addr = address_instructions(work, params)
    per_column = 1 + work.lane_loads * (1 + addr) + work.m1 + work.m1 * d.columns_per_thread + STREAMED_LOOP_INSTR
    return (per_column * work.tile_loads.astype(np.float64) + params.store_instr * work.m1
            + params.block_overhead_instr + (params.loop_instr_per_walk if d.looped else 0) + work.spill_bytes / 4.0)


def code_instructions(work: KernelWork, params: EstimateParams = EstimateParams()) -> np.ndarray:
    """Instructions of each tile's code as fetched: its straight-line function, or for a streamed
    kernel the one loop all tiles share (unrolled by 4)."""
    if work.design.a_values == "streamed":
        loop = 4 * (2 + work.m1 + work.m1 * work.design.columns_per_thread) + params.block_overhead_instr
        return np.full(len(work.tile_loads), float(loop))
    return walk_instructions(work, params)


def estimated_timing(work: KernelWork, device: Device, params: EstimateParams = EstimateParams()) -> Timing:
    """The analytic estimate of one launch (see the module docstring); Status.ERROR if it cannot run."""
    if work.n < 1 or work.n1 < 1 or work.design.block_threads(work.n1) > device.max_threads_per_block:
        return Timing("estimate", float("inf"), Status.ERROR, f"cannot launch N={work.n} with N1={work.n1}")
    if work.registers > device.max_regs_per_thread:
        return Timing("estimate", float("inf"), Status.ERROR, f"{work.registers} registers > {device.max_regs_per_thread}")
    if work.design.loads == "staged":
        return staged_timing(work, device, params)
    d = work.design
    problem = d.block_problem(work.m1, work.n1)
    if problem:
        return Timing("estimate", float("inf"), Status.ERROR, problem)
    # a sliced block's W groups of N1 threads, its partial sums (a proxy's are in its dynamic smem_bytes)
    atb = resident_blocks(work.registers, d.block_threads(work.n1),
                          max(work.smem_bytes, d.slice_shared_bytes(work.m1, work.n1)), device)
    if atb < 1:
        return Timing("estimate", float("inf"), Status.ERROR, "no block fits on an SM")
    ws = device.warp_size
    v = d.columns_per_thread
    n = -(-work.n // v) * v  # launched over a multiple of V columns
    per_block = work.n1 * v
    column_blocks = -(-n // per_block)
    full_y, rem = divmod(n, per_block)
    # warps of all column blocks of one block row (the last column block may be partial)
    warps_per_row = full_y * -(-work.n1 // ws) + (-(-(rem // v) // ws) if rem else 0)
    loads = work.tile_loads.astype(np.float64)
    # FMA-pipe instructions (a streamed kernel multiplies every row of each non-empty column)
    fmas = (loads * work.m1 if d.a_values == "streamed" else work.tile_fmas.astype(np.float64)) \
        * fma_instructions_per_nonzero(d)
    instr = walk_instructions(work, params)
    sliced = slice_instructions(work, params)
    slices = d.k_slices
    zero_instr = params.store_instr * work.m1 + params.block_overhead_instr
    # a zeroing block's other groups only start and leave
    total_warp_instr = warps_per_row * (instr.sum() + sliced.sum() + work.zero_blocks * (
        zero_instr + (slices - 1) * params.block_overhead_instr))
    sm_cycles_issue = total_warp_instr / (device.sms * params.issue_per_sm_cycle)
    sm_cycles_ffma = warps_per_row * fmas.sum() / (device.sms * device.fp32_lanes_per_sm / ws)
    sm_cycles_lsu = 0.0
    if d.a_values == "streamed":  # a column's entry, B load and M1 value loads through the load/store units
        sm_cycles_lsu = warps_per_row * float((loads * (2 + work.m1)).sum()) / (device.sms * params.lsu_per_sm_cycle)
    clock_hz = device.clock_ghz * 1e9
    compute_s = max(sm_cycles_issue, sm_cycles_ffma, sm_cycles_lsu) / clock_hz

    # instruction supply: each block fetches its tile's code once per walk, except the walks after
    # its first where the code fits the instruction cache
    blocks_per_tile = -(-column_blocks // d.column_walks)
    walks_per_block = column_blocks / blocks_per_tile
    code = params.sass_bytes_per_instr * code_instructions(work, params)
    sections = tile_sections(work)
    # a K split's walks repeat one section's code: the section, not the tile, must fit the cache
    fetches = blocks_per_tile * np.where(code / sections > params.icache_bytes, walks_per_block, 1.0)
    if d.a_values == "streamed":  # one loop shared by every block: fetched once per SM, then cached
        fetches = np.full_like(code, device.sms / max(len(code), 1))
    # a zeroing block's few instructions stay cached over its walks
    fetched = float((code * fetches).sum()) + params.sass_bytes_per_instr * zero_instr * work.zero_blocks * blocks_per_tile
    fetch_s = fetched / (device.sms * params.fetch_bytes_per_sm_cycle * clock_hz)

    threads_per_row = n // v
    rows_written = work.m  # every row of C is written once (tiles or zero blocks)
    element = float(d.element_bytes)
    dram = element * (work.k * n + rows_written * n) + threads_per_row * work.spill_bytes * len(loads)
    l2 = (element * n * (loads.sum() + work.m1 * (len(loads) + work.zero_blocks))
          + threads_per_row * work.spill_bytes * len(loads)
          + element * n * 2 * work.m1 * float((sections - 1).sum()))  # a K split's partial sums
    if d.a_values == "streamed":  # each warp reads its tile's values and offsets (cached in L1 per block)
        l2 += 4.0 * float((loads * (work.m1 + 1)).sum()) * -(-n // (work.n1 * v))
    memory_s = max(dram / (device.dram_gbps * 1e9), l2 / (device.l2_gbps * 1e9))

    wait = load_wait(device.mem_latency_cycles, work.prefetch, params)
    if d.a_values == "streamed":
        # a column's B address waits on its entry's load and its FFMAs on B: ptxas issues the next
        # column's loads after them (its SASS, sm_90: no load kept ahead across the loop's iterations)
        wait = device.mem_latency_cycles + params.data_latency_cycles
    resident_warps = device.sms * atb * -(-work.n1 // ws) * slices
    latency_s = warps_per_row * loads.sum() * wait / resident_warps / clock_hz
    # a sliced tile's serial walk is one slice's, then the barrier and the owners' sums (a shared load's
    # latency, and each owner's share of the rows' loads and adds)
    if slices > 1:
        path = ((loads * wait + instr + sliced) / slices + 2 * params.smem_latency_cycles
                + work.m1 * (slices - 1) * (1 + d.columns_per_thread) / slices).max(initial=0)
    else:
        path = loads.max(initial=0) * wait + instr.max(initial=0)
    longest_s = path * walks_per_block / clock_hz
    body = max(compute_s, memory_s, latency_s, longest_s, fetch_s)
    return Timing("estimate", params.launch_us + body * 1e6, Status.OK, "", compute_s * 1e6, memory_s * 1e6,
                  latency_s * 1e6, atb, 0, fetch_s * 1e6)


def staged_timing(work: KernelWork, device: Device, params: EstimateParams = EstimateParams()) -> Timing:
    """The estimate of one launch of a staged kernel or proxy (design loads="staged": blocks of G warps
    over N1 = 32·W columns, the W warps of slot w of block g walking tile g·G + w). Per block and chunk of K
    its warps copy the union's columns of B (work.staged_counts) into shared memory, G at a time,
    and meet at two barriers; each warp then walks its tile as today's kernel does with each B load
    an ld.shared at a literal offset (one instruction, no address). The terms, as estimated_timing's:
    - issue: every warp's instructions (its walk, its share of the copies, the chunks' set-up) over
      the SMs' issue rate; the FFMAs over the FP32 rate; shared-memory wavefronts (one a warp's load
      or store of 32 floats) at one per SM-cycle;
    - memory: B's union columns once per block (each over its N1 columns) and C through L2; B and
      C once from DRAM;
    - latency: a block's chunks run one after another, each waiting for its copies (a load's latency
      per staged_copy_unroll copies a warp: ptxas unrolls the loop so far, and the copies' own
      instructions); between a chunk's barriers the block waits on that chunk's slowest warp (its
      loads, each an ld.shared's latency halved by the one load ahead ptxas keeps, and its
      instructions: work.chunk_loads and chunk_fmas), its stores and set-up once (where the work has
      no split by chunk, the slowest warp's whole walk: a bound from below); resident blocks
      overlap, and no launch is shorter than its longest block;
    - instruction supply: each warp fetches its tile's code once per block (as today's kernel)."""
    d, ws = work.design, device.warp_size
    counts = np.asarray(work.staged_counts if work.staged_counts is not None else np.zeros((0, 0)), np.float64)
    per_block = d.tiles_per_block
    tiles = len(work.tile_loads)
    if counts.shape[0] != d.blocks_along_a(tiles):
        return Timing("estimate", float("inf"), Status.ERROR,
                      f"design {d.label}: the copies of {d.blocks_along_a(tiles)} blocks are needed, got {counts.shape[0]}")
    threads = d.block_threads(work.n1)
    warps = -(-work.n1 // ws)  # a tile's warps: each walks its tile and its share of the copies over 32 columns
    shared = staged_shared_bytes(counts.astype(np.int64), work.n1) + work.smem_bytes
    atb = resident_blocks(work.registers, threads, shared, device)
    if atb < 1:
        return Timing("estimate", float("inf"), Status.ERROR, "no block fits on an SM")
    column_blocks = -(-work.n // work.n1)
    loads, fmas = work.tile_loads.astype(np.float64), work.tile_fmas.astype(np.float64)
    walk = (fmas + loads + params.store_instr * work.m1 + params.block_overhead_instr + params.call_instr
            + work.spill_bytes / 4.0)
    copies = np.ceil(counts / per_block)  # each warp's share of a chunk's copies
    chunk_instr = copies * params.staged_copy_instr + (counts > 0) * params.staged_chunk_instr
    zero_instr = params.store_instr * work.m1 + params.block_overhead_instr
    # every warp of a block copies and meets at the barriers, the last block's idle warps too
    total_warp_instr = column_blocks * warps * (walk.sum() + per_block * chunk_instr.sum() + work.zero_blocks * zero_instr)
    sm_cycles_issue = total_warp_instr / (device.sms * params.issue_per_sm_cycle)
    sm_cycles_ffma = column_blocks * warps * fmas.sum() / (device.sms * device.fp32_lanes_per_sm / ws)
    sm_cycles_smem = column_blocks * warps * (loads.sum() + counts.sum()) / device.sms
    clock_hz = device.clock_ghz * 1e9
    compute_s = max(sm_cycles_issue, sm_cycles_ffma, sm_cycles_smem) / clock_hz

    element = float(d.element_bytes)
    spills = work.n * work.spill_bytes * tiles  # every thread's spills, a thread a column of each tile
    dram = element * (work.k * work.n + work.m * work.n) + spills
    l2 = element * work.n * (counts.sum() + work.m1 * (tiles + work.zero_blocks)) + spills
    memory_s = max(dram / (device.dram_gbps * 1e9), l2 / (device.l2_gbps * 1e9))

    copy_wait = np.ceil(copies / params.staged_copy_unroll) * device.mem_latency_cycles + chunk_instr  # blocks × chunks
    block_of = np.arange(tiles) // per_block
    if (work.chunk_loads is not None and work.chunk_fmas is not None
            and work.chunk_loads.shape == work.chunk_fmas.shape == (tiles, counts.shape[1])):
        # between a chunk's barriers the block waits on that chunk's slowest warp
        chunk_loads, chunk_fmas = np.asarray(work.chunk_loads, np.float64), np.asarray(work.chunk_fmas, np.float64)
        chunk_path = chunk_loads * params.smem_latency_cycles / (1 + work.prefetch) + chunk_loads + chunk_fmas
        slowest_chunks = np.zeros(counts.shape)
        np.maximum.at(slowest_chunks, block_of, chunk_path)
        rest = walk - loads - fmas  # its stores, set-up and spills, once a walk
        slowest = np.zeros(counts.shape[0])
        np.maximum.at(slowest, block_of, rest)
        slowest += slowest_chunks.sum(axis=1)
    else:  # no split by chunk: the slowest warp's whole walk (a bound from below)
        walk_path = loads * params.smem_latency_cycles / (1 + work.prefetch) + walk  # per tile
        slowest = np.zeros(counts.shape[0])
        np.maximum.at(slowest, block_of, walk_path)
    block_path = copy_wait.sum(axis=1) + slowest
    latency_s = column_blocks * block_path.sum() / (device.sms * atb) / clock_hz
    longest_s = block_path.max(initial=0) / clock_hz
    fetched = params.sass_bytes_per_instr * column_blocks * (walk.sum() + work.zero_blocks * zero_instr)
    fetch_s = fetched / (device.sms * params.fetch_bytes_per_sm_cycle * clock_hz)
    body = max(compute_s, memory_s, latency_s, longest_s, fetch_s)
    return Timing("estimate", params.launch_us + body * 1e6, Status.OK, "", compute_s * 1e6, memory_s * 1e6,
                  max(latency_s, longest_s) * 1e6, atb, 0, fetch_s * 1e6)


@dataclass(frozen=True)
class NMWork:
    """One launch of the N:M kernel in `tiling` (kernel.nm.NMTiling) on an m × k A over n columns."""

    tiling: object
    m: int
    k: int
    n: int
    registers: int
    number: object = None  # kernel.numbers.NumberFormat of B, C and the sums (None: fp32)
    conv: bool = False  # the implicit-im2col kernel: each thread copies its pixel's inputs, an element a copy


def nm_registers(tiling, number=None) -> int:
    """Registers per thread of the N:M kernel before it is compiled: its accumulators, a row of A's
    values and B's vectors, addresses, and B's vectors for each group of rows that share no index
    (NVRTC on sm_90, 2026-11-27, 2:4, 16:32:8 and 4:32:32 over the five blockings: 124-128 for 8×8 in
    vectors, 150-151 element-wise, 89-93 and 93-95 for 8×4, 61-64 and 63 for 4×4; this gives 129 and
    157, 93 and 100, 73 and 76. fp16 with packed sums 78-90, 56-60 and 47-54; this gives 90, 72 and 60.
    Its implicit-im2col form took 64-147, within these). The element-wise copy loop is kept rolled
    (`#pragma unroll 1`), or the kernel held 152-180. The sparse tensor-core kernel's: mma_registers."""
    if isinstance(tiling, MMATiling):
        return mma_registers(tiling)
    rows, columns = tiling.thread_rows, tiling.thread_columns
    groups = rows // tiling.index_rows
    if number is not None and number.is_half and number.packed:  # a register holds a pair of sums
        return rows * columns // 2 + rows + columns // 2 + 46
    return rows * columns + rows + columns + 49 + (groups - 1) * columns * columns // 16


def mma_registers(tiling) -> int:
    """Registers per thread of the sparse tensor-core kernel: its warp tile's fp32 sums (4 an mma), a
    step's A fragments and metadata (5 an m-tile) and B fragments (4 an n-tile) for each step of a stage
    that ptxas unrolls, and addresses; at least the floor NVRTC showed for small tiles (sm_90, fp16 and
    bf16 alike: 208 for warps of 64×64, 134 for 32×64, 126 for 64×32, 100-116 for 32×32 and 16×32 at
    stages of 32 columns; 176, 167, 136 and 109 at 64)."""
    mtiles, ntiles = tiling.warp_rows // 16, tiling.warp_columns // 8
    need = 4 * mtiles * ntiles + (5 * mtiles + 4 * ntiles) * tiling.steps + 28
    return min(255, max(need, 104 + 24 * (tiling.steps - 1)))


def mma_timing(work: NMWork, device: Device, params: EstimateParams = EstimateParams()) -> Timing:
    """The estimate of one launch of the sparse tensor-core kernel (the module docstring's model)."""
    t = work.tiling
    if work.n < 1:
        return Timing("estimate", float("inf"), Status.ERROR, f"cannot launch N={work.n}")
    if device.tensor_fma_per_sm_cycle < 1:
        return Timing("estimate", float("inf"), Status.ERROR, f"{device.name} ({device.arch}) has no sparse mma")
    atb = resident_blocks(work.registers, t.threads, t.shared_bytes, device)
    if atb < 1:
        return Timing("estimate", float("inf"), Status.ERROR, "no block fits on an SM")
    chunks, row_blocks, column_blocks = t.chunks(work.k), t.row_blocks(work.m), -(-work.n // t.block_columns)
    blocks = row_blocks * column_blocks
    mtiles, ntiles = t.warp_rows // 16, t.warp_columns // 8
    mmas = t.warps * chunks * t.steps * mtiles * ntiles  # a block's
    # a warp's step: its A fragments and metadata (two reads an m-tile), an ldmatrix an n-tile, the mmas;
    # a stage: its copies (B's 16-byte rows, A's fragments and metadata: six instructions each), the loop
    # and its two barriers; the stores at the end (a pack, the test and the store a pair)
    step_instr = 2 * mtiles + ntiles + mtiles * ntiles
    copies = (t.depth * t.block_columns / 8 + sum(t.stage_words) / 4) / t.threads
    stage_instr = t.steps * step_instr + 6 * copies + 16
    block_instr = t.warps * (chunks * stage_instr + params.block_overhead_instr + 2 * mtiles * ntiles * 4)
    per_sm = -(-blocks // device.sms)
    tensor = per_sm * mmas * (16 * 8 * 16) / device.tensor_fma_per_sm_cycle
    issue = per_sm * block_instr / params.issue_per_sm_cycle
    clock_hz = device.clock_ghz * 1e9
    compute_s = max(tensor, issue) / clock_hz / params.mma_efficiency
    latency_s = -(-per_sm // atb) * chunks * device.mem_latency_cycles / 2 / clock_hz
    sizes = t.operand_sizes(work.m, work.k)
    compressed = 4 * sizes["values"] + sizes["index"]
    dram = 2.0 * (work.k * work.n + work.m * work.n) + compressed
    l2 = 2.0 * (row_blocks * work.k * work.n + work.m * work.n) + column_blocks * compressed
    memory_s = max(dram / (device.dram_gbps * 1e9), l2 / (device.l2_gbps * 1e9))
    body = max(compute_s, latency_s, memory_s)
    return Timing("estimate", params.launch_us + body * 1e6, Status.OK, "", compute_s * 1e6, memory_s * 1e6,
                  latency_s * 1e6, atb, 0, 0.0)


@dataclass(frozen=True)
class NMSlot:
    """What one slot (a kept column of a chunk) of the N:M kernel in tiling `t` is made of, per thread:
    `groups` of rows with an index each, B's `element` bytes, its FMA-pipe instructions (`fmas`: an
    FFMA per output, or one packed fma per pair of outputs)."""

    groups: int
    half: bool
    packed: bool
    element: float
    fmas: float

    @classmethod
    def of(cls, t, number=None) -> "NMSlot":
        half = number is not None and number.is_half
        packed = half and number.packed
        return cls(t.thread_rows // t.index_rows, half, packed, 2.0 if half else 4.0,
                   t.thread_rows * t.thread_columns / (2 if packed else 1))


def nm_chunk_instructions(t, number=None, conv: bool = False, params: EstimateParams = EstimateParams()) -> float:
    """Instructions a warp of the N:M kernel in tiling `t` issues per chunk of K (a stage): its slots
    (A's values in vectors of 4, per group of rows its index, address and B vectors, the multiply-adds,
    a half kernel's unpacking), its share of the stage's copies (16-byte copies of B's rows, or a
    convolution's 4-byte gathers, and A's values and index), the barriers and the loop."""
    slot = NMSlot.of(t, number)
    groups, half, packed, element, fmas = slot.groups, slot.half, slot.packed, slot.element, slot.fmas
    unpack = groups * t.thread_columns if half and not packed else 0  # two conversions per pair of B
    slot_instr = t.thread_rows / 4 + groups * (3 + t.thread_columns / 4) + fmas + unpack
    b_copies = t.staged * t.block_columns * (1 if conv else element / 16) / t.threads
    copies = (t.kept * t.block_rows / 4 + t.slab / 16) / t.threads
    # a gathering stage's row costs its list entry's load and test besides
    listed = params.nm_listed_copy_instr - params.nm_copy_instr if t.gathers else 0
    if conv:
        b_copy_instr = (params.nm_half_gather_instr if half else params.nm_gather_instr) + listed
    else:
        b_copy_instr = params.nm_copy_instr + listed
    return t.kept * slot_instr + b_copy_instr * b_copies + params.nm_copy_instr * copies + params.nm_chunk_instr


def nm_timing(work: NMWork, device: Device, params: EstimateParams = EstimateParams()) -> Timing:
    """The estimate of one launch of the N:M kernel (the module docstring's model): on CUDA cores, or
    on sparse tensor cores for a sparse_mma tiling (mma_timing)."""
    if isinstance(work.tiling, MMATiling):
        return mma_timing(work, device, params)
    t, ws = work.tiling, device.warp_size
    if work.n < 1:
        return Timing("estimate", float("inf"), Status.ERROR, f"cannot launch N={work.n}")
    slot = NMSlot.of(t, work.number)
    groups, half, element, fmas = slot.groups, slot.half, slot.element, slot.fmas
    atb = resident_blocks(work.registers, t.threads, t.shared_bytes_of(int(element)), device)
    if atb < 1:
        return Timing("estimate", float("inf"), Status.ERROR, "no block fits on an SM")
    warps = -(-t.threads // ws)
    chunks, row_blocks, column_blocks = t.chunks(work.k), t.row_blocks(work.m), -(-work.n // t.block_columns)
    blocks = row_blocks * column_blocks
    chunk_instr = nm_chunk_instructions(t, work.number, work.conv, params)
    block_instr = warps * (chunks * chunk_instr + params.block_overhead_instr
                           + t.thread_rows * t.thread_columns / 4 * 4)  # the stores
    block_ffma = warps * chunks * t.kept * fmas
    # shared memory: a warp's B vectors are 512 bytes (4 wavefronts), its A values one; the copies' stores
    block_wavefronts = (warps * chunks * t.kept * (1 + groups * t.thread_columns / 4 * 4 * element / 4)
                        + chunks * (t.staged * t.block_columns * element + t.kept * t.block_rows * 4 + t.slab) / 128)
    per_sm = -(-blocks // device.sms)  # the busiest SM's blocks
    issue = per_sm * block_instr / params.issue_per_sm_cycle
    ffma = per_sm * block_ffma / (device.fp32_lanes_per_sm / ws)
    smem = per_sm * block_wavefronts
    # half a latency per chunk unhidden behind the double buffer of cp.async; a half convolution's copies
    # are loads and stores (cp.async copies 4 bytes at least): the whole latency, once per chunk
    unhidden = 1.0 if work.conv and half else 0.5
    latency = -(-per_sm // atb) * chunks * device.mem_latency_cycles * unhidden
    clock_hz = device.clock_ghz * 1e9
    # the loop reaches a share of that rate, and only with enough warps per scheduler resident
    per_scheduler = min(atb, per_sm) * warps / params.issue_per_sm_cycle
    rate = params.nm_issue_efficiency * min(1.0, per_scheduler / params.nm_warps_to_fill)
    compute_s = max(issue, ffma, smem) / clock_hz / rate
    latency_s = latency / clock_hz
    sizes = t.operand_sizes(work.m, work.k)
    compressed = 4 * sizes["values"] + sizes["index"] + sizes.get("rows", 0)
    dram = element * (work.k * work.n + work.m * work.n) + compressed
    # each row block reads B's staged rows: all of K, or the share its stages gather
    l2 = element * (row_blocks * work.k * t.staged / t.chunk * work.n + work.m * work.n) + column_blocks * compressed
    memory_s = max(dram / (device.dram_gbps * 1e9), l2 / (device.l2_gbps * 1e9))
    body = max(compute_s, latency_s, memory_s)
    return Timing("estimate", params.launch_us + body * 1e6, Status.OK, "", compute_s * 1e6, memory_s * 1e6,
                  latency_s * 1e6, atb, 0, 0.0)


# --- the timer ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EstimateTimer:
    """The analytic model above, on the built-in device table: no GPU needed, estimates only."""

    device: Device
    params: EstimateParams = field(default_factory=EstimateParams)
    name: str = "estimate"
    measures: bool = False
    runs_binary: bool = False
    pricing: "DesignPricing | None" = None  # the device's design price (DESIGN_PRICINGS), if fitted

    def design_price(self, timing: Timing, design: KernelDesign) -> float | None:
        """The price that compares `design` with a layer's other designs (DesignPricing.price), None
        where the device has no fitted pricing or the design no factor."""
        return self.pricing.price(timing, design, self.params.launch_us) if self.pricing else None

    def unfold_us(self, k: int, n: int, element_bytes: int) -> float:
        """What serving a convolution's im2col GEMM adds to its kernel, at least (lospmm.torch unfolds X,
        then makes the K × N B contiguous: two launches, B written, read and written again; X's own read
        and, at a batch above 1, the reorder of C into NCHW Y left out): for comparing it with the
        implicit-im2col kernels, which read X and write Y themselves."""
        return 2 * self.params.launch_us + 3.0 * k * n * element_bytes / (self.device.dram_gbps * 1e3)

    def time(self, launch: LaunchUnderTest) -> Timing:
        if launch.spec is not None and launch.spec.nm is not None:
            return nm_timing(NMWork(launch.spec.nm, launch.m, launch.k, launch.n, launch.registers,
                                    launch.spec.number, launch.spec.form == "conv"), self.device, self.params)
        if launch.clusters is not None:
            work = proxy_work(launch.clusters, launch.m, launch.k, launch.n, launch.n1, launch.registers,
                              launch.smem_bytes, launch.spill_bytes, design=launch.design)
        else:
            try:
                work = full_kernel_work(launch.tiles, launch.m, launch.k, launch.n, launch.n1, launch.registers,
                                        launch.spill_bytes, design=launch.design, matrix=launch.matrix,
                                        conv=launch.conv)
            except ValueError as e:
                return Timing(self.name, float("inf"), Status.ERROR, str(e))
        return estimated_timing(work, self.device, self.params)

    def dense(self, m: int, k: int, n: int, dtype: str = "fp32") -> Timing:
        # no dense baseline from a model: a speedup is only ever a ratio of two measurements
        return Timing(self.name, float("nan"), Status.SKIPPED, "the estimate timer has no dense baseline")

    def checked(self, spec, cubin: bytes, matrix, count: int) -> None:
        return None  # nothing runs: the emitted kernel is checked on the host instead


# --- calibration: the estimate's physical parameters fitted to measurements -----------------------

# Each fitted parameter with the range physics allows it on the H100-class devices of the table:
# (where it lives, lowest, highest). A fit never leaves them (the last calibration's issue rate of
# 5.9 per SM-cycle, above the hardware's 4, is what a curve fit without bounds gave).
PHYSICAL_BOUNDS: dict[str, tuple[str, float, float]] = {
    "launch_us": ("params", 2.0, 10.0),  # an empty kernel's launch and events, on these machines
    "fetch_bytes_per_sm_cycle": ("params", 0.25, 64.0),  # at most an SM's L2 read port, 64 B a cycle
    "mem_latency_cycles": ("device", 200.0, 1000.0),  # an L2 hit to a DRAM miss
    "dram_gbps": ("device", 500.0, 3350.0),  # at most the H100 SXM datasheet
    "l2_gbps": ("device", 2000.0, 12000.0),  # at most the published L2 read bandwidth microbenchmarks
}
CALIBRATED_PARAMS = tuple(k for k, (where, *_) in PHYSICAL_BOUNDS.items() if where == "params")
CALIBRATED_DEVICE = tuple(k for k, (where, *_) in PHYSICAL_BOUNDS.items() if where == "device")


def _with(device: Device, params: EstimateParams, x: np.ndarray) -> tuple[Device, EstimateParams]:
    values = dict(zip(PHYSICAL_BOUNDS, np.exp(x)))
    p = replace(params, **{k: float(values[k]) for k in CALIBRATED_PARAMS})
    d = replace(device, **{k: float(values[k]) for k in CALIBRATED_DEVICE})
    return d, p


def calibrated_estimate(works: list[KernelWork], measured_us, device: Device,
                        params: EstimateParams = EstimateParams(), starts: int = 8) -> tuple[Device, EstimateParams]:
    """The device's and the model's physical parameters (PHYSICAL_BOUNDS) that minimise the squared
    log error of the estimate against `measured_us`, each inside its bounds. The model is a max of
    terms, flat where another term binds, so the fit (scipy's least_squares over log-parameters,
    finite differences) starts from the given values (clipped into the bounds) and from
    `starts - 1` seeded points inside the bounds, and keeps the best."""
    from scipy.optimize import least_squares

    measured = np.asarray(measured_us, np.float64)
    keep = np.isfinite(measured) & (measured > 0)
    works = [w for w, k in zip(works, keep) if k]
    target = np.log(measured[keep])
    bounds = PHYSICAL_BOUNDS
    lo = np.log([low for _, low, _ in bounds.values()])
    hi = np.log([high for _, _, high in bounds.values()])
    start = np.log([float(getattr(params if where == "params" else device, k)) for k, (where, *_) in bounds.items()])
    x0 = np.clip(start, lo, hi)

    def residuals(x):
        d, p = _with(device, params, x)
        est = np.array([estimated_timing(w, d, p).time_us for w in works])
        return np.where(np.isfinite(est), np.log(np.maximum(est, 1e-9)), 20.0) - target

    rng = np.random.default_rng(0)
    best = None
    for i in range(max(starts, 1)):
        x = x0 if i == 0 else rng.uniform(lo, hi)
        fit = least_squares(residuals, x, bounds=(lo, hi), diff_step=1e-2, max_nfev=200)
        if best is None or fit.cost < best.cost:
            best = fit
    return _with(device, params, best.x)


# the N:M loop's two parameters (EstimateParams) and the range a fit keeps them in
NM_BOUNDS: dict[str, tuple[float, float]] = {"nm_issue_efficiency": (0.2, 1.0), "nm_warps_to_fill": (0.5, 8.0)}


def calibrated_nm(works: list["NMWork"], measured_us, device: Device,
                  params: EstimateParams = EstimateParams()) -> EstimateParams:
    """`params` with the N:M loop's parameters (NM_BOUNDS) that minimise the squared log error of
    nm_timing against `measured_us` (scipy's least_squares over log-parameters, from three starts)."""
    from scipy.optimize import least_squares

    measured = np.asarray(measured_us, np.float64)
    keep = np.isfinite(measured) & (measured > 0)
    works = [w for w, k in zip(works, keep) if k]
    target = np.log(measured[keep])
    lo, hi = (np.log([b[i] for b in NM_BOUNDS.values()]) for i in (0, 1))

    def with_x(x) -> EstimateParams:
        return replace(params, **dict(zip(NM_BOUNDS, map(float, np.exp(x)))))

    def residuals(x):
        p = with_x(x)
        return np.log([nm_timing(w, device, p).time_us for w in works]) - target

    fits = [least_squares(residuals, np.clip(np.log(start), lo, hi), bounds=(lo, hi), diff_step=1e-3)
            for start in ((0.6, 1.5), (0.8, 3.0), (0.3, 1.0))]
    return with_x(min(fits, key=lambda f: f.cost).x)


@dataclass(frozen=True)
class Calibration:
    """The estimate's physical parameters fitted to one GPU's measured launches (within
    PHYSICAL_BOUNDS), with where and how."""

    label: str  # in the timer's name ("estimate:<label>"), so every row it times says which model
    measured_on: str
    how: str
    params: tuple[tuple[str, float], ...]  # CALIBRATED_PARAMS
    device: tuple[tuple[str, float], ...]  # CALIBRATED_DEVICE


CALIBRATIONS: dict[str, Calibration] = {
    "h100": Calibration(
        "h100-2026-11-23",
        "NVIDIA H100 80GB HBM3, driver 580.159.04, 2026-11-22 (the baseline design's launches)",
        "the calibrate command of the plan before the device program (benchmarks/calibrate.py now), --split layer, on the committed launches of calls c, d (sample lists) and "
        "d, e, f, l (emitted kernels): fitted on 291 launches of 24 layers (half of the layers, by a hash of model "
        "and layer, at 0.7, 0.9 and 0.95), every parameter inside PHYSICAL_BOUNDS; on the other half held out, the "
        "median |log(estimate / measured)| is 0.07-0.21 per set and the estimate's pick among a layer's measured "
        "top-10 loses 10.4% (0.9) and 5.3% (0.7), against 21.1% and 43.1% before "
        "(benchmarks/results/gpu-h100/estimate/calibrate-layer-split.txt). icache_bytes is the prior: no looped "
        "kernel was measured yet",
        (("launch_us", 4.5677), ("fetch_bytes_per_sm_cycle", 1.7567)),
        (("mem_latency_cycles", 234.0458), ("dram_gbps", 2085.441), ("l2_gbps", 7975.0695)),
    ),
}


# --- the price that compares one layer's designs (issue 35, item 4) ---------------------------------


def overlapped_us(timing: Timing, launch_us: float, overlap: float) -> float:
    """A launch's time from its estimate's throughput terms (compute, memory, latency, fetch) combined
    by their `overlap`-norm — between their maximum (p = inf, the shipped estimate) and their sum
    (p = 1): issue, memory traffic and waiting overlap imperfectly — never under the estimate's own
    body (the longest block may bind). A timing without terms (an error, a model that fills none)
    keeps its time."""
    terms = np.array([timing.compute_us, timing.memory_us, timing.latency_us, timing.fetch_us], np.float64)
    body = timing.time_us - launch_us
    if not np.isfinite(timing.time_us) or not np.all(np.isfinite(terms)) or np.isinf(overlap):
        return float(timing.time_us)
    top = float(terms.max())
    norm = top * float(np.sum((terms / top) ** overlap) ** (1 / overlap)) if top > 0 else 0.0
    return launch_us + max(body, norm)


def design_factors(samples, launch_us: float, overlap: float) -> dict[str, float]:
    """Per design label, the geomean of measured over `overlapped_us` of its launches: `samples` is
    (design label, measured µs, the estimate's Timing) of one GPU's launches, finite measures only."""
    logs: dict[str, list[float]] = {}
    for label, measured, timing in samples:
        priced = overlapped_us(timing, launch_us, overlap)
        if np.isfinite(measured) and measured > 0 and np.isfinite(priced) and priced > 0:
            logs.setdefault(label, []).append(float(np.log(measured / priced)))
    return {label: float(np.exp(np.mean(v))) for label, v in logs.items()}


@dataclass(frozen=True)
class DesignPricing:
    """How the estimate compares the designs of one layer's kernel (issue 35, item 4): its
    throughput terms combined by their `overlap`-norm, times the design's factor fitted on one GPU's
    measured A/B launches (design_factors). The tiles of one design keep the shipped estimate's order
    (its maximum ranks a layer's tiles better than the norm: benchmarks.design_estimate), so the emit
    stage ranks a design's tiles by the estimate and the designs by this price (stages.emit.ranked_designs).
    A design without a factor (not measured) has no price: where one of a layer's designs has none,
    they all compare by the estimate."""

    label: str
    measured_on: str
    how: str
    overlap: float
    factors: tuple[tuple[str, float], ...]  # (design label, measured / overlapped_us)

    def price(self, timing: Timing, design: KernelDesign, launch_us: float) -> float | None:
        """The design's price, None where it has no factor (not measured: the caller compares by the
        estimate, never one design's price against another's estimate) or the timing is not ok."""
        factor = dict(self.factors).get(design.label)
        if factor is None or timing.status != Status.OK:
            return None
        return overlapped_us(timing, launch_us, self.overlap) * factor


DESIGN_PRICINGS: dict[str, DesignPricing] = {
    "h100": DesignPricing(
        "h100-2026-11-26",
        "NVIDIA H100 80GB HBM3, driver 580.159.04, 2026-11-26 (the device program's designs step: 105 launches, "
        "10 designs on the tiles of 11 A/B layers at 0.9)",
        "`python -m benchmarks.design_estimate` (overlap 1: the terms' sum): each design's geomean of measured over "
        "priced on the H100's A/B (calibration h100-2026-11-23's terms; refitted 2026-11-27 when occupancy "
        "learned the register file's sub-partitions). Held out: with each layer left out of the "
        "fit, the design priced lowest is within 5% of the best measured on 10 of 11 layers (the shipped estimate's "
        "maximum: 5 of 11), 1.02x chained alone (the ceiling on these layers: 1.055x); with these factors, on the "
        "H200's A/B (measured times the factors were not fitted on, priced with this calibration's terms): 10 of 11, "
        "1.03x (ceiling 1.067x). The overlap was chosen among 8, 4, "
        "3, 2, 1.5 and 1 on both cards' held-out results (1 was best on both); the tiles within a design keep the "
        "estimate's order: the sum ranks a layer's measured top-10 tiles worse (benchmarks/results/design_estimate.txt)",
        1.0,
        (("baked,based,tile-x,walks=1,v=1", 0.6158), ("baked,chained,column-x,walks=1,v=1", 0.6440),
         ("baked,chained,tile-x,walks=1,v=1", 0.6119), ("baked,chained,tile-x,walks=1,v=2", 0.7054),
         ("baked,chained,tile-x,walks=1,v=4", 0.7981), ("baked,chained,tile-x,walks=16,v=1", 0.7619),
         ("baked,chained,tile-x,walks=4,v=1", 0.7487), ("baked,chained,tile-x,walks=4,v=4", 0.9295),
         ("streamed,chained,tile-x,walks=1,v=1", 1.0480), ("streamed,chained,tile-x,walks=1,v=4", 1.0768)),
    ),
}


def estimate_timer(device: Device, calibrated: bool = True) -> EstimateTimer:
    """The `estimate` timer for `device`: with the device's calibration when it has one (see
    CALIBRATIONS; then named "estimate:<label>", and with its design pricing, DESIGN_PRICINGS), the
    datasheet model ("estimate") otherwise or when `calibrated` is False."""
    from dataclasses import replace

    calibration = CALIBRATIONS.get(device.name) if calibrated else None
    if calibration is None:
        return EstimateTimer(device)
    # a pricing's factors are measured over this calibration's terms: it goes with it, never alone
    return EstimateTimer(replace(device, **dict(calibration.device)), replace(EstimateParams(), **dict(calibration.params)),
                         name=f"estimate:{calibration.label}", pricing=DESIGN_PRICINGS.get(device.name))
