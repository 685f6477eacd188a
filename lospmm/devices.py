"""Built-in GPU descriptions used by the constrain, cluster, pad and time stages, and occupancy: registers
a block occupies, blocks resident per SM, and Eq. 5's active blocks of a kernel (constrain's register
limits, cluster's proxy block functions, pad's Eq. 6 shared memory and the estimate all read it here).

Facts come from NVIDIA's CUDA occupancy tables for each compute capability; the SM count is the
named product's. The arch is always explicit: nothing here asks a device.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    """One GPU's facts that the search depends on (per SM unless named otherwise)."""

    name: str
    arch: str  # e.g. "sm_90"
    sms: int
    regs_per_sm: int
    max_regs_per_block: int
    max_regs_per_thread: int
    smem_per_sm: int  # bytes
    max_smem_per_block: int  # bytes, opt-in maximum
    reserved_smem_per_block: int  # bytes the runtime keeps per block
    max_threads_per_sm: int
    max_threads_per_block: int
    max_blocks_per_sm: int
    warp_size: int = 32
    reg_alloc_unit: int = 256  # registers are allocated per warp in units of this many
    # an SM's register file is split among this many sub-partitions (one scheduler each); a warp's
    # registers all come from one, and the launch check assumes a block's warps rounded up to them
    sub_partitions: int = 4
    # Throughput facts for the `estimate` timer only (published boost clock and memory bandwidth;
    # L2 bandwidth and latency are approximate public microbenchmark figures).
    clock_ghz: float = 1.5
    fp32_lanes_per_sm: int = 64
    dram_gbps: float = 900.0
    l2_gbps: float = 2500.0
    l2_bytes: int = 6 * 2**20
    mem_latency_cycles: int = 400  # between an L2 hit and DRAM: B slices are shared by many blocks
    # dense fp16 multiply-adds an SM's tensor cores do a cycle through mma.sync (0: no sparse mma, before
    # sm_80): the A100's datasheet (312 TFLOPS); the H100's a prior (about 0.55 of its wgmma peak, as
    # published microbenchmarks of mma.sync on Hopper found) until the device program measures it
    tensor_fma_per_sm_cycle: int = 0


DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device("h100", "sm_90", 132, 65536, 65536, 255, 233472, 232448, 1024, 2048, 1024, 32,
               clock_ghz=1.98, fp32_lanes_per_sm=128, dram_gbps=3350, l2_gbps=7000, l2_bytes=50 * 2**20,
               tensor_fma_per_sm_cycle=1024),
        Device("h200", "sm_90", 132, 65536, 65536, 255, 233472, 232448, 1024, 2048, 1024, 32,
               clock_ghz=1.98, fp32_lanes_per_sm=128, dram_gbps=4800, l2_gbps=7000, l2_bytes=50 * 2**20,
               tensor_fma_per_sm_cycle=1024),
        Device("a100", "sm_80", 108, 65536, 65536, 255, 167936, 166912, 1024, 2048, 1024, 32,
               clock_ghz=1.41, fp32_lanes_per_sm=64, dram_gbps=1555, l2_gbps=4800, l2_bytes=40 * 2**20,
               tensor_fma_per_sm_cycle=1024),
        Device("v100", "sm_70", 80, 65536, 65536, 255, 98304, 98304, 0, 2048, 1024, 32,
               clock_ghz=1.53, fp32_lanes_per_sm=64, dram_gbps=900, l2_gbps=2200, l2_bytes=6 * 2**20),
        Device("2080ti", "sm_75", 68, 65536, 65536, 255, 65536, 65536, 0, 1024, 1024, 16,
               clock_ghz=1.545, fp32_lanes_per_sm=64, dram_gbps=616, l2_gbps=1600, l2_bytes=5632 * 1024),
    )
}


def device_named(name: str) -> Device:
    """The built-in description of `name` (case-insensitive); ValueError lists the known ones."""
    key = name.strip().lower().replace("rtx", "").replace("-", "").replace(" ", "")
    if key not in DEVICES:
        raise ValueError(f"unknown GPU {name!r}; built-in: {', '.join(sorted(DEVICES))}")
    return DEVICES[key]


# --- occupancy ---------------------------------------------------------------------------------


def warp_registers(regs_per_thread: int, device: Device) -> int:
    """Registers a warp is allocated: a thread's times the warp, rounded up to the allocation unit."""
    return -(-(max(regs_per_thread, 1) * device.warp_size) // device.reg_alloc_unit) * device.reg_alloc_unit


def block_registers(regs_per_thread: int, threads: int, device: Device) -> int:
    """Registers a block occupies: per-warp allocation rounded up to the allocation unit."""
    return -(-threads // device.warp_size) * warp_registers(regs_per_thread, device)


def launch_block_registers(regs_per_thread: int, threads: int, device: Device) -> int:
    """Registers the launch check assumes a block takes, which must not pass max_regs_per_block: its
    warps rounded up to the SM's sub-partitions (cuda_occupancy.h's "hardware check"). 86 registers ×
    736 threads occupy 64768 but are checked as 24 warps, 67584: on the H100 that launch failed with
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES."""
    warps = -(-threads // device.warp_size)
    return -(-warps // device.sub_partitions) * device.sub_partitions * warp_registers(regs_per_thread, device)


def block_fits_registers(regs_per_thread: int, threads: int, device: Device) -> bool:
    """Whether one block of `threads` at `regs_per_thread` can launch: the per-thread limit, the
    launch check (launch_block_registers) and the registers it occupies under the block limit."""
    return (regs_per_thread <= device.max_regs_per_thread
            and launch_block_registers(regs_per_thread, threads, device) <= device.max_regs_per_block
            and block_registers(regs_per_thread, threads, device) <= min(device.max_regs_per_block,
                                                                         device.regs_per_sm))


def resident_blocks(regs_per_thread: int, threads: int, smem_bytes: int, device: Device) -> int:
    """Blocks per SM that registers, threads, the block limit and shared memory allow (0: none fits).
    Registers as cuda_occupancy.h counts them: each sub-partition holds as many whole warps as its
    share of the register file allows, and a block that fails the launch check fits nowhere."""
    if not block_fits_registers(regs_per_thread, threads, device):
        return 0
    per_partition = device.regs_per_sm // device.sub_partitions // warp_registers(regs_per_thread, device)
    by_regs = per_partition * device.sub_partitions // -(-threads // device.warp_size)
    by_threads = device.max_threads_per_sm // threads
    per_block_smem = smem_bytes + device.reserved_smem_per_block
    by_smem = device.smem_per_sm // per_block_smem if per_block_smem else device.max_blocks_per_sm
    return max(0, min(by_regs, by_threads, by_smem, device.max_blocks_per_sm))


def active_blocks_per_sm(num_blocks: int, regs_per_thread: int, threads: int, device: Device) -> int:
    """Eq. 5, min(ceil(NUM_TB / SMs), regCapacity / regUsage), also bounded by the SM's block and
    thread limits (which Eq. 5 leaves implicit); at least 1."""
    return max(1, min(-(-num_blocks // device.sms), resident_blocks(regs_per_thread, threads, 0, device)))
