"""Stage 7, pad: the proxy's launch reproduces the full kernel's occupancy through Eq. 6's shared memory."""

from __future__ import annotations

import pytest

from lospmm.devices import device_named
from lospmm.devices import active_blocks_per_sm, resident_blocks
from lospmm.stages.pad import proxy_launch

H100, V100 = device_named("h100"), device_named("v100")


@pytest.mark.parametrize("dev", [H100, V100])
@pytest.mark.parametrize("m1, n1, tiles, n", [(8, 128, 96, 4096), (32, 256, 24, 4096), (128, 512, 6, 512),
                                               (1, 32, 3072, 50176)])
def test_eq6_shared_memory_gives_the_full_kernels_occupancy(dev, m1, n1, tiles, n):
    regs = m1 + 16
    launch = proxy_launch(tiles, n, m1, n1, regs, dev)
    assert launch.grid_x == tiles and launch.grid_y == -(-n // n1) and launch.block == n1
    assert launch.num_atb == active_blocks_per_sm(tiles * launch.grid_y, regs, n1, dev)
    assert launch.smem_bytes <= dev.max_smem_per_block
    # with that much shared memory per block, exactly NUM_ATB proxy blocks fit (registers permitting)
    assert dev.smem_per_sm // (launch.smem_bytes + dev.reserved_smem_per_block) == launch.num_atb
    assert resident_blocks(16, n1, launch.smem_bytes, dev) == launch.num_atb


def test_a_launch_needs_tiles_columns_and_threads():
    for bad in ((0, 4096, 8, 128), (10, 0, 8, 128), (10, 4096, 8, 0)):
        with pytest.raises(ValueError):
            proxy_launch(*bad, 32, H100)
