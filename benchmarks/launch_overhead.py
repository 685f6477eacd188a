"""Host cost of one eager call of an emitted kernel from Python (GPU only): the loader's SpMM and
SpConv on torch CUDA tensors, the bare LoadedKernel.launch, and torch's own dense call on the same
shapes, each in a loop of small launches whose GPU time is far below the host's. Prints µs per call
(median of 5 loops).

    python -m benchmarks.launch_overhead [--calls 2000] [--out FILE.parquet]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def per_call_us(fn, calls: int) -> float:
    import torch

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    loops = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        loops.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(loops)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--out", default=None, help="also write the table here (launch-overhead.parquet: call, us_per_call)")
    args = p.parse_args()

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
