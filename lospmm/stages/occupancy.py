"""Occupancy, in one place: registers a block occupies, blocks resident per SM, and Eq. 5's active
blocks of a kernel. Constrain (register limits), cluster (how many proxy block functions), pad
(Eq. 6's shared memory) and the estimate timer all read it from here."""

from __future__ import annotations

from lospmm.stages.devices import Device


def block_registers(regs_per_thread: int, threads: int, device: Device) -> int:
    """Registers a block occupies: per-warp allocation rounded up to the allocation unit."""
    warps = -(-threads // device.warp_size)
    per_warp = -(-(max(regs_per_thread, 1) * device.warp_size) // device.reg_alloc_unit) * device.reg_alloc_unit
    return warps * per_warp


def resident_blocks(regs_per_thread: int, threads: int, smem_bytes: int, device: Device) -> int:
    """Blocks per SM that registers, threads, the block limit and shared memory allow (0: none fits)."""
    by_regs = device.regs_per_sm // block_registers(regs_per_thread, threads, device)
    by_threads = device.max_threads_per_sm // threads
    per_block_smem = smem_bytes + device.reserved_smem_per_block
    by_smem = device.smem_per_sm // per_block_smem if per_block_smem else device.max_blocks_per_sm
    return max(0, min(by_regs, by_threads, by_smem, device.max_blocks_per_sm))


def active_blocks_per_sm(num_blocks: int, regs_per_thread: int, threads: int, device: Device) -> int:
    """Eq. 5, min(ceil(NUM_TB / SMs), regCapacity / regUsage), also bounded by the SM's block and
    thread limits (which Eq. 5 leaves implicit); at least 1."""
    return max(1, min(-(-num_blocks // device.sms), resident_blocks(regs_per_thread, threads, 0, device)))
