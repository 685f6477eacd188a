"""Kernel directories (lospmm.kernel.package): the full kernel of one layer and tile rendered,
written, compiled through the compile cache and checked (lospmm.kernel.check). The emit stage
writes one per layer (`emitted_layer`); `lospmm kernel` writes one for any layer and tile of a run."""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lospmm.flows.catalog.pruned import csr_from_row
from lospmm.flows.catalog.reordered import tiles_from_row
from lospmm.flows.execution.taskio import failed_row, is_transient
from lospmm.flows.execution.units import UnitCompiler
from lospmm.flows.storage.compile_cache import cached_kernel, compile_summary
from lospmm.flows.storage.faults import fault_key, faulted, record_fault
from lospmm.flows.storage.runs import artifacts_of, why_no_artifact
from lospmm.flows.storage.schemas import LAYER_COLUMNS
from lospmm.flows.storage.store import read_artifact
from lospmm.devices import device_named
from lospmm.kernel.check import CheckResult, check_count, checked_paths
from lospmm.kernel.cuda import CudaError, context_lost
from lospmm.kernel.design import BASELINE, KernelDesign, design_named, short_design_label
from lospmm.kernel.choices import served_options, untiled_served
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.estimate import estimate_timer
from lospmm.kernel.geometry import ConvGeometry
from lospmm.kernel.host import HostKernel
from lospmm.kernel.numbers import in_format
from lospmm.kernel.nm import NMTiling, untiled_tiling
from lospmm.kernel.package import cleared, moved_package, read_package, write_cubin, write_record, write_source
from lospmm.kernel.render import CodegenParams, kernel_source
from lospmm.kernel.spec import KernelSpec
from lospmm.kernel.timing import LaunchUnderTest, Timer
from lospmm.stages.compile import kernel_options
from lospmm.stages.constrain import design_n1s
from lospmm.stages.emit import (EmitParams, check_column, cheapest_design, emit_failed, fastest_measured, fastest_proxy,
                                host_check_columns, measured_contenders, ranked_designs, served_design, served_form,
                                speedup, timed_ok, timed_rows)
from lospmm.status import Status


def layer_asked(layers: list[str], asked: str, shown: int = 12) -> str:
    """The run's layer `asked` names: its whole name or, as `inspect --layer` matches, text only one
    layer's name contains. LookupError listing the layers it matches (or, matching none, the run's
    layers), at most `shown` of them."""
    if asked in layers:
        return asked
    names = list(dict.fromkeys(layers))
    matches = [name for name in names if asked in name]
    if len(matches) == 1:
        return matches[0]

    def listed(found: list[str]) -> str:
        more = len(found) - shown
        return ", ".join(found[:shown]) + (f" and {more} more (lospmm inspect RUN --stage prune lists them)"
                                           if more > 0 else "")

    if matches:
        raise LookupError(f"--layer {asked!r} is in {len(matches)} layers' names: {listed(matches)}; give one whole")
    raise LookupError(f"layer {asked!r} is not in the run; its {len(names)} layers: {listed(names)}")


def write_full_kernel(root: str, record: dict, layer: str, m1: int, n1: int, out_dir: str,
                      sparsity: float | None = None, compile_: bool = True, verify: bool = True,
                      implicit_conv: bool = False, relu: bool = False, design: KernelDesign = BASELINE,
                      epilogue: Epilogue | None = None, nm_tiling=None, model: str | None = None) -> dict:
    """Generate (and compile, verify) the full kernel of `layer` at tile (m1, n1) in `design`; returns
    its kernel.json. `implicit_conv`: for a convolution, the kernel reads the NCHW input itself (no
    im2col), with the layer's geometry from the run's shapes and ReLU fused when `relu`. `epilogue`:
    what the kernel fuses (default: what the run's emit stage fuses into this layer — its bias and
    activation). A half `design` (kernel.design.half_design) is a half kernel of the same tile, A
    rounded to its dtype. The nm design writes the N:M kernel of a layer whose A holds an N:M pattern,
    in `nm_tiling` (a kernel's blocking, as served: ServedKernel.nm_tiling) or else the blocking the
    estimate prices lowest at the run's N (`m1` and `n1` are not used). `model`: the run's model the
    layer is in, where several hold it (run_layer)."""
    model, layer = run_layer(root, record, layer, model)
    entries = _entries(record, model)
    sparsity = _sparsity_of(record, entries, "reorder", sparsity)
    pruned = read_artifact(Path(root) / entries[("prune", sparsity)]["path"])
    reordered = read_artifact(Path(root) / entries[("reorder", sparsity)]["path"])
    matrix = csr_from_row(pruned, _pruned_row(pruned, layer))
    shape = next(r for r in read_artifact(Path(root) / entries[("extract", None)]["path"]).to_pylist()
                 if r["layer"] == layer)
    device = device_named(record["config"]["gpu"])
    arch = device.arch
    nm = None
    if not design.tiled:
        if implicit_conv and design.conv_kernel is None:
            raise ValueError(f"{layer}: design {design.label} is a GEMM kernel (no --implicit-conv)")
        nm = nm_tiling or untiled_served(matrix, shape["n"], device, design, layer, conv=implicit_conv).nm
        tiles = None
    else:
        tile_problem(design, m1, n1, device)
        at = {(reordered.column("layer")[i].as_py(), reordered.column("m1")[i].as_py()): i
              for i in range(reordered.num_rows)}
        if (layer, m1) not in at:
            known = sorted(m for (lay, m) in at if lay == layer)
            raise LookupError(f"{layer}: no reorder for M1={m1}; M1 values in the run: {known}")
        tiles = tiles_from_row(reordered, at[(layer, m1)])
    if epilogue is None:
        if shape.get("bias"):  # read from the file the run searched (01_shapes names it), not a newer one
            checked_unchanged(shape["source"], shape["source_sha256"])
        epilogue = layer_epilogue(shape)
    if relu:
        if epilogue.activation not in ("", "relu"):
            raise ValueError(f"{layer}: --relu: the run fuses {epilogue.activation} into this layer's kernel")
        epilogue = Epilogue(epilogue.bias, "relu")
    return emitted_kernel(root, matrix, tiles, layer, sparsity, n1, arch, Path(out_dir), compile_, verify,
                          conv=conv_geometry(shape) if implicit_conv else None, design=design, epilogue=epilogue,
                          nm=nm)


def tile_problem(design: KernelDesign, m1: int, n1: int, device) -> None:
    """ValueError where no kernel of `design` has the tile (m1, n1) on `device`: N1 not one the search
    would try (a multiple of the warp up to the block's thread limit; a staged design's own), or a
    block past what the design launches (KernelDesign.block_problem)."""
    if n1 not in design_n1s(design, device):  # the N1 the search would have tried
        if design.fixed_n1:
            raise ValueError(f"--n1 {n1}: design {short_design_label(design.label)} has N1 = {design.fixed_n1} "
                             f"(32 threads a tile's warp)")
        raise ValueError(f"--n1 {n1}: threads per block are a multiple of {device.warp_size} up to "
                         f"{device.max_threads_per_block} on the {device.name}")
    problem = design.block_problem(m1, n1)
    if problem:
        raise ValueError(f"--m1 {m1} --n1 {n1}: {problem}")


@dataclass(frozen=True)
class ServedKernel:
    """The kernel a run's emit stage served a layer with (10_kernels and its kernel directory), as
    `lospmm kernel` writes it again when given no tile or design."""

    model: str
    layer: str
    sparsity: float
    m1: int
    n1: int
    design: KernelDesign  # as served: a convolution's in its conv form, a half kernel's in its number format
    implicit_conv: bool
    kernel: str  # its name (the hash of its text): the same kernel written again has it too
    label: str  # 10_kernels' design cell, as the run's summary shows it
    nm_tiling: object = None  # an N:M kernel's blocking, as served (a GPU's emit serves the fastest it timed)


def served_kernel(root: str, record: dict, layer: str, sparsity: float | None = None,
                  model: str | None = None) -> ServedKernel:
    """The kernel the run served `layer` with (its whole name, or text only its name contains; in
    `model` where several of the run's models hold it) at `sparsity` (needed where the run has
    several), from its emit artifact and the kernel directory it names (read_package: every file as
    emit wrote it). LookupError saying why there is none: the run has no emit artifact, or served the
    layer no kernel; ValueError where the run refused the layer at prune."""
    model, layer = run_layer(root, record, layer, model)
    entries = _entries(record, model)
    sparsity = _sparsity_of(record, entries, "emit", sparsity,
                            missing="; --m1 and --n1 write a kernel of a tile the run reordered for")
    row = next((r for r in read_artifact(Path(root) / entries[("emit", sparsity)]["path"]).to_pylist()
                if r["layer"] == layer), None)
    if row is None or row["status"] != Status.OK or not row.get("kernel_dir"):
        _pruned_row(read_artifact(Path(root) / entries[("prune", sparsity)]["path"]), layer)  # refused there?
        why = "its emit has no row of it" if row is None else row.get("message") or row["status"]
        raise LookupError(f"{layer}: the run served it no kernel ({why}); --m1 and --n1 write a kernel of a tile "
                          f"the run reordered for")
    facts = read_package(Path(root) / row["kernel_dir"]).facts
    # the row's tile (kernel.json's n1 is a block's threads: a staged block's tiles together)
    return ServedKernel(model, layer, sparsity, row["m1"], row["n1"], KernelDesign.of_facts(facts["design"]),
                        row["form"] == "implicit-conv", facts["kernel"], short_design_label(row["design"]),
                        untiled_tiling(facts["nm"]) if isinstance(facts.get("nm"), dict) else None)


def _pruned_row(pruned, layer: str) -> int:
    """The row of `layer` in the run's prune artifact (a pyarrow table); ValueError with the reason where
    the run refused the layer there (it has no A to render)."""
    row = pruned.column("layer").to_pylist().index(layer)
    status = pruned.column("status")[row].as_py()
    if status != Status.OK:
        why = pruned.column("message")[row].as_py() or status
        raise ValueError(f"{why if why.startswith(layer) else f'{layer}: {why}'}; the run refused this layer at prune, "
                         f"so it has no kernel to write")
    return row


def _entries(record: dict, model: str) -> dict:
    """The run's artifacts of one model by (stage, sparsity)."""
    return {(e["stage"], e.get("sparsity")): e for e in artifacts_of(record) if e.get("model") == model}


def run_layer(root: str, record: dict, asked: str, model: str | None = None) -> tuple[str, str]:
    """(model, layer): the run's layer `asked` names (layer_asked: its whole name, or text only one
    layer's name contains), in `model`, or in the one model of the run that holds it. LookupError
    naming the models where several do (a run of `--zoo all`: each CNN has its `fc`), or listing the
    run's layers where none does."""
    shapes = {e["model"]: e for e in artifacts_of(record) if e["stage"] == "extract"}
    if not shapes:
        raise LookupError(why_no_artifact(record, "extract"))
    if model is not None and model not in shapes:
        raise LookupError(f"--model {model}: not a model of run {record['run_id']}; its models: {', '.join(shapes)}")
    rows = {m: read_artifact(Path(root) / e["path"]).to_pylist() for m, e in shapes.items() if model in (None, m)}
    skipped = {r["layer"]: r["message"] for table in rows.values() for r in table if r["status"] == Status.SKIPPED}
    if asked in skipped:  # a tensor extract passed over (a bias, a norm): no layer of the run
        raise LookupError(f"{asked}: the run searched no kernel for it ({skipped[asked] or 'skipped at extract'})")
    layers = {m: [r["layer"] for r in table if r["status"] != Status.SKIPPED] for m, table in rows.items()}
    found, errors = [], []
    for name, names in layers.items():
        try:
            found.append((name, layer_asked(names, asked)))
        except LookupError as e:
            errors.append(e)
    if len(found) == 1:
        return found[0]
    if found:
        raise LookupError(f"--layer {asked!r} is in {len(found)} of the run's models: "
                          f"{', '.join(f'{m} ({layer})' for m, layer in found)}; give --model")
    ambiguous = [e for e in errors if "layers' names" in str(e)]  # text several of one model's layers hold
    if ambiguous:
        raise ambiguous[0]
    layer_asked([layer for names in layers.values() for layer in names], asked)  # raises, listing the layers
    raise LookupError(f"layer {asked!r} is not in run {record['run_id']}")


def _sparsity_of(record: dict, entries: dict, stage: str, sparsity: float | None, missing: str = "") -> float:
    """The sparsity asked (the run's only one when None) at which the run has a `stage` artifact;
    LookupError saying why not (with `missing` added where the run has none at all)."""
    sparsities = sorted({s for (st, s) in entries if st == stage})
    if not sparsities:
        raise LookupError(why_no_artifact(record, stage) + missing)
    if sparsity is None:
        if len(sparsities) != 1:
            raise LookupError(f"run {record['run_id']} has sparsities {sparsities}; pick one with --sparsity")
        sparsity = sparsities[0]
    if (stage, sparsity) not in entries:
        raise LookupError(f"run {record['run_id']} has no {stage} artifact at sparsity {sparsity}")
    return sparsity


def _failure(facts: dict) -> str:
    """Why an emitted kernel cannot be served ("" when it can): its compile failed, or its check."""
    comp, check = facts["compile"], facts.get("check", "not run")
    if not emit_failed(comp["status"], check):
        return ""
    return comp.get("log", "")[-300:] or f"{check} ({facts.get('check_message') or 'no message'})"


def _served_columns(served, runner_up, conv: bool) -> dict:
    """10_kernels' design, runner_up, their estimates and design prices (Served.design_price_us), and the
    served kernel's form (`conv`: the layer is a convolution given its geometry; stages.emit.served_form)."""
    return {"form": served_form(served.design, conv), "design": served.label, "design_estimate_us": served.estimate_us,
            "design_price_us": served.design_price_us,
            "runner_up": runner_up.label if runner_up else "",
            "runner_up_estimate_us": runner_up.estimate_us if runner_up else float("nan"),
            "runner_up_price_us": runner_up.design_price_us if runner_up else float("nan")}


def designs_priced(options) -> str:
    """10_kernels' designs_priced: every way the layer could be served, in the order the emit stage
    ranked them (stages.emit.ranked_designs), a design once at its best tile (an untiled kernel in each
    blocking), each `label: estimate µs / price µs` — the runners-up behind the choice."""
    seen, out = set(), []
    for o in ranked_designs(options):
        key = served_design(o) or o.label
        if key not in seen:
            seen.add(key)
            out.append(f"{o.label}: {o.estimate_us:.3g} / {o.design_price_us:.3g} µs")
    return "; ".join(out)


def _measured(label: str, time_us: float | None, why: str, unfold_us: float = 0.0) -> str:
    """One entry of 10_kernels' designs_measured: a way to serve the layer and its measured time (with
    `unfold_us`, an im2col GEMM's estimated unfolding, added and said)."""
    if time_us is None:
        return f"{label}: failed ({why[:150]})"
    if not math.isfinite(time_us):
        return f"{label}: not timed"
    return f"{label}: {time_us:.2f} µs" + (f" (with {unfold_us:.2f} µs of unfolding, ESTIMATED)" if unfold_us else "")


def checked_unchanged(path: str, sha256: str) -> None:
    """ValueError naming the weights file when it changed since the run read it (its SHA-256)."""
    from lospmm.flows.inputs.weights import WeightsFileError, weights_sha256

    try:
        now = weights_sha256(path) if sha256 else sha256
    except (OSError, WeightsFileError) as e:  # a file or shard gone since
        raise ValueError(f"{path}: the weights changed since the run started ({e}); run again") from None
    if now != sha256:
        raise ValueError(f"{path}: the weights file changed since the run started; run again")


def layer_epilogue(shape_row: dict, weights=None) -> Epilogue:
    """What a layer's kernel fuses: its bias (read from the weights file the run searched, the row's
    `source`; `weights`: that file opened, inputs.weights.WeightsFile) and the activation its model
    applies right after it, as the importer recorded them in 01_shapes."""
    name, activation = shape_row.get("bias") or "", shape_row.get("activation") or ""
    if not name:
        return Epilogue(activation=activation)
    from lospmm.flows.inputs.onnx_model import graph_tensor, is_onnx
    from lospmm.flows.inputs.weights import load_tensor

    if is_onnx(shape_row["source"]):  # an initializer of the graph (planned_weights opens no file for it)
        bias = graph_tensor(shape_row["source"], name)
    else:
        bias = weights.tensor(name) if weights is not None else load_tensor(shape_row["source"], name)
    return Epilogue(tuple(bias.astype("float32").ravel().tolist()), activation)


def conv_geometry(shape_row: dict) -> ConvGeometry:
    """A convolution layer's geometry from its 01_shapes row (a grouped convolution's is the dense
    one's: its A is block-diagonal over all input channels); ValueError naming the layer if it is
    not a convolution."""
    layer = shape_row["layer"]
    if shape_row["op"] != "conv":
        raise ValueError(f"{layer} is a {shape_row['op']} layer, not a convolution: no implicit-im2col kernel")
    return ConvGeometry(cin=shape_row["cin"], h=shape_row["h_in"], w=shape_row["w_in"], kh=shape_row["kh"],
                        kw=shape_row["kw"], stride=shape_row["stride"], pad=shape_row["pad"],
                        dilation=shape_row.get("dilation") or 1)


def emitted_kernel(root: str, matrix, tiles, layer: str, sparsity: float, n1: int, arch: str, out: Path,
                   compile_: bool = True, verify: bool = True, extra: dict | None = None,
                   measured: Callable[[KernelSpec, bytes, dict], dict] | None = None,
                   compile_units: UnitCompiler | None = None, conv: ConvGeometry | None = None,
                   design: KernelDesign = BASELINE, epilogue: Epilogue = Epilogue(),
                   nm: NMTiling | None = None) -> dict:
    """Write one kernel package (lospmm.kernel.package) at `out`: the kernel of `matrix` on `tiles`
    in `design` rendered (an implicit-im2col convolution kernel when `conv` is given; A rounded to a
    half design's dtype first, weight.parquet holding the rounded A and kernel.json what rounding
    lost), its units compiled through the compile cache by `compile_units` and linked, checked on the
    host under AddressSanitizer (`verify`), and what `measured(spec, cubin, results so far)` adds once
    it compiled (its time, a device check). `nm`: the N:M kernel in this blocking (design `nm`; its A
    in natural row order, `tiles` unused). Returns its kernel.json record. ValueError naming what no
    renderer can do."""
    if conv is not None and design.conv_kernel is not None:  # a convolution's kernel in its design's conv form
        design = design.conv_kernel
    matrix, rounding = in_format(matrix, design.number)
    kernel = kernel_source(matrix, tiles, n1, CodegenParams(design=design), epilogue, conv, nm=nm)
    spec = kernel.spec.located(layer, sparsity, arch, None if nm is not None else tiles, rounding)
    cleared(out)
    write_source(out, kernel, matrix)
    results = dict(extra or {})
    cubin = None
    if compile_:
        result, hit = cached_kernel(root, kernel, kernel_options(arch, kernel.spec.m1, design=design,
                                                                        conv=kernel.spec.form == "conv"), compile_units)
        kept = ("status", "registers", "spill_stores", "spill_loads", "thread_spill_bytes", "stack_bytes", "seconds",
                "cost_seconds", "wall_seconds", "link_seconds", "units", "units_compiled", "key", "options", "unit_keys")
        results["compile"] = {k: result[k] for k in kept} | {"from_cache": hit}
        if result["status"] == Status.OK:
            cubin = write_cubin(out, Path(root) / result["paths"]["cubin"])
        else:
            results["compile"]["log"] = result["log"][-4000:]
    if verify:
        count = check_count(spec, host_check_columns(spec.n1 or n1))  # an N:M kernel's block is its own
        try:
            host = HostKernel(kernel, sanitize=True, module_data=spec.module_data(matrix))
            results["host_check"] = checked_paths(host, matrix, count).facts() | {"sanitizer": "address"}
        except Exception as e:
            if is_transient(e):  # a killed compiler or a full disk says nothing about the kernel
                raise
            results["host_check"] = {"status": Status.ERROR, "message": f"{type(e).__name__}: {e}"[:2000], "n": count}
    if measured is not None and cubin is not None:
        results.update(measured(spec, cubin, results))
    write_record(out, spec, results)
    return {**spec.facts(), **results}


def emitted_layer(root: str, out: Path, timed: list[dict], matrix, tiles: dict, timer: Timer, arch: str,
                  params: EmitParams, logger, compile_units: UnitCompiler | None = None,
                  conv: ConvGeometry | None = None, design: KernelDesign = BASELINE,
                  epilogue: Epilogue = Epilogue()) -> dict:
    """One layer of the emit stage: the fastest timed proxy's tile (emit.fastest_proxy) as a kernel
    directory at `out`, compiled, checked (on the device when the timer runs binaries, else on the
    host), timed by `timer`; returns its 10_kernels row. A failure is the row's status, not raised.
    `conv`: the layer's geometry, for an implicit-im2col convolution kernel where the served design has
    one (stages.emit.served_form; else the GEMM on its im2col B); `epilogue`: the bias and activation
    fused into it (layer_epilogue). A half `design` emits a half kernel (the GEMM form, or the N:M
    kernel's conv form), checked against the float64 product of the same rounded A and B through its
    epilogue (on the device where the timer runs binaries, else on the host)."""
    layer = timed[0]["layer"]
    best = fastest_proxy(timed, params.tie_band if timer.measures else 0.0)  # an estimate has no noise to tie in
    ok = timed_ok(timed)
    run_design = design  # the run's: its kernels' labels name no design
    if best is not None and best.get("design"):  # where the search spans designs, the fastest proxy's
        design = design_named(best["design"])
    base = {**{c: timed[0][c] for c in LAYER_COLUMNS + ("sparsity",)}, "timer": timer.name,
            "chosen_by": params.chosen_by, "candidates_timed": ok,
            "form": served_form(design.conv_kernel or design, conv is not None), "dtype": design.dtype}
    if best is None:
        return {**base, "status": Status.ERROR, "message": f"{layer}: no candidate could be timed ("
                + "; ".join(sorted({r["message"] for r in timed if r["message"]}))[:500] + ")"}
    t0 = time.perf_counter()
    try:
        # the ways to serve the layer: the fastest proxy's tile first; where designs are searched
        # (`--design auto`) every timed tile in every design, since the tile best in one design need not
        # be in another; then the N:M kernel of an N:M layer
        joint = bool(params.designs)
        key = lambda r: (r["m1"], r["n1"], r.get("design") or run_design.label)  # noqa: E731
        by_tile = {key(r): r for r in timed_rows(timed)} if joint else {key(best): best}
        if joint and not timer.measures:
            base["chosen_by"] = f"{params.chosen_by}; tile and design by the estimate"
        tiled = [key(best)] + [t for t in by_tile if t != key(best)]
        options = [o for i, (tm1, tn1, label) in enumerate(tiled)
                   for o in served_options(matrix, tiles[tm1], best["m"], best["k"], best["n"], tn1,
                                           design_named(label), timer.device,
                                           params.nm_kernel and i == 0, params.designs, conv is not None)]
        options = list({(o.label, o.m1, o.n1): o for o in options}.values())  # a tile in a design once

        def proxy_of(m1: int, n1: int, label: str) -> dict:
            """The timed proxy of a tile: in that design, else in the one it was searched in, else the fastest."""
            return by_tile.get((m1, n1, label)) or next(
                (r for (tm1, tn1, _), r in by_tile.items() if (tm1, tn1) == (m1, n1)), best)
        served, runner_up = cheapest_design(options)
        base["designs_priced"] = designs_priced(options)
        base["form"] = served_form(served.design, conv is not None)  # a failed row names the form it tried

        dense_times: dict[str, float] = {}

        def emitted(choice, where: Path) -> dict:
            """The kernel of one way to serve the layer, written at `where`, compiled, checked and timed."""
            design, nm = choice.design, choice.nm
            m1, n1 = (choice.m1, choice.n1) if choice.tiled else (best["m1"], best["n1"])

            def measured(spec: KernelSpec, cubin: bytes, results: dict) -> dict:
                comp = results["compile"]
                a = in_format(matrix, design.number)[0]
                data = spec.module_data(a) if spec.module_symbols else None
                full = LaunchUnderTest(tiles[m1], best["m"], best["k"], best["n"], n1, comp["registers"],
                                       comp["thread_spill_bytes"], spec=spec, cubin=cubin, module_data=data,
                                       matrix=a)
                # the device check where the timer runs the kernel, else the host check's verdict: in the
                # kernel's number format's metric, against its tolerance (every path the kernel picks at launch)
                result = timer.checked(spec, cubin, a, check_count(spec, params.device_check_n))
                host = results.get("host_check")
                error, check = (check_column("device", result) if result is not None
                                else check_column("host", CheckResult.of_facts(host) if host else None))
                full_us = timer.time(full).time_us
                # the dense baseline in the kernel's dtype: SGEMM (TF32 off) for fp32, cuBLAS's tensor-core
                # GEMM for fp16 / bf16
                if design.dtype not in dense_times:  # once per layer and dtype, whatever the kernels tried
                    dense_times[design.dtype] = timer.dense(full.m, full.k, full.n, design.dtype).time_us
                dense_us = dense_times[design.dtype]
                failure = (result.message if result is not None else (host or {}).get("message", "")) \
                    if "FAILED" in check else ""
                return {"full_time_us": full_us, "dense_time_us": dense_us,
                        "speedup_vs_dense": speedup(dense_us, full_us, timer.measures), "check": check,
                        "max_rel_error": error, **({"check_message": failure} if failure else {})}

            proxy_us = proxy_of(m1, n1, design.label)["time_us"]
            return emitted_kernel(root, matrix, tiles[m1], layer, best["sparsity"], n1, arch, where, compile_=True,
                                  verify=params.verify and not timer.runs_binary,
                                  extra={"chosen_by": base["chosen_by"], "timer": timer.name, "gpu": timer.device.name,
                                         "proxy_time_us": proxy_us, "candidates_timed": ok}, measured=measured,
                                  compile_units=compile_units, conv=conv if served_form(design, conv is not None)
                                  == "implicit-conv" else None, design=design, epilogue=epilogue, nm=nm)

        def attempt(choice, where: Path) -> tuple[dict | None, str, Exception | None]:
            """Its kernel emitted at `where`, why it cannot be served ("" when it can) and what was raised.
            A kernel that faulted on the device in an earlier run is not launched again (storage.faults)."""
            key = fault_key(best["model"], layer, best["sparsity"], choice.label)
            if timer.runs_binary:
                before = faulted(root).get(key)
                if before is not None:
                    error = ValueError(f"faulted on the device before ({before})")
                    return None, f"{type(error).__name__}: {error}", error
                lost = context_lost()
                if lost:  # an earlier kernel took this process's context: a fresh one retries
                    raise CudaError(f"{choice.label}: not launched, the CUDA context was lost at {lost}",
                                    context_lost=True, transient=True)
            try:
                facts = emitted(choice, where)
                return facts, _failure(facts), None
            except Exception as e:
                if is_transient(e):
                    raise
                if timer.runs_binary and context_lost(probe=True):  # its own fault: remembered, so a retry gets past it
                    record_fault(root, key, f"{type(e).__name__}: {e}")
                return None, f"{type(e).__name__}: {e}", e

        # where the timer measures, the full kernels of the estimate's cheapest few are timed and the
        # fastest that passes its check is served: the estimate prunes, the device decides
        cheapest = measured_contenders(options, params.measure_designs, params.measure_within) \
            if timer.measures else [served]
        # with them the fastest proxy's kernel (the device's best so far) when the estimate left it out
        contenders = cheapest + ([options[0]] if len(cheapest) > 1 and options[0] not in cheapest else [])
        several = len(contenders) > 1
        if several:  # before they are emitted: kernel.json records how its kernel was chosen
            base["chosen_by"] += (f"; {'tile and ' if joint else ''}design by the device among the estimate's "
                                  f"{len(cheapest)} cheapest" + (" and the fastest proxy's kernel"
                                                                 if len(contenders) > len(cheapest) else ""))
        # several are each written to a directory of their own beside `out`; the one served moves there
        spots = [out.with_name(f".{out.name}.try{i}") for i in range(len(contenders))] if several else [out]
        try:
            tried = [(c, *attempt(c, where), where) for c, where in zip(contenders, spots)]
            pick = 0  # with one: the estimate's choice; with several, none passing: the cheapest's failure
            if several:
                # a convolution's im2col GEMM is served after its unfolding, which the implicit kernels beside
                # it do not pay: its estimate (the price it was ranked by) is added to its measured time
                estimate = estimate_timer(timer.device)
                unfolds = [estimate.unfold_us(best["k"], best["n"], c.design.element_bytes)
                           if conv is not None and served_form(c.design, True) == "gemm" else 0.0 for c, *_ in tried]
                times = [f["full_time_us"] + u if f is not None and not why else None
                         for (_, f, why, _, _), u in zip(tried, unfolds)]
                base["designs_measured"] = "; ".join(_measured(c.label, t, why, u)
                                                     for (c, _, why, _, _), t, u in zip(tried, times, unfolds))
                win = fastest_measured(times, params.tie_band)
                if win is not None:
                    pick = win
                    others = sorted((t, i) for i, t in enumerate(times)
                                    if i != win and t is not None and math.isfinite(t))
                    runner_up = contenders[others[0][1]] if others else \
                        next((o for o in ranked_designs(options) if o is not contenders[win]), None)
            # the cheapest way that fails (does not render, compile or pass its check) gives way to the kernel
            # the search measured proxies of: the layer is served, and the failure said in its row
            fallback, fell_back = options[0], ""
            served, facts, why, error, where = tried[pick]
            if error is not None and served is fallback:
                raise error
            if why and served is not fallback:
                logger.warning("%s: %s failed (%s); serving %s instead", layer, served.label, why[:300], fallback.label)
                fell_back = f"{served.label} failed ({why[:300]}); served {fallback.label} instead"
                served, runner_up = fallback, served
                base |= _served_columns(served, runner_up, conv is not None)  # the failed row says what it tried to serve
                earlier = next((t for t in tried if t[0] is fallback), None)  # a contender already emitted
                facts, why, error, where = earlier[1:] if earlier else (*attempt(fallback, out), out)
                if error is not None:
                    raise RuntimeError(f"{fell_back}; {why}") from error
            if where != out:
                moved_package(where, out)
        finally:
            for spot in spots:
                if spot != out:
                    shutil.rmtree(spot, ignore_errors=True)
        # after a fall back the runner-up is the cheaper choice that failed (the message says so)
        base |= _served_columns(served, runner_up, conv is not None)
        m1, n1 = (served.m1, served.n1) if served.tiled else (best["m1"], best["n1"])
        comp, check = facts["compile"], facts.get("check", "not run")
        # a convolution served as its im2col GEMM (an --im2col run's, or where it was the cheapest way) pays
        # X's unfolding before the kernel: its price (an estimate) goes beside the kernel's time, not into it
        as_gemm = served_form(served.design, True) == "gemm" if conv is not None else best.get("op") == "conv"
        failed = emit_failed(comp["status"], check)
        unfold_us = (estimate_timer(timer.device).unfold_us(best["k"], best["n"], served.design.element_bytes)
                     if as_gemm and not failed else float("nan"))
        logger.info("emitted %s tile (%d,%d): compile %s, %s check, %s %.2f us, %.1f s in all", layer, m1,
                    n1, compile_summary(comp, comp["from_cache"]), check, timer.name,
                    facts.get("full_time_us", float("nan")), time.perf_counter() - t0)
        return {**base, "status": Status.ERROR if failed else Status.OK,
                "message": (f"{fell_back}; " if fell_back else "") + f"{layer} ({m1},{n1}): "
                + (comp.get("log", "")[-300:] or f"{check} ({facts.get('check_message') or 'no message'})")
                if failed else fell_back,
                "m1": m1, "n1": n1, "proxy_time_us": proxy_of(m1, n1, served.design.label)["time_us"],
                "full_time_us": facts.get("full_time_us", float("nan")), "unfold_us": unfold_us,
                "dense_time_us": facts.get("dense_time_us", float("nan")),
                "speedup_vs_dense": facts.get("speedup_vs_dense"), "kernel": facts["kernel"],
                "kernel_dir": str(out.relative_to(root)), "registers": comp.get("registers"),
                "spill_bytes": comp.get("spill_stores", 0) + comp.get("spill_loads", 0),
                "compile_seconds": comp.get("seconds"), "check": check,
                "max_rel_error": facts.get("max_rel_error", float("nan")), "seconds": time.perf_counter() - t0}
    except Exception as e:  # one layer's failure is its row; the others carry on
        return failed_row(base, layer, e)
