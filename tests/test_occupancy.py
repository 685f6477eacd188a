"""Occupancy, the one place the constrain, pad and time stages (and the estimate timer) read it from,
against a literal count of what fits on an SM."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from lospmm.devices import DEVICES, device_named
from lospmm.devices import (active_blocks_per_sm, block_fits_registers, block_registers, launch_block_registers,
                            resident_blocks)

H100 = device_named("h100")


def _fits(b: int, regs: int, threads: int, smem: int, d) -> bool:
    """Literally: do b blocks fit on one SM? Registers are allocated per warp in units of 256, each
    warp's from one of the SM's 4 register-file sub-partitions (warps dealt to them in turn), and the
    launch check counts a block's warps rounded up to a multiple of 4."""
    warps = -(-threads // d.warp_size)
    per_warp = -(-regs * d.warp_size // d.reg_alloc_unit) * d.reg_alloc_unit
    partitions = [0] * d.sub_partitions
    for warp in range(b * warps):
        partitions[warp % d.sub_partitions] += per_warp
    launch_check = -(-warps // d.sub_partitions) * d.sub_partitions * per_warp <= d.max_regs_per_block
    return (launch_check and max(partitions) <= d.regs_per_sm // d.sub_partitions
            and b * threads <= d.max_threads_per_sm
            and b <= d.max_blocks_per_sm and b * (smem + d.reserved_smem_per_block) <= d.smem_per_sm)


@settings(max_examples=200, deadline=None)
@given(regs=st.integers(1, 255), threads=st.sampled_from([32, 64, 96, 128, 160, 256, 512, 736, 1024]),
       smem=st.sampled_from([0, 1024, 12000, 48 * 1024, 100_000, 227 * 1024]), dev=st.sampled_from(sorted(DEVICES)))
def test_resident_blocks_is_the_most_that_fit(regs, threads, smem, dev):
    d = DEVICES[dev]
    n = resident_blocks(regs, threads, smem, d)
    assert n == 0 or _fits(n, regs, threads, smem, d)
    assert not _fits(n + 1, regs, threads, smem, d)


@settings(max_examples=100, deadline=None)
@given(blocks=st.integers(1, 10**6), regs=st.integers(16, 255), threads=st.sampled_from([32, 128, 256, 1024]),
       dev=st.sampled_from(sorted(DEVICES)))
def test_active_blocks_is_eq5(blocks, regs, threads, dev):
    d = DEVICES[dev]
    expected = min(-(-blocks // d.sms), max(b for b in range(0, 65) if b == 0 or _fits(b, regs, threads, 0, d)))
    assert active_blocks_per_sm(blocks, regs, threads, d) == max(1, expected)


def test_eq5_examples():
    # few blocks: ceil(NUM_TB / SMs) binds; many blocks: registers bind
    assert active_blocks_per_sm(132, 32, 128, H100) == 1
    assert active_blocks_per_sm(100000, 144, 256, H100) == 65536 // (8 * 144 * 32)


def test_the_launch_the_h100_refused_fits_nowhere():
    # headline resnet50 layer3.0.conv1 at 0.7, batch 32: 86 registers × 736 threads occupy 64768 of the
    # 65536, but the launch check counts 24 warps (67584): CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    assert block_registers(86, 736, H100) == 64768
    assert launch_block_registers(86, 736, H100) == 67584
    assert not block_fits_registers(86, 736, H100) and resident_blocks(86, 736, 0, H100) == 0
    assert block_fits_registers(80, 736, H100) and resident_blocks(80, 736, 0, H100) == 1
    # whole warps per sub-partition: 208 registers (6656 a warp) fit 2 warps in each quarter of the file,
    # 8 one-warp blocks an SM where the whole file's 65536 / 6656 would say 9
    assert resident_blocks(208, 32, 0, H100) == 8


def test_block_registers_round_per_warp_allocation():
    assert block_registers(33, 32, H100) == 40 * 32  # 33·32 = 1056 -> 1280 per warp
    assert block_registers(32, 64, H100) == 2 * 1024
