"""Whole models, sparsified, against what a user would run instead (issue 22, item 4): torchvision
ResNet-50 and MobileNetV2 and a transformers BertModel built from a config, magnitude-pruned to
`--sparsity`, each searched once at `--search-batch`, served by `lospmm.torch.sparsify` at every
`--batches`, against the same pruned model dense in four forms:

    baseline   fp32 (TF32 off), tf32, compile-tf32 (torch.compile, max-autotune-no-cudagraphs), fp16
    mode       eager, graph (the forward captured once as a CUDA graph and replayed), compile

Each row pairs a dense form with ours in the same mode (ours: fp32 kernels; eager, CUDA graph, or
torch.compile(fullgraph=True) with mode reduce-overhead). With `--dtype fp16` (or bf16; issue 23) the
model is converted first, searched and served by half kernels, and the one baseline is the same
pruned model dense in that dtype. `max_rel_diff` is ours against the pruned model in float32 on the
same inputs (max |Δ| / max |ref|), `top1_agreement` the share of rows whose
argmax agrees with it (CNN logits; BERT: the pooled output's argmax, a weak proxy). Times are medians
over `--repeats` CUDA-event timings, `spread` their (max − min) / median over `--rounds` medians.

    python -m benchmarks.end_to_end [--models resnet50 mobilenet_v2 bert] [--batches 1 8 32]
                                    [--sparsity 0.9] [--search-batch 8] [--artifacts DIR] [--out FILE.parquet]
                                    [--timer auto|cuda|estimate]

On the GPU it writes benchmarks/results/<device>/end-to-end.parquet (columns: model, batch,
sparsity, dtype, baseline, mode, dense_ms, ours_ms, spread_dense, spread_ours, max_rel_diff,
top1_agreement, speedup, device). Without one, `--models tiny-cnn tiny-bert --batches 2` runs the same
code on the host emulation (fp32 eager only, CPU wall-clock times: a check of the script, no figure
to quote).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

from lospmm.files import atomic_write

BASELINES = ("fp32", "tf32", "compile-tf32", "fp16")
MODES = ("eager", "graph", "compile")
COLUMNS = ("model", "batch", "sparsity", "dtype", "baseline", "mode", "dense_ms", "ours_ms", "spread_dense", "spread_ours",
           "max_rel_diff", "top1_agreement", "speedup", "device", "timer")


# --- the models and their inputs -------------------------------------------------------------------


def built_model(name: str):
    """(model in eval mode, a function batch -> the model's example input, a function output -> logits)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    if name in ("resnet50", "mobilenet_v2"):
        import torchvision

        model = getattr(torchvision.models, name)(weights=None).eval()
        return model, lambda b: torch.randn(b, 3, 224, 224, generator=torch.Generator().manual_seed(b)), lambda y: y
    if name == "bert":
        from transformers import BertConfig, BertModel

        model = BertModel(BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                     intermediate_size=3072)).eval()
        return model, lambda b: _tokens(b, 128, 30522), lambda y: y.pooler_output
    if name == "tiny-cnn":
        model = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 3, 1, 1,
                              groups=16), nn.Conv2d(16, 32, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                              nn.Linear(32, 10)).eval()
        return model, lambda b: torch.randn(b, 3, 16, 16, generator=torch.Generator().manual_seed(b)), lambda y: y
    if name == "tiny-bert":
        from transformers import BertConfig, BertModel

        model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=100)).eval()
        return model, lambda b: _tokens(b, 8, 100), lambda y: y.pooler_output
    raise ValueError(f"unknown model {name!r}")


def _tokens(batch: int, seq: int, vocab: int) -> dict:
    import torch

    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(batch))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}


def _moved(example, device: str, dtype=None):
    import torch

    def one(t):
        t = t.to(device)
        return t.to(dtype) if dtype is not None and t.is_floating_point() else t

    return {k: one(v) for k, v in example.items()} if isinstance(example, dict) else one(example)


def _call(model, example):
    return model(**example) if isinstance(example, dict) else model(example)


# --- timing ---------------------------------------------------------------------------------------


def timed_ms(fn, repeats: int, rounds: int, gpu: bool) -> tuple[float, float]:
    """(median, spread) of `fn`'s time in ms: `rounds` medians of `repeats` timings each (CUDA events
    on a GPU, wall clock on the CPU); spread = (max − min) / median of the round medians."""
    from benchmarks.torch_dropin import cuda_median_ms

    fn()
    medians = []
    for _ in range(rounds):
        if gpu:
            medians.append(cuda_median_ms(fn, repeats, warmup=0))
            continue
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        medians.append(statistics.median(times))
    middle = statistics.median(medians)
    return middle, (max(medians) - min(medians)) / middle if middle > 0 else float("nan")


def runner(model, example, mode: str):
    """A no-argument function running `model` on `example` in `mode`; None where the mode fails (a
    model torch.compile or graph capture cannot take is a missing figure, said on stdout)."""
    import torch

    try:
        if mode == "eager":
            fn = lambda: _call(model, example)  # noqa: E731
        elif mode == "compile":
            compiled = torch.compile(model, fullgraph=True, mode="reduce-overhead")
            fn = lambda: _call(compiled, example)  # noqa: E731
        else:  # graph: the forward captured once, replayed
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    _call(model, example)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                _call(model, example)
            fn = graph.replay
        with torch.no_grad():
            fn()
        return fn
    except Exception as e:
        print(f"  {type(model).__name__} {mode}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return None


# --- one model --------------------------------------------------------------------------------------


def model_rows(name: str, args) -> list[dict]:
    import torch

    import lospmm.torch as lt

    gpu = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if gpu else "cpu (host emulation)"
    model, example_of, logits_of = built_model(name)
    if name in ("resnet50", "mobilenet_v2", "tiny-cnn"):
        model = lt.fold_batchnorm(model)  # inference: BN folded, so Conv → BN → ReLU is one kernel
    kind = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    if kind is not None:  # issue 23: the model in half, searched and served in its own dtype (half kernels)
        model = model.to(kind)
        example_of = (lambda make: lambda b: _moved(make(b), "cpu", kind))(example_of)
    t0 = time.perf_counter()
    run_id = lt.search(model, example_of(args.search_batch), sparsity=args.sparsity, artifacts=args.artifacts,
                       name=name.replace("_", "-"), jobs=args.jobs, timer=args.timer)
    print(f"{name}: searched (run {run_id}) in {time.perf_counter() - t0:.0f} s", flush=True)
    ref = lt.pruned(model, run_id, artifacts=args.artifacts).eval()
    exact = copy.deepcopy(ref).float()  # the output difference is against the pruned model in float32
    fast = lt.sparsify(model, run_id, backend="cuda" if gpu else "host", artifacts=args.artifacts)
    served = sum(bool(r.module) for r in fast.lospmm_replacements)
    print(f"{name}: {served} of {len(fast.lospmm_replacements)} kernels serve the model", flush=True)
    where = "cuda" if gpu else "cpu"
    ref, fast, exact = ref.to(where), fast.to(where), exact.to(where)
    rows = []
    for batch in args.batches:
        example = _moved(example_of(batch), where)
        with torch.no_grad():
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
            want = logits_of(_call(exact, _moved(example, where, torch.float32))).float()
            got = logits_of(_call(fast, example)).float()
        diff = float((got - want).abs().max() / want.abs().max())
        agree = float((got.argmax(-1) == want.argmax(-1)).float().mean())
        ours = {}
        for mode in (MODES if gpu else ("eager",)):
            fn = runner(fast, example, mode)
            with torch.no_grad():
                ours[mode] = timed_ms(fn, args.repeats, args.rounds, gpu) if fn else (float("nan"), float("nan"))
        for baseline in ((args.dtype,) if kind is not None else BASELINES if gpu else ("fp32",)):
            tf32 = baseline in ("tf32", "compile-tf32")
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
            dense, dense_example = ref, example
            if baseline == "fp16" and kind is None:
                dense, dense_example = copy.deepcopy(ref).half(), _moved(example, where, torch.float16)
            modes = ("compile",) if baseline == "compile-tf32" else (("eager", "graph") if gpu else ("eager",))
            for mode in modes:
                if baseline == "compile-tf32":  # max-autotune: the strongest dense compile, no CUDA graphs
                    compiled = torch.compile(dense, mode="max-autotune-no-cudagraphs")
                    fn = lambda: _call(compiled, dense_example)  # noqa: E731
                else:
                    fn = runner(dense, dense_example, mode)
                with torch.no_grad():
                    dense_ms, dense_spread = timed_ms(fn, args.repeats, args.rounds, gpu) if fn else (float("nan"),) * 2
                ours_ms, ours_spread = ours[mode]
                rows.append({"model": name, "batch": batch, "sparsity": args.sparsity, "dtype": args.dtype,
                             "baseline": baseline,
                             "mode": mode, "dense_ms": dense_ms, "ours_ms": ours_ms, "spread_dense": dense_spread,
                             "spread_ours": ours_spread, "max_rel_diff": diff, "top1_agreement": agree,
                             "speedup": dense_ms / ours_ms if ours_ms > 0 else float("nan"), "device": device,
                             "timer": args.timer})
                print(f"  batch {batch:>3} {baseline:>12} {mode:>7}: dense {dense_ms:9.3f} ms, ours {ours_ms:9.3f} ms "
                      f"({rows[-1]['speedup']:.2f}×), diff {diff:.1e}, top-1 {agree:.2f}", flush=True)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    return rows


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["resnet50", "mobilenet_v2", "bert"],
                   choices=("resnet50", "mobilenet_v2", "bert", "tiny-cnn", "tiny-bert"))
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--sparsity", type=float, default=0.9)
    p.add_argument("--search-batch", type=int, default=8, help="the batch each model's kernels are searched at")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=0)
    p.add_argument("--artifacts", default="artifacts")
    p.add_argument("--timer", default="auto", choices=("auto", "cuda", "estimate"),
                   help="the search's timer (auto: cuda on a GPU). estimate: no proxy compiled or timed, only the "
                        "kernels served are built, the flow's choice without a GPU (the device program's serving "
                        "step: BERT's search on the cuda timer is more than one 10-minute command)")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "fp16", "bf16"),
                   help="fp16/bf16: the model in that dtype, searched and served by half kernels, against the same "
                        "pruned model dense in that dtype (issue 23); written as end-to-end-<dtype>.parquet")
    p.add_argument("--out", help="the parquet to write (default: benchmarks/results/<device>/end-to-end.parquet on a "
                                 "GPU, nothing on the CPU)")
    args = p.parse_args(argv)
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    out = args.out
    if out is None and torch.cuda.is_available():
        label = "gpu-" + torch.cuda.get_device_name().split()[1].lower()
        out = Path(__file__).resolve().parent / "results" / label / (
            "end-to-end.parquet" if args.dtype == "fp32" else f"end-to-end-{args.dtype}.parquet")
    # written after each model, and a model the file already holds at this sparsity, dtype and batches
    # is not run again: a device call cut off at its limit keeps the models it finished, and the next
    # call goes on from them (a whole model's search and compile is minutes on the GPU machine)
    def in_columns(r: dict) -> dict:  # a row in COLUMNS (a file written before a column existed reads it as null)
        return {c: r.get(c) for c in COLUMNS}

    kept = [in_columns(r) for r in pq.read_table(out).to_pylist()] if out and Path(out).is_file() else []
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (host emulation)"

    def key(r: dict) -> tuple:  # what a row measured: another GPU's or another timer's rows are not these
        return r["model"], r["sparsity"], r["dtype"], r["device"], r["timer"]

    rows = []
    for name in args.models:
        mine = [r for r in kept if key(r) == (name, args.sparsity, args.dtype, device, args.timer)]
        if mine and {r["batch"] for r in mine} >= set(args.batches):
            print(f"{name}: measured before ({len(mine)} rows in {out}); not run again", flush=True)
            rows += [r for r in mine if r["batch"] in args.batches]
            continue
        rows += model_rows(name, args)
        if out:
            rest = [r for r in kept if not any((*key(r), r["batch"]) == (*key(m), m["batch"]) for m in rows)]
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            atomic_write(Path(out), lambda tmp: pq.write_table(pa.Table.from_pylist(
                [in_columns(r) for r in rest + rows]), tmp))
            print(f"wrote {len(rest) + len(rows)} rows to {out}", flush=True)
    return rows


if __name__ == "__main__":
    main()
