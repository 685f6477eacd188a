"""How the emit stage serves N:M layers, by the estimate: per layer and N:M pattern, the baked kernel
of the tile the search chooses (ranker top-10, proxies timed by the estimate, as a run on an H100
without a GPU) against the N:M kernel in its cheapest blocking (lospmm.kernel.choices), and which
one a run serves. Every figure is an ESTIMATE (the `estimate` timer's model, calibrated where a
calibration is stored): what the device program's `nm` step will measure.

    python -m benchmarks.nm_choice                                   # BERT-base's layers, six patterns
    python -m benchmarks.nm_choice --models resnet50 --patterns nm:2:4,nm:16:32:8

The table also lists the N:M kernel's estimate over the baked kernel's (< 1: the N:M kernel is served),
and what is served over the baked kernel of the same layer pruned at random to the same sparsity
(issue 34's "an N:M layer never slower than our unstructured kernel", by the estimate). A convolution
is priced as a run serves it, in its implicit-im2col form (both kernels' conv forms: `form`
implicit-conv); `--im2col` prices it as the GEMM on its im2col B, as `lospmm run --im2col` serves it.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from benchmarks.sets import gemm_shapes, searched_tile
from lospmm.devices import device_named
from lospmm.kernel.choices import served_options
from lospmm.kernel.design import BASELINE
from lospmm.kernel.estimate import estimate_timer
from lospmm.stages.emit import cheapest_design
from lospmm.stages.prune import nm_pattern, pruned_layer, PruneParams
from lospmm.stages.reorder import reordered_tiles

PATTERNS = ("nm:2:4", "nm:2:4:8", "nm:16:32", "nm:16:32:8", "nm:8:32:8", "nm:4:32:8")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bert-base")
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--im2col", action="store_true", help="convolutions as GEMMs on their im2col B")
    args = ap.parse_args(argv)
    device = device_named(args.gpu)
    timer = estimate_timer(device)
    table = Table(title=f"N:M layers by the estimate ({timer.name}, {device.name}): the baked kernel of the searched "
                        f"tile against the N:M kernel; ESTIMATES, µs")
    for c in ("model", "layer", "M×K×N", "form", "pattern", "tile", "baked µs", "N:M blocking", "N:M µs", "N:M / baked",
              "served", "served / random"):
        table.add_column(c)
    random_us: dict = {}  # (layer, sparsity) -> the baked kernel of the layer pruned at random, by the estimate

    def unstructured(shape, sparsity: float, conv: bool) -> float:
        key = (shape.model, shape.layer, sparsity)
        if key not in random_us:
            a = pruned_layer(shape, sparsity).matrix
            tile = searched_tile(shape, sparsity, BASELINE, device, timer, "")
            random_us[key] = float("nan") if tile is None else served_options(
                a, reordered_tiles(a, tile[0]), shape.m, shape.k, shape.n, tile[1], BASELINE, device, False,
                conv=conv)[0].estimate_us
        return random_us[key]

    for model in args.models.split(","):
        for shape in gemm_shapes(model):
            for method in args.patterns.split(","):
                pattern = nm_pattern(method)
                if pattern.problem(shape.layer, shape.k):
                    continue
                a = pruned_layer(shape, pattern.sparsity, PruneParams(method=method)).matrix
                tile = searched_tile(shape, pattern.sparsity, BASELINE, device, timer, method)
                if tile is None:
                    continue
                m1, n1 = tile
                conv = shape.op == "conv" and not args.im2col  # a run's default: its implicit-im2col kernels
                options = served_options(a, reordered_tiles(a, m1), shape.m, shape.k, shape.n, n1, BASELINE, device,
                                         conv=conv)
                served, _ = cheapest_design(options)
                baked = options[0]
                nm = min(options[1:], key=lambda s: s.estimate_us) if len(options) > 1 else None
                table.add_row(model, shape.layer, f"{shape.m}×{shape.k}×{shape.n}", "implicit-conv" if conv else "gemm",
                              method[3:], baked.label,
                              f"{baked.estimate_us:.1f}", nm.nm.label.split(",", 1)[1] if nm else "-",
                              f"{nm.estimate_us:.1f}" if nm else "-",
                              f"{nm.estimate_us / baked.estimate_us:.2f}" if nm else "-",
                              "N:M kernel" if served.nm is not None else "baked",
                              f"{served.estimate_us / unstructured(shape, pattern.sparsity, conv):.2f}")
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
