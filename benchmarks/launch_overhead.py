"""Host cost of one eager call of an emitted kernel from Python (GPU only): the loader's SpMM and
SpConv on torch CUDA tensors, the bare LoadedKernel.launch, and torch's own dense call on the same
shapes, each in a loop of small launches whose GPU time is far below the host's. Prints µs per call
(median of 5 loops).

`--dispatch` (no GPU): what the registered operators add over the kernel call they make, on this
host: `torch.ops.lospmm.spmm` on a stand-in kernel that returns a ready tensor, against calling the
stand-in directly, and against an operator defined with torch.library.custom_op (what lospmm.torch
used before 2026-11-26) on the same stand-in.

    python -m benchmarks.launch_overhead [--calls 2000] [--out FILE.parquet]
    python -m benchmarks.launch_overhead --dispatch [--calls 20000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def per_call_us(fn, calls: int, warmup: int = 50, sync=None) -> float:
    """µs per call of `fn`, the median of 5 loops of `calls`, each ended by `sync` (default: the
    GPU's, so that the launches queued count)."""
    if sync is None:
        import torch

        sync = torch.cuda.synchronize
    for _ in range(warmup):
        fn()
    sync()
    loops = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        loops.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(loops)


def dispatch_rows(calls: int) -> list[tuple[str, float]]:
    """µs per call on this host (median of 5 loops): the stand-in kernel called directly, through
    torch.ops.lospmm.spmm, and through a custom_op wrapping the same call."""
    import torch

    import lospmm.torch as lt

    class StandIn:  # a loaded kernel's call, without a device: its output is ready
        spec = type("Spec", (), {"layer": "stand-in"})()

        def __init__(self):
            self.out = torch.empty(64, 64)

        def __call__(self, b):
            return self.out

    name = "stand-in|dispatch"
    lt._KERNELS[name] = kernel = StandIn()

    @torch.library.custom_op("lospmm_bench::spmm", mutates_args=(), schema="(Tensor b, str kernel_name) -> Tensor")
    def custom(b: torch.Tensor, kernel_name: str) -> torch.Tensor:
        return lt._KERNELS[kernel_name](b).clone()  # custom_op refuses an output it has seen before

    b = torch.randn(64, 64)
    clone = b.clone
    rows = [("the stand-in kernel, called directly", lambda: kernel(b)),
            ("torch.ops.lospmm.spmm (torch.library.Library)", lambda: torch.ops.lospmm.spmm(b, name)),
            ("lt.spmm (the overload the modules call)", lambda: lt.spmm(b, name)),
            ("a clone of the 64×64 output (custom_op's row pays it)", lambda: clone()),
            ("the same call as a torch.library.custom_op", lambda: custom(b, name))]
    with torch.no_grad():  # on the host: nothing to wait for at the end of a loop
        return [(label, per_call_us(fn, calls, warmup=500, sync=lambda: None)) for label, fn in rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--out", default=None, help="also write the table here (launch-overhead.parquet: call, us_per_call)")
    p.add_argument("--dispatch", action="store_true", help="no GPU: the registered operators' own cost on this host")
    args = p.parse_args()
    if args.dispatch:
        print(f"the registered operators' own cost on this host ({args.calls} calls a loop, median of 5)")
        for label, us in dispatch_rows(args.calls):
            print(f"{label:55s} {us:7.2f} µs per call", flush=True)
        return

    import torch

    import lospmm
    from lospmm.flows.kernels import emitted_kernel
    from lospmm.kernel.cuda import device_facts
    from lospmm.kernel.geometry import ConvGeometry
    from lospmm.loader import load_kernel
    from lospmm.stages.prune import random_pruned
    from lospmm.stages.reorder import reordered_tiles

    arch = device_facts()["arch"]
    tmp = Path(tempfile.mkdtemp(prefix="lospmm-launch-"))
    a = random_pruned(64, 64, 0.9, np.random.default_rng(0))
    emitted_kernel(str(tmp), a, reordered_tiles(a, 8), "gemm", 0.9, 64, arch, tmp / "gemm", verify=False)
    g = ConvGeometry(cin=16, h=8, w=8, kh=3, kw=3, stride=1, pad=1)
    c = random_pruned(16, g.k, 0.9, np.random.default_rng(1))
    emitted_kernel(str(tmp), c, reordered_tiles(c, 4), "conv", 0.9, 64, arch, tmp / "conv", verify=False,
                   conv=g)
    spmm, conv = load_kernel(tmp / "gemm"), load_kernel(tmp / "conv")
    b = torch.randn(64, 64, device="cuda")
    out = torch.empty(64, 64, device="cuda")
    x = torch.randn(1, 16, 8, 8, device="cuda")
    dense_a = torch.from_numpy(a.toarray()).float().cuda()
    weight = torch.from_numpy(c.toarray().reshape(16, 16, 3, 3)).float().cuda()
    stream = torch.cuda.current_stream().cuda_stream
    rows = [
        ("CudaKernel.launch (the bare launch)", lambda: spmm._kernel.launch(b.data_ptr(), out.data_ptr(), 64, stream)),
        ("SpMM(B) 64×64", lambda: spmm(b)),
        ("SpMM(B, out=C) 64×64", lambda: spmm(b, out=out)),
        ("torch.matmul 64×64 (cuBLAS)", lambda: torch.matmul(dense_a, b)),
        ("SpConv(X) 16×8×8, 3×3", lambda: conv(x)),
        ("F.conv2d 16×8×8, 3×3 (cuDNN)", lambda: torch.nn.functional.conv2d(x, weight, None, 1, 1)),
    ]
    try:  # the registered operators (lospmm.torch), as a served model calls them
        import lospmm.torch as lt

        gemm_name, conv_name = lt.kernel_name(spmm), lt.kernel_name(conv)
        xt = torch.randn(64, 64, device="cuda")
        rows += [("torch.ops.lospmm.spmm(B) 64×64", lambda: torch.ops.lospmm.spmm(b, gemm_name)),
                 ("F.linear 64×64 (cuBLAS)", lambda: torch.nn.functional.linear(xt, dense_a)),
                 ("torch.ops.lospmm.conv(X) 16×8×8, 3×3", lambda: torch.ops.lospmm.conv(x, conv_name))]
    except AttributeError:  # a lospmm from before the operators (PYTHONPATH=<older checkout>)
        pass
    print(f"lospmm from {Path(lospmm.__file__).parent}; {torch.cuda.get_device_name()}; {args.calls} calls a loop")
    table = []
    for name, fn in rows:
        us = per_call_us(fn, args.calls)
        table.append({"call": name, "us_per_call": us, "calls": args.calls, "device": torch.cuda.get_device_name()})
        print(f"{name:45s} {us:7.2f} µs per call", flush=True)
    if args.out:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(table), args.out)


if __name__ == "__main__":
    main()
