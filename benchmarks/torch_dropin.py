"""A whole PyTorch model through lospmm and back (issue 13): what the importer finds, the search,
`lospmm.torch.sparsify`, the served model's output against the pruned dense model, and (on a GPU)
whole-model latency against the dense model on cuDNN/cuBLAS in FP32, run eagerly and replayed as a
CUDA graph (which leaves out Python's per-layer launch cost on both sides).

    python -m benchmarks.torch_dropin [--model resnet18|tiny] [--sparsity 0.9] [--batch 8] [--image 224]
                                      [--serve-batches 1 8 32] [--artifacts DIR] [--out FILE.json]

The model is a ResNet-18 (torchvision's when installed, else the same architecture defined here),
randomly initialised (no network here), magnitude-pruned by the search. Without a GPU the served
model runs on the host emulation (slow: use --model tiny). Prints a table; --out keeps the figures.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def resnet18():
    try:
        import torchvision

        return torchvision.models.resnet18(weights=None), "torchvision"
    except ImportError:
        pass
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU()
            self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                               if stride != 1 or cin != cout else None)

        def forward(self, x):
            y = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
            return self.relu(y + (self.downsample(x) if self.downsample is not None else x))

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1, self.relu = nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU()
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            widths, cin = (64, 128, 256, 512), 64
            for i, w in enumerate(widths):
                setattr(self, f"layer{i + 1}", nn.Sequential(Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)))
                cin = w
            self.avgpool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(512, 1000)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return ResNet18(), "defined here (torchvision's architecture)"


def tiny():
    from torch import nn

    return nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 64, 3, 1, 1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 100)), "defined here"


def importer_report(model, x) -> dict:
    import lospmm.torch as lt
    from lospmm.stages.extract import graph_shapes

    weights = lt.layer_weights(model, x)
    shapes = graph_shapes("m", weights, 1, 1)
    excluded = Counter(s.message.split(", ", 1)[1].split(" (")[0].split(":")[0] for s in shapes if not s.ok)
    return {"tensors": len(weights), "gemm_layers": sum(s.ok for s in shapes),
            "conv_layers": sum(s.ok and s.op == "conv" for s in shapes), "excluded": dict(excluded.most_common())}


def emitted_rows(artifacts: str, run_id: str) -> list[dict]:
    """The run's 10_kernels rows: each layer's form, tile, check, error and (cuda timer) times."""
    import pyarrow.parquet as pq

    from lospmm.flows.storage.runs import run_record

    emit = next(e for e in run_record(artifacts, run_id)["entries"] if e["stage"] == "emit")
    keep = ("layer", "m", "n", "k", "form", "m1", "n1", "status", "check", "max_rel_error", "full_time_us",
            "dense_time_us", "speedup_vs_dense", "compile_seconds")
    return [{k: r[k] for k in keep} for r in pq.read_table(Path(artifacts) / emit["path"]).to_pylist()]


def cuda_median_ms(fn, repeats: int = 50, warmup: int = 5) -> float:
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def graph_median_ms(model, x, repeats: int = 50) -> float:
    """The model's forward captured once as a CUDA graph and replayed: GPU time without Python's
    per-module launch cost (the emitted kernels launch on torch's current stream, so they are captured)."""
    import torch

    try:
        return _graph_median_ms(model, x, repeats)
    except Exception as e:  # a capture that fails is a missing figure, not a lost run
        print(f"CUDA graph of {type(model).__name__} failed: {type(e).__name__}: {e}", flush=True)
        try:
            torch.cuda.synchronize()
        except Exception:
            pass
        return float("nan")


def _graph_median_ms(model, x, repeats: int) -> float:
    import torch

    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            model(x)
    return cuda_median_ms(graph.replay, repeats)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("resnet18", "tiny"), default="resnet18")
    p.add_argument("--sparsity", type=float, default=0.9)
    p.add_argument("--batch", type=int, default=8, help="the batch the search sizes N for")
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--serve-batches", type=int, nargs="*", default=[1, 8, 32],
                   help="GPU: whole-model latency at these batches, on the kernels searched at --batch")
    p.add_argument("--artifacts", default="artifacts")
    p.add_argument("--jobs", type=int, default=0)
    p.add_argument("--out")
    args = p.parse_args()

    import torch

    import lospmm.torch as lt

    torch.manual_seed(0)
    model, origin = resnet18() if args.model == "resnet18" else tiny()
    model.eval()
    x = torch.randn(args.batch, 3, args.image, args.image, generator=torch.Generator().manual_seed(1))
    gpu = torch.cuda.is_available()
    result = {"model": args.model, "origin": origin, "sparsity": args.sparsity, "batch": args.batch,
              "image": args.image, "device": torch.cuda.get_device_name() if gpu else "cpu (host emulation)",
              "importer": importer_report(model, x)}
    print(json.dumps(result["importer"]), flush=True)

    t0 = time.perf_counter()
    run_id = lt.search(model, x, sparsity=args.sparsity, artifacts=args.artifacts, name=args.model, jobs=args.jobs)
    result["run_id"], result["search_s"] = run_id, round(time.perf_counter() - t0, 1)
    print(f"search: run {run_id} in {result['search_s']} s", flush=True)

    result["layers"] = emitted_rows(args.artifacts, run_id)
    checks = Counter(r["check"] for r in result["layers"])
    print(f"emitted: {dict(Counter(r['form'] for r in result['layers']))}, checks {dict(checks)}, largest error "
          f"{max(r['max_rel_error'] or 0 for r in result['layers']):.3g}", flush=True)

    backend = "cuda" if gpu else "host"
    fast = lt.sparsify(model, run_id, backend=backend, artifacts=args.artifacts)
    ref = lt.pruned(model, run_id, artifacts=args.artifacts)
    replaced = [r for r in fast.lospmm_replacements if r.module]
    forms = Counter(type(getattr(m, "kernel", None)).__name__ for m in fast.modules()
                    if isinstance(m, (lt.SparseConv2d, lt.SparseLinear)))
    result["replaced"] = {"layers": len(replaced), "kernels": len(fast.lospmm_replacements), "forms": dict(forms)}
    with torch.no_grad():
        want = ref(x).double()  # the pruned dense model in FP32 on the CPU
        if gpu:
            fast = fast.cuda()
            got = fast(x.cuda()).cpu().double()
        else:
            got = fast(x).double()
    result["max_abs_difference"] = float((got - want).abs().max())
    result["relative_difference"] = result["max_abs_difference"] / float(want.abs().max())
    result["same_top1"] = float((got.argmax(1) == want.argmax(1)).float().mean())
    print(f"output vs pruned dense: max |diff| {result['max_abs_difference']:.3g}, relative "
          f"{result['relative_difference']:.3g}, same top-1 {result['same_top1']:.0%}", flush=True)

    if gpu:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
        dense = copy.deepcopy(ref).cuda()  # .cuda() moves a module in place: ref stays the CPU reference
        result["latency"] = []
        # the kernels take the batch at run time: the kernels searched at --batch serve every batch here
        for batch in dict.fromkeys([args.batch, *args.serve_batches]):
            xb = torch.randn(batch, 3, args.image, args.image, generator=torch.Generator().manual_seed(batch))
            with torch.no_grad():
                want = ref(xb).double()
                xd = xb.cuda()
                got = fast(xd).cpu().double()
                row = {"batch": batch, "relative_difference": float((got - want).abs().max() / want.abs().max()),
                       "dense_fp32_ms": cuda_median_ms(lambda: dense(xd)), "lospmm_ms": cuda_median_ms(lambda: fast(xd)),
                       "dense_fp32_graph_ms": graph_median_ms(dense, xd), "lospmm_graph_ms": graph_median_ms(fast, xd)}
            row["speedup"] = row["dense_fp32_ms"] / row["lospmm_ms"]
            row["speedup_graph"] = row["dense_fp32_graph_ms"] / row["lospmm_graph_ms"]
            result["latency"].append(row)
            if args.out:  # each batch's figures kept as soon as they exist
                Path(args.out).write_text(json.dumps(result, indent=1))
            print(f"batch {batch}: relative difference {row['relative_difference']:.2g}; eager: dense FP32 (cuDNN, "
                  f"TF32 off) {row['dense_fp32_ms']:.3f} ms, lospmm {row['lospmm_ms']:.3f} ms, {row['speedup']:.2f}x; "
                  f"CUDA graph: {row['dense_fp32_graph_ms']:.3f} vs {row['lospmm_graph_ms']:.3f} ms, "
                  f"{row['speedup_graph']:.2f}x", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
