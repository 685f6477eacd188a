"""Stage 7, pad: a kept (M1, N1) candidate -> the proxy's launch: grid, block, and the dynamic
shared memory that gives the proxy the full kernel's occupancy (§5.2, Eq. 5–6).

The proxy uses fewer registers than the full kernel, so alone it would fit more blocks per SM.
Eq. 5 gives the full kernel's active blocks per SM; Eq. 6 sizes each proxy block's shared memory
so that exactly that many fit: smem_per_sm / NUM_ATB − the runtime's per-block reservation. A staged
proxy declares the full kernel's shared memory itself, so it is launched with only the rest
(proxy_dynamic_shared).
"""

from __future__ import annotations

from dataclasses import dataclass

from lospmm.kernel.design import BASELINE, KernelDesign
from lospmm.kernel.layout import proxy_layout
from lospmm.devices import Device
from lospmm.devices import active_blocks_per_sm


@dataclass(frozen=True)
class ProxyLaunch:
    """How to launch an M1 proxy so it stands for the (M1, N1) kernel."""

    m1: int
    n1: int
    grid_x: int  # A_tiles (a staged design's: its blocks of tiles_per_block tiles)
    grid_y: int  # ceil(N / N1)
    block: int  # N1 threads (a staged design's: N1 for each of its tiles)
    num_atb: int  # active blocks per SM of the full kernel (Eq. 5)
    smem_bytes: int  # dynamic shared memory per proxy block (Eq. 6)


def proxy_launch(num_tiles: int, n: int, m1: int, n1: int, regs_per_thread: int, device: Device,
                 design: KernelDesign = BASELINE) -> ProxyLaunch:
    """Grid, block and Eq. 6 shared memory for the proxy of candidate (M1, N1) on an N-column layer,
    in `design` (its columns per thread and walks set the blocks along N; grid_y counts them
    whichever grid axis holds them)."""
    if num_tiles < 1 or n < 1 or n1 < 1:
        raise ValueError(f"need tiles, N and N1 >= 1, got {num_tiles}, {n}, {n1}")
    layout = proxy_layout(num_tiles, design)
    grid_y = -(-layout.column_blocks(n, n1) // layout.column_walks)  # blocks along N, whichever axis holds them
    block = layout.block(n1)  # a staged block is N1 threads for each of its tiles
    atb = active_blocks_per_sm(layout.row_blocks * grid_y, regs_per_thread, block, device)
    smem = device.smem_per_sm // atb - device.reserved_smem_per_block
    smem = max(0, min(smem, device.max_smem_per_block))
    return ProxyLaunch(m1, n1, layout.row_blocks, grid_y, block, atb, smem)


def proxy_dynamic_shared(smem_bytes: int, clusters, design: KernelDesign = BASELINE, n1: int = 0) -> int:
    """The dynamic shared memory a proxy of `design` launches with at N1 = `n1` for Eq. 6's `smem_bytes` a
    block: what its own (ProxyClusters.shared_bytes: a staged proxy's union, as the full kernel's) leaves
    to add; a sliced proxy's partial sums are dynamic, so at least theirs (the full kernel's most,
    KernelDesign.slice_shared_bytes). Where the full kernel's shared memory bounds its occupancy, the
    proxy's own bounds it the same way."""
    if design.k_slices > 1:
        return max(smem_bytes, design.slice_shared_bytes(clusters.m1, n1))
    return max(0, smem_bytes - clusters.shared_bytes)
