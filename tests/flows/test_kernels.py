"""Kernel directories: the full kernel's text, compiled cubin and kernel.json, written once with the
compile result, the host check and what the caller measured."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lospmm.flows.kernels import emitted_kernel
from lospmm.kernel.package import read_package
from lospmm.stages.prune import random_pruned
from lospmm.stages.reorder import reordered_tiles


def test_a_kernel_directory_holds_a_checked_compiled_kernel(tmp_path):
    a = random_pruned(48, 40, 0.8, np.random.default_rng(0))
    tiles = reordered_tiles(a, 4)
    calls = []

    def measured(spec, cubin, results):
        calls.append((results["compile"]["status"], cubin[:4], spec.layer))
        return {"full_time_us": 1.5, "check": "host-asan"}

    out = tmp_path / "k"
    facts = emitted_kernel(str(tmp_path), a, tiles, "enc.0", 0.8, 64, "sm_80", out, extra={"timer": "estimate"},
                           measured=measured)
    assert calls == [("ok", b"\x7fELF", "enc.0")]  # measured once, after the compile, with the cubin and its spec
    on_disk = json.loads((out / "kernel.json").read_text())
    assert on_disk == json.loads(json.dumps(facts))
    assert on_disk["full_time_us"] == 1.5 and on_disk["timer"] == "estimate" and on_disk["arch"] == "sm_80"
    assert on_disk["compile"]["status"] == "ok" and "--gpu-architecture=sm_80" in on_disk["compile"]["options"]
    assert on_disk["host_check"]["status"] == "ok" and on_disk["host_check"]["max_rel_error"] < 1e-5
    assert (out / "kernel.cubin").read_bytes()[:4] == b"\x7fELF" and not (out / "kernel.ptx").exists()
    assert on_disk["compile"]["units"] == len(on_disk["compile"]["unit_keys"]) >= 2  # tile units + the entry
    assert on_disk["kernel"] in (out / "kernel.cu").read_text()
    # the same kernel again comes from the compile cache
    again = emitted_kernel(str(tmp_path), a, tiles, "enc.0", 0.8, 64, "sm_80", tmp_path / "k2")
    assert again["compile"]["from_cache"] and again["compile"]["key"] == facts["compile"]["key"]


def test_without_a_compile_nothing_is_measured(tmp_path):
    a = random_pruned(16, 16, 0.5, np.random.default_rng(1))
    out = tmp_path / "k"
    facts = emitted_kernel(str(tmp_path), a, reordered_tiles(a, 2), "x", 0.5, 32, "sm_90", out, compile_=False,
                           verify=False, measured=lambda spec, cubin, results: {"full_time_us": 1.0})
    assert "compile" not in facts and "full_time_us" not in facts and not (out / "kernel.cubin").exists()


def test_kernel_json_is_strict_json_and_the_directory_carries_its_checksums(tmp_path):
    import hashlib

    from lospmm.files import MANIFEST, manifest_problem
    from lospmm.loader import KernelDirError, SpMM

    a = random_pruned(32, 32, 0.8, np.random.default_rng(2))
    out = tmp_path / "k"
    emitted_kernel(str(tmp_path), a, reordered_tiles(a, 4), "x", 0.8, 32, "sm_90", out,
                   measured=lambda spec, cubin, results: {"full_time_us": float("nan"), "speedup_vs_dense": float("nan")})

    def no_constants(name):
        raise ValueError(f"bare {name} in kernel.json")

    facts = json.loads((out / "kernel.json").read_text(), parse_constant=no_constants)  # as strict parsers read it
    assert facts["full_time_us"] is None and facts["speedup_vs_dense"] is None
    listed = dict(line.split("  ")[::-1] for line in (out / MANIFEST).read_text().splitlines())
    assert set(listed) == {"kernel.cu", "kernel.cubin", "kernel.json", "weight.parquet"}
    assert all(hashlib.sha256((out / f).read_bytes()).hexdigest() == h for f, h in listed.items())
    assert manifest_problem(out) is None
    data = bytearray((out / "kernel.cubin").read_bytes())
    data[100] ^= 1
    (out / "kernel.cubin").write_bytes(bytes(data))
    assert "kernel.cubin does not match" in manifest_problem(out)
    with pytest.raises(KernelDirError, match="kernel.cubin does not match"):  # the loader checks before it loads
        SpMM(out)


def test_a_kernel_written_over_another_never_vouches_for_the_old_files(tmp_path):
    from lospmm.loader import KernelDirError, SpMM

    out = tmp_path / "k"
    a = random_pruned(32, 32, 0.8, np.random.default_rng(3))
    emitted_kernel(str(tmp_path), a, reordered_tiles(a, 4), "a", 0.8, 32, "sm_90", out, verify=False)
    b = random_pruned(48, 32, 0.8, np.random.default_rng(4))
    emitted_kernel(str(tmp_path), b, reordered_tiles(b, 4), "b", 0.8, 32, "sm_90", out, compile_=False, verify=False)
    assert not (out / "kernel.cubin").exists()  # A's cubin is gone, not left beside B's kernel.json
    with pytest.raises(KernelDirError, match="does not list kernel.cubin"):
        SpMM(out)


def test_a_kernel_directory_of_another_design_records_its_launch_and_loads_padded(tmp_path):
    """kernel.json carries the design and its launch layout; the loader reads them, and a kernel of
    4 columns per thread serves an N that is no multiple of 4 (B and C padded for the launch)."""
    from lospmm.loader import load_kernel
    from lospmm.kernel.design import design_named
    from lospmm.kernel.layout import LaunchLayout

    a = random_pruned(24, 40, 0.7, np.random.default_rng(3))
    design = design_named("chained,v=4,walks=2,column-x")
    facts = emitted_kernel(str(tmp_path), a, reordered_tiles(a, 4), "x", 0.7, 32, "sm_90", tmp_path / "k",
                           verify=False, design=design)
    assert facts["design"]["label"] == design.label and facts["compile"]["status"] == "ok"
    layout = LaunchLayout.of_facts(facts)
    assert (layout.columns_per_thread, layout.column_walks, layout.order) == (4, 2, "column-x")
    spmm = load_kernel(tmp_path / "k", backend="host")
    assert spmm.layout == layout
    b = np.random.default_rng(4).standard_normal((40, 7)).astype(np.float32)
    np.testing.assert_allclose(spmm(b), a @ b, rtol=1e-5, atol=1e-5)


def test_a_half_kernel_directory_is_checked_and_served_in_its_dtype_alone(tmp_path):
    """`lospmm kernel --dtype fp16|bf16`'s directory: A rounded to the dtype (weight.parquet holds the
    rounded A), the host check against the same rounded product, and the loader's host backend
    taking arrays of the kernel's dtype only (no silent conversion)."""
    torch = pytest.importorskip("torch")
    from lospmm.loader import load_kernel
    from lospmm.sparse_file import read_matrix
    from lospmm.kernel.design import half_design
    from lospmm.kernel.numbers import NumberFormat, from_dtype_bits, to_dtype_bits

    a = random_pruned(40, 56, 0.8, np.random.default_rng(3))
    a.data[0] = 1e-9  # rounds to zero in fp16: counted, not baked
    b64 = np.random.default_rng(4).standard_normal((56, 9))
    for precision in (NumberFormat.half("fp16"), NumberFormat.half("bf16", "f32")):
        out = tmp_path / precision.label
        facts = emitted_kernel(str(tmp_path), a, reordered_tiles(a, 4), "enc.0", 0.8, 32, "sm_90", out,
                               design=half_design(precision))
        check = facts["host_check"]
        assert check["status"] == "ok" and 0 < check["normalised_error"] <= check["bound"] < 0.05
        assert facts["precision"]["dtype"] == precision.dtype and facts["launch"]["columns_per_thread"] == 2
        rounded = read_matrix(out / "weight.parquet")
        assert rounded.nnz == a.nnz - (facts["rounding"]["to_zero"])
        assert facts["rounding"]["to_zero"] == (1 if precision.dtype == "fp16" else 0)
        spmm = load_kernel(out, backend="host")
        torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision.dtype]
        b = torch.from_numpy(b64).to(torch_dtype)
        c = spmm(b)  # 9 columns: padded to the kernel's even N and cut back
        assert c.dtype == torch_dtype and tuple(c.shape) == (40, 9)
        bits = to_dtype_bits(b64, precision.dtype)
        want = rounded.toarray().astype(np.float64) @ from_dtype_bits(bits, precision.dtype)
        assert np.abs(c.double().numpy() - want).max() <= 0.02 * np.abs(want).max()
        with pytest.raises(ValueError, match="enc.0: .*dtype"):
            spmm(b.float())  # an fp32 B for a half kernel is refused, naming the layer
    fp16 = load_kernel(tmp_path / "fp16-packed", backend="host")
    c = fp16(b64.astype(np.float16))
    assert c.dtype == np.float16 and c.shape == (40, 9)


def test_a_bias_is_read_only_from_the_weights_file_the_run_searched(tmp_path):
    from lospmm.flows.kernels import checked_unchanged
    from lospmm.files import file_sha256

    path = tmp_path / "w.safetensors"
    path.write_bytes(b"one")
    sha = file_sha256(path)
    checked_unchanged(str(path), sha)  # the same file: fine
    path.write_bytes(b"two")
    with pytest.raises(ValueError, match="w.safetensors: the weights file changed since the run started"):
        checked_unchanged(str(path), sha)


def test_an_nm_kernel_directory_is_checked_and_served_from_its_weight(tmp_path):
    """The N:M kernel's directory: compiled, checked on the host as cooperative blocks with its
    compressed A filled in, and served by the loader, which fills the module's data from
    weight.parquet (numpy and torch CPU inputs; an N no multiple of 4)."""
    from lospmm.kernel.choices import NM_DESIGN
    from lospmm.kernel.epilogue import Epilogue
    from lospmm.kernel.nm import NMTiling
    from lospmm.loader import load_kernel
    from lospmm.stages.prune import NMPattern, random_nm_pruned

    a = random_nm_pruned(40, 64, NMPattern(4, 32, 8), np.random.default_rng(5))
    epilogue = Epilogue(tuple(np.linspace(-0.5, 0.5, 40).tolist()), "relu")
    facts = emitted_kernel(str(tmp_path), a, reordered_tiles(a, 4), "fc", 0.875, 32, "sm_90", tmp_path / "k",
                           design=NM_DESIGN, epilogue=epilogue, nm=NMTiling(4, 32, 8, 32, 64, 8, 4))
    assert facts["compile"]["status"] == "ok" and facts["host_check"]["status"] == "ok"
    assert facts["nm"]["label"] == "4:32:8,32x64,8x4" and facts["row_order"] == []
    spmm = load_kernel(tmp_path / "k", backend="host")
    b = np.random.default_rng(6).standard_normal((64, 7)).astype(np.float32)
    want = np.maximum(a @ b + np.asarray(epilogue.bias, np.float32)[:, None], 0)
    np.testing.assert_allclose(spmm(b), want, rtol=1e-5, atol=1e-5)
    torch = pytest.importorskip("torch")
    np.testing.assert_allclose(spmm(torch.from_numpy(b)).numpy(), want, rtol=1e-5, atol=1e-5)
    # each module global's bytes beside it for a C++ loader (cuModuleGetGlobal + cuMemcpyHtoD), in the
    # manifest: one altered is refused like any file of the package
    from lospmm.kernel.package import KernelDirError, read_package

    spec = read_package(tmp_path / "k").spec
    listed = (tmp_path / "k" / "SHA256SUMS").read_text()
    for symbol, array in spec.module_data(a).items():
        path = tmp_path / "k" / f"{symbol}.bin"
        assert path.read_bytes() == array.tobytes() and f"  {symbol}.bin\n" in listed
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(KernelDirError, match=f"{symbol}.bin"):
        read_package(tmp_path / "k")
    # emitting again there clears the globals' files, not a user's own .bin beside them
    from lospmm.kernel.package import cleared

    (tmp_path / "k" / "notes.bin").write_bytes(b"mine")
    cleared(tmp_path / "k")
    assert [p.name for p in (tmp_path / "k").iterdir()] == ["notes.bin"]


def test_a_half_nm_kernel_directory_is_its_exact_model_and_served_in_its_dtype(tmp_path):
    """An fp16 N:M kernel (packed sums): A rounded to fp16 in weight.parquet, checked on the host against
    the exact model, served by the loader on float16 numpy input (module data from weight.parquet)."""
    from lospmm.kernel.check import kernel_reference
    from lospmm.kernel.design import design_named
    from lospmm.kernel.nm import NMTiling
    from lospmm.kernel.numbers import rounded_matrix
    from lospmm.loader import load_kernel
    from lospmm.stages.prune import NMPattern, random_nm_pruned

    a = random_nm_pruned(40, 64, NMPattern(2, 4, 8), np.random.default_rng(7))
    design = design_named("nm,fp16")
    facts = emitted_kernel(str(tmp_path), a, None, "fc", 0.5, 0, "sm_90", tmp_path / "k", design=design,
                           nm=NMTiling(2, 4, 8, 32, 64, 8, 4))
    assert facts["compile"]["status"] == "ok" and facts["host_check"]["status"] == "ok"
    assert facts["host_check"]["metric"] == "normalised_error"
    spmm = load_kernel(tmp_path / "k", backend="host")
    a16, _ = rounded_matrix(a, "fp16")
    b = np.random.default_rng(8).standard_normal((64, 9)).astype(np.float16)
    got = spmm(b)
    assert got.dtype == np.float16
    want = kernel_reference(a16, b.view(np.uint16), design.number)
    np.testing.assert_array_equal(got.view(np.uint16), want)


def test_a_served_kernel_that_fails_gives_way_to_the_searched_one(tmp_path, monkeypatch):
    """emitted_layer: the N:M kernel wins the estimate on a vector-wise 16:32 layer; when it cannot be
    emitted, the layer is served by the baked kernel of the searched tile, its row saying why."""
    import logging

    import lospmm.flows.kernels as fk
    from lospmm.devices import DEVICES
    from lospmm.kernel.estimate import EstimateTimer
    from lospmm.stages.emit import EmitParams
    from lospmm.stages.prune import NMPattern, random_nm_pruned

    a = random_nm_pruned(256, 256, NMPattern(16, 32, 8), np.random.default_rng(0))
    tiles = {8: reordered_tiles(a, 8)}
    timed = [{"model": "m", "layer": "fc", "op": "linear", "m": 256, "n": 4096, "k": 256, "repeat": 1,
              "sparsity": 0.5, "m1": 8, "n1": 128, "time_us": 10.0, "status": "ok", "message": ""}]
    timer = EstimateTimer(DEVICES["h100"])
    real = fk.emitted_kernel

    def flaky(*args, nm=None, **kwargs):
        if nm is not None:
            raise ValueError("boom")
        return real(*args, nm=nm, **kwargs)

    row = fk.emitted_layer(str(tmp_path), tmp_path / "served", timed, a, tiles, timer, "sm_90", EmitParams(),
                           logging.getLogger("test"))
    assert row["status"] == "ok" and row["design"].startswith("nm ") and row["message"] == ""
    # every way it could be served, ranked, the served first: the baked tile and each N:M blocking
    priced = row["designs_priced"].split("; ")
    assert priced[0].startswith(row["design"] + ": ") and any(p.startswith("8×128: ") for p in priced)
    assert len(priced) == 1 + len([p for p in priced if p.startswith("nm ")]) > 2
    monkeypatch.setattr(fk, "emitted_kernel", flaky)
    row = fk.emitted_layer(str(tmp_path), tmp_path / "fallback", timed, a, tiles, timer, "sm_90", EmitParams(),
                           logging.getLogger("test"))
    assert row["status"] == "ok" and row["design"] == "8×128" and row["runner_up"].startswith("nm ")
    assert "failed (ValueError: boom); served 8×128 instead" in row["message"]
    assert row["check"] == "host-asan"


def test_design_auto_on_the_estimate_takes_the_cheapest_tile_and_design_of_the_timed_ones(tmp_path):
    """Under the estimate timer `--design auto` prices every timed tile in every candidate design: the
    layer is served by the cheapest of them all, which need not be the fastest proxy's tile."""
    import logging

    import lospmm.flows.kernels as fk
    from lospmm.devices import DEVICES
    from lospmm.kernel.choices import DESIGN_CANDIDATES, served_options
    from lospmm.kernel.design import BASELINE
    from lospmm.kernel.estimate import EstimateTimer
    from lospmm.stages.emit import EmitParams

    a = random_pruned(512, 512, 0.9, np.random.default_rng(4))
    tiles = {m1: reordered_tiles(a, m1) for m1 in (2, 16)}
    row = {"model": "m", "layer": "fc", "op": "linear", "m": 512, "n": 2048, "k": 512, "repeat": 1, "sparsity": 0.9,
           "status": "ok", "message": ""}
    timed = [row | {"m1": 2, "n1": 128, "time_us": 5.0}, row | {"m1": 16, "n1": 256, "time_us": 6.0}]
    timer = EstimateTimer(DEVICES["h100"])
    everything = [o for m1, n1 in ((2, 128), (16, 256))
                  for o in served_options(a, tiles[m1], 512, 512, 2048, n1, BASELINE, timer.device,
                                          designs=DESIGN_CANDIDATES)]
    want = min(everything, key=lambda o: o.estimate_us)
    got = fk.emitted_layer(str(tmp_path), tmp_path / "k", timed, a, tiles, timer, "sm_90",
                           EmitParams(designs=DESIGN_CANDIDATES, verify=False), logging.getLogger("test"))
    assert got["status"] == "ok", got["message"]
    assert got["design"] == want.label and (got["m1"], got["n1"]) == (want.m1, want.n1)
    assert got["design_estimate_us"] == pytest.approx(want.estimate_us)
    assert got["chosen_by"].endswith("tile and design by the estimate")
    # the row's proxy time is the served tile's proxy, not the fastest proxy's (as kernel.json says)
    proxy = {(2, 128): 5.0, (16, 256): 6.0}[(want.m1, want.n1)]
    facts = json.loads((tmp_path / "k" / "kernel.json").read_text())
    assert got["proxy_time_us"] == facts["proxy_time_us"] == proxy
    # without designs searched, the fastest proxy's tile in the run's design, as before
    plain = fk.emitted_layer(str(tmp_path), tmp_path / "p", timed, a, tiles, timer, "sm_90", EmitParams(verify=False),
                             logging.getLogger("test"))
    assert (plain["m1"], plain["n1"], plain["design"]) == (2, 128, "2×128")


def test_when_the_fallback_fails_too_the_row_says_both(tmp_path, monkeypatch):
    import logging

    import lospmm.flows.kernels as fk
    from lospmm.devices import DEVICES
    from lospmm.kernel.estimate import EstimateTimer
    from lospmm.stages.emit import EmitParams
    from lospmm.stages.prune import NMPattern, random_nm_pruned

    a = random_nm_pruned(256, 256, NMPattern(16, 32, 8), np.random.default_rng(0))
    timed = [{"model": "m", "layer": "fc", "op": "linear", "m": 256, "n": 4096, "k": 256, "repeat": 1,
              "sparsity": 0.5, "m1": 8, "n1": 128, "time_us": 10.0, "status": "ok", "message": ""}]

    def broken(*args, nm=None, **kwargs):
        raise ValueError("the N:M kernel" if nm is not None else "the baked kernel")

    monkeypatch.setattr(fk, "emitted_kernel", broken)
    row = fk.emitted_layer(str(tmp_path), tmp_path / "k", timed, a, {8: reordered_tiles(a, 8)},
                           EstimateTimer(DEVICES["h100"]), "sm_90", EmitParams(), logging.getLogger("test"))
    assert row["status"] == "error" and row["design"] == "8×128"
    assert "failed (ValueError: the N:M kernel); served 8×128 instead; ValueError: the baked kernel" in row["message"]


def test_a_measuring_timer_serves_the_fastest_measured_of_the_estimates_cheapest(tmp_path, monkeypatch):
    """Where the timer measures, emit times the full kernels of the estimate's few cheapest ways to
    serve the layer (and the fastest proxy's) and serves the fastest measured, its directory holding
    that kernel; the estimate only prunes. A stand-in timer plays a device that disagrees with the
    estimate."""
    import dataclasses
    import json
    import logging

    import lospmm.flows.kernels as fk
    from lospmm.devices import DEVICES
    from lospmm.kernel.estimate import EstimateTimer
    from lospmm.kernel.timing import Timing
    from lospmm.stages.emit import measured_contenders
    from lospmm.status import Status

    a, tiles, timed, params, options = _auto_layer()
    cheapest = measured_contenders(options, params.measure_designs, params.measure_within)
    assert len(cheapest) == 3 and options[0] not in cheapest, [(o.label, o.estimate_us) for o in options]
    contenders = cheapest + [options[0]]  # and the fastest proxy's kernel, which the estimate left out
    target = contenders[1]  # the device's favourite: the estimate's second

    @dataclasses.dataclass(frozen=True)
    class Device(EstimateTimer):
        name: str = "device"
        measures: bool = True
        launches: list = dataclasses.field(default_factory=list)
        dense_calls: list = dataclasses.field(default_factory=list)

        def time(self, launch):
            self.launches.append(launch.spec.design.label)
            return Timing(self.name, 1.0 if launch.spec.design == target.design else 2.0, Status.OK)

        def dense(self, m, k, n, dtype="fp32"):
            self.dense_calls.append(dtype)
            return Timing(self.name, 50.0, Status.OK)

    def served(where, timer=None, p=params):
        timer = timer or Device(DEVICES["h100"])
        return fk.emitted_layer(str(tmp_path), tmp_path / where, timed, a, tiles, timer, "sm_90", p,
                                logging.getLogger("test")), timer

    row, timer = served("k")
    assert row["status"] == "ok", row["message"]
    assert row["design"] == target.label and row["full_time_us"] == 1.0 and row["dense_time_us"] == 50.0
    assert row["runner_up"] == contenders[0].label  # a tie at 2.0 µs goes to the lower estimate
    assert row["designs_measured"] == "; ".join(f"{c.label}: {1.0 if c is target else 2.0:.2f} µs" for c in contenders)
    assert row["chosen_by"].endswith("tile and design by the device among the estimate's 3 cheapest and the "
                                     "fastest proxy's kernel")
    # each contender timed once and the dense GEMM once; the directory holds the kernel served, whole,
    # saying how it was chosen, and no contender's directory is left beside it
    assert timer.launches == [c.design.label for c in contenders] and timer.dense_calls == ["fp32"]
    facts = json.loads((tmp_path / row["kernel_dir"] / "kernel.json").read_text())
    assert facts["design"]["label"] == target.design.label and facts["chosen_by"] == row["chosen_by"]
    assert facts["full_time_us"] == 1.0 and read_package(tmp_path / "k", ("kernel.json", "kernel.cubin")).spec.design == target.design
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".k")) == []
    # one way measured at most: the estimate's choice, as before
    one, _ = served("one", p=dataclasses.replace(params, measure_designs=1))
    assert one["design"] == cheapest[0].label and one.get("designs_measured") is None

    # the fastest fails its emission: the next fastest is served, and the runner-up is another that ran
    real = fk.emitted_kernel

    def failing(bad):
        def emitted_kernel(*args, design=None, **kwargs):
            if design in bad:
                raise ValueError(f"no {design.label}")
            return real(*args, design=design, **kwargs)
        return emitted_kernel

    monkeypatch.setattr(fk, "emitted_kernel", failing({target.design}))
    row, _ = served("k2")
    assert row["status"] == "ok" and row["design"] == contenders[0].label and row["runner_up"] == contenders[2].label
    assert f"{target.label}: failed (ValueError: no {target.design.label})" in row["designs_measured"]
    assert json.loads((tmp_path / "k2" / "kernel.json").read_text())["design"]["label"] == contenders[0].design.label
    # every one fails: the fastest proxy's kernel is the fallback, its failure said with the first's
    monkeypatch.setattr(fk, "emitted_kernel", failing({c.design for c in contenders}))
    row, _ = served("k3")
    assert row["status"] == "error" and f"{cheapest[0].label} failed (ValueError: no " in row["message"]
    assert f"served {options[0].label} instead; ValueError: no {options[0].design.label}" in row["message"]
    assert not any(p.name.startswith(".k3") for p in tmp_path.iterdir())


def test_a_kernel_that_faults_on_the_device_is_remembered_and_a_retry_gets_past_it(tmp_path, monkeypatch):
    """A fault loses the process's CUDA context: the faulting contender is recorded (faults.jsonl), the
    layer's row is transient (every launch after it would fail), and the retry in a fresh process skips
    the faulting kernel and serves the fastest of the others."""
    import dataclasses
    import logging

    import lospmm.flows.kernels as fk
    from lospmm.devices import DEVICES
    from lospmm.flows.storage.faults import faulted
    from lospmm.kernel.estimate import EstimateTimer
    from lospmm.kernel.timing import Timing
    from lospmm.stages.emit import measured_contenders
    from lospmm.status import Status

    a, tiles, timed, params, options = _auto_layer()
    contenders = measured_contenders(options, 3, 1.5)
    bad = contenders[1]

    @dataclasses.dataclass(frozen=True)
    class Device(EstimateTimer):  # runs binaries, as the cuda timer: checked and timed "on the device"
        name: str = "device"
        measures: bool = True
        runs_binary: bool = True

        def time(self, launch):
            return Timing(self.name, 1.0 + contenders.index(next(c for c in contenders
                                                                  if c.design == launch.spec.design)), Status.OK)

        def checked(self, spec, cubin, matrix, count):
            return None

    lost = []
    real = fk.emitted_kernel

    def emitted_kernel(*args, design=None, **kwargs):
        if lost:
            raise AssertionError("nothing launches after the context is lost")
        if design == bad.design:
            lost.append("cuCtxSynchronize: CUDA_ERROR_ILLEGAL_ADDRESS")
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(*args, design=design, **kwargs)

    monkeypatch.setattr(fk, "emitted_kernel", emitted_kernel)
    monkeypatch.setattr(fk, "context_lost", lambda probe=False: lost[0] if lost else "")
    timer = Device(DEVICES["h100"])
    row = fk.emitted_layer(str(tmp_path), tmp_path / "k", timed, a, tiles, timer, "sm_90", params,
                           logging.getLogger("test"))
    assert row["status"] == "error" and row.get("transient") and "the CUDA context was lost" in row["message"]
    assert list(faulted(tmp_path).values()) == ["RuntimeError: CUDA error: an illegal memory access was encountered"]
    lost.clear()  # a fresh process
    row = fk.emitted_layer(str(tmp_path), tmp_path / "k", timed, a, tiles, timer, "sm_90", params,
                           logging.getLogger("test"))
    assert row["status"] == "ok" and row["design"] == contenders[0].label
    assert f"{bad.label}: failed (ValueError: faulted on the device before (RuntimeError: CUDA error" \
        in row["designs_measured"]


def _auto_layer():
    """A 128×512 layer at 0.9 with one timed tile, `--design auto`'s emit parameters (no host check)
    and the ways to serve it, priced: what the measuring-timer tests serve (small, as they compile each
    contender; 256 rows kept the same order of the estimate's choices at twice the compile time)."""
    from lospmm.devices import DEVICES
    from lospmm.kernel.choices import DESIGN_CANDIDATES, served_options
    from lospmm.kernel.design import BASELINE
    from lospmm.stages.emit import EmitParams

    a = random_pruned(128, 512, 0.9, np.random.default_rng(6))
    tiles = {8: reordered_tiles(a, 8)}
    timed = [{"model": "m", "layer": "fc", "op": "linear", "m": 128, "n": 2048, "k": 512, "repeat": 1,
              "sparsity": 0.9, "m1": 8, "n1": 128, "time_us": 5.0, "status": "ok", "message": ""}]
    params = EmitParams(designs=DESIGN_CANDIDATES, verify=False)
    return a, tiles, timed, params, served_options(a, tiles[8], 128, 512, 2048, 128, BASELINE, DEVICES["h100"],
                                                   designs=DESIGN_CANDIDATES)


def test_designs_priced_lists_each_design_once_at_its_best_tile_in_the_emit_stages_order():
    import lospmm.flows.kernels as fk
    from lospmm.kernel.choices import NM_DESIGN, Served
    from lospmm.kernel.design import design_named

    baseline, chained = design_named("baseline"), design_named("chained")
    options = [Served("8×128", 10.0, baseline, m1=8, n1=128, price_us=12.0),
               Served("4×128", 9.0, baseline, m1=4, n1=128, price_us=11.0),
               Served("8×128 chained", 10.0, chained, m1=8, n1=128, price_us=9.5),
               Served("nm 2:4,a", 20.0, NM_DESIGN, nm=object()), Served("nm 2:4,b", 30.0, NM_DESIGN, nm=object())]
    assert fk.designs_priced(options) == ("8×128 chained: 10 / 9.5 µs; 4×128: 9 / 11 µs; nm 2:4,a: 20 / 20 µs; "
                                          "nm 2:4,b: 30 / 30 µs")


def test_a_half_runs_nm_convolution_is_served_by_its_implicit_conv_kernel(tmp_path):
    """A convolution in an fp16 run whose A holds 8:32 in vectors of 32 (no sparse tensor-core form): the
    N:M kernel's implicit-im2col form in fp16 is priced below the tiled im2col GEMM and served (form
    implicit-conv); the loader runs it on an NCHW fp16 X, and its output is the exact model's of
    A · im2col(X). Without the N:M kernel the layer is the tiled half kernel's implicit-im2col form, and
    its output the same exact model's."""
    import logging

    import lospmm.flows.kernels as fk
    from lospmm.devices import DEVICES
    from lospmm.kernel.check import im2col, kernel_reference, nchw_as_gemm
    from lospmm.kernel.design import design_named
    from lospmm.kernel.estimate import EstimateTimer
    from lospmm.kernel.geometry import ConvGeometry
    from lospmm.kernel.numbers import rounded_matrix
    from lospmm.loader import SpConv, load_kernel
    from lospmm.stages.emit import EmitParams
    from lospmm.stages.prune import NMPattern, random_nm_pruned

    geometry = ConvGeometry(cin=32, h=8, w=8, kh=3, kw=3, pad=1)
    a = random_nm_pruned(64, geometry.k, NMPattern(8, 32, 32), np.random.default_rng(5))
    tiles = {8: reordered_tiles(a, 8)}
    timed = [{"model": "m", "layer": "conv", "op": "conv", "m": 64, "n": 2 * geometry.pixels, "k": geometry.k,
              "repeat": 1, "sparsity": 0.75, "m1": 8, "n1": 128, "time_us": 10.0, "status": "ok", "message": ""}]
    timer, fp16 = EstimateTimer(DEVICES["h100"]), design_named("fp16")
    row = fk.emitted_layer(str(tmp_path), tmp_path / "k", timed, a, tiles, timer, "sm_90", EmitParams(),
                           logging.getLogger("test"), conv=geometry, design=fp16)
    assert row["status"] == "ok", row["message"]
    assert row["form"] == "implicit-conv" and row["design"].startswith("nm ") and row["check"] == "host-asan"
    assert row["runner_up"] and "8×128: " in row["designs_priced"]  # the tiled im2col GEMM, priced beside it
    conv = load_kernel(tmp_path / "k", backend="host")
    assert isinstance(conv, SpConv) and conv.spec.dtype == "fp16"
    x = np.random.default_rng(6).standard_normal((2, 32, 8, 8)).astype(np.float16)
    y = conv(x)
    assert y.dtype == np.float16 and y.shape == (2, 64, 8, 8)
    want = kernel_reference(rounded_matrix(a, "fp16")[0], im2col(x.view(np.uint16), geometry), conv.spec.number)
    np.testing.assert_array_equal(nchw_as_gemm(y.view(np.uint16)), want)
    plain = fk.emitted_layer(str(tmp_path), tmp_path / "g", timed, a, tiles, timer, "sm_90", EmitParams(nm_kernel=False),
                             logging.getLogger("test"), conv=geometry, design=fp16)
    assert plain["status"] == "ok" and (plain["form"], plain["design"]) == ("implicit-conv", "8×128")
    tiled = load_kernel(tmp_path / "g", backend="host")  # the tiled half kernel's conv form: its pair two pixels
    assert isinstance(tiled, SpConv) and tiled.spec.design == fp16 and tiled.spec.layout.columns_per_thread == 2
    np.testing.assert_array_equal(nchw_as_gemm(tiled(x).view(np.uint16)), want)  # the same sums, in column order


def test_a_measured_im2col_gemm_of_a_convolution_is_compared_with_its_unfolding(tmp_path):
    """Where the device decides among a convolution's ways to serve it, the sparse tensor cores' im2col GEMM
    is timed as its kernel, but served after the unfolding that the implicit-im2col kernels beside it do
    not pay: its estimated unfolding (EstimateTimer.unfold_us, the price it was ranked by) is added to its
    measured time before the pick, and said in designs_measured. A kernel twice as fast as the implicit
    ones is then not served for that alone."""
    import dataclasses
    import logging

    import lospmm.flows.kernels as fk
    from lospmm.devices import DEVICES
    from lospmm.kernel.design import design_named
    from lospmm.kernel.estimate import EstimateTimer, estimate_timer
    from lospmm.kernel.geometry import ConvGeometry
    from lospmm.kernel.timing import Timing
    from lospmm.stages.emit import EmitParams
    from lospmm.stages.prune import NMPattern, random_nm_pruned
    from lospmm.status import Status

    geometry = ConvGeometry(cin=256, h=7, w=7, kh=1, kw=1)
    a = random_nm_pruned(64, geometry.k, NMPattern(2, 4), np.random.default_rng(5))
    n = 4 * geometry.pixels
    timed = [{"model": "m", "layer": "conv", "op": "conv", "m": 64, "n": n, "k": geometry.k, "repeat": 1,
              "sparsity": 0.5, "m1": 4, "n1": 128, "time_us": 10.0, "status": "ok", "message": ""}]

    @dataclasses.dataclass(frozen=True)
    class Device(EstimateTimer):
        name: str = "device"
        measures: bool = True

        def time(self, launch):  # the tensor cores' GEMM twice as fast as anything else
            return Timing(self.name, 1.0 if launch.spec.design.accumulate == "mma" else 2.0, Status.OK)

        def dense(self, m, k, n, dtype="fp32"):
            return Timing(self.name, 50.0, Status.OK)

    params = EmitParams(measure_designs=6, measure_within=100.0)
    row = fk.emitted_layer(str(tmp_path), tmp_path / "k", timed, a, {4: reordered_tiles(a, 4)}, Device(DEVICES["h100"]),
                           "sm_90", params, logging.getLogger("test"), conv=geometry, design=design_named("fp16"))
    assert row["status"] == "ok", row["message"]
    unfold = estimate_timer(DEVICES["h100"]).unfold_us(geometry.k, n, 2)
    assert unfold > 1.0 and "mma" in row["designs_measured"]  # the GEMM was among those measured
    assert f"{1.0 + unfold:.2f} µs (with {unfold:.2f} µs of unfolding, ESTIMATED)" in row["designs_measured"]
    assert row["form"] == "implicit-conv" and row["full_time_us"] == 2.0 and "mma" not in row["design"]
    assert np.isnan(row["unfold_us"])  # served in its implicit form: nothing to unfold


def test_a_convolution_served_as_its_im2col_gemm_shows_the_unfolding_it_was_chosen_with(tmp_path):
    """The estimate serves a 1×1 convolution's 2:4 A in fp16 by the sparse tensor cores' im2col GEMM,
    priced with X's unfolding. The kernel's time stays the kernel's; the unfolding goes beside it
    (10_kernels' unfold_us), and the run summary shows both, the unfolding marked as estimated."""
    import io
    import logging

    import pyarrow as pa
    from rich.console import Console

    import lospmm.flows.kernels as fk
    from lospmm.devices import DEVICES
    from lospmm.flows.reports.inspection import summary_table
    from lospmm.flows.storage.store import write_artifact
    from lospmm.kernel.design import design_named
    from lospmm.kernel.estimate import estimate_timer
    from lospmm.kernel.geometry import ConvGeometry
    from lospmm.stages.emit import EmitParams
    from lospmm.stages.prune import NMPattern, random_nm_pruned

    geometry = ConvGeometry(cin=464, h=7, w=7, kh=1, kw=1)
    a = random_nm_pruned(1024, geometry.k, NMPattern(2, 4), np.random.default_rng(5))
    n = 4 * geometry.pixels
    timed = [{"model": "m", "layer": "conv5", "op": "conv", "m": 1024, "n": n, "k": geometry.k, "repeat": 1,
              "sparsity": 0.5, "m1": 4, "n1": 128, "time_us": 10.0, "status": "ok", "message": ""}]
    estimate = estimate_timer(DEVICES["h100"])
    row = fk.emitted_layer(str(tmp_path), tmp_path / "k", timed, a, {4: reordered_tiles(a, 4)}, estimate, "sm_90",
                           EmitParams(), logging.getLogger("test"), conv=geometry, design=design_named("fp16"))
    assert row["status"] == "ok", row["message"]
    unfold = estimate.unfold_us(geometry.k, n, 2)
    assert (row["form"], row["unfold_us"]) == ("gemm", pytest.approx(unfold)) and "mma" in row["design"]
    assert row["full_time_us"] < row["design_estimate_us"] == pytest.approx(row["full_time_us"] + unfold)

    summary = {"model": "m", "layer": "conv5", "sparsity": 0.5, "status": "ok", "candidates": 1, "after_constrain": 1,
               "after_rank": 1, "timed": 1, "m1": 4, "n1": 128, "dtype": "fp16", "timer": "estimate",
               "time_us": row["full_time_us"], "unfold_us": row["unfold_us"], "speedup_vs_dense": float("nan"),
               "compile_seconds": 0.5, "emit_seconds": 2.0, "search_seconds": 4.0}
    write_artifact(tmp_path / "summary" / "r.parquet", pa.Table.from_pylist([summary]), {"stage": "summary"})
    out = io.StringIO()
    Console(file=out, width=250).print(summary_table(str(tmp_path), {"summary": "summary/r.parquet"}))
    line = next(l for l in out.getvalue().splitlines() if l.startswith("│") and "conv5" in l)
    assert line.split("│")[12].strip() == f"{row['full_time_us']:.1f} +{unfold:.1f} unfold (est.)"

    # an --im2col run gives emit no geometry: its convolutions are GEMMs, and pay the unfolding too; a linear layer none
    from lospmm.stages.prune import random_pruned

    small = random_pruned(32, 64, 0.8, np.random.default_rng(1))
    for op, want in (("conv", estimate.unfold_us(64, 196, 4)), ("linear", None)):
        timed = [{"model": "m", "layer": op, "op": op, "m": 32, "n": 196, "k": 64, "repeat": 1, "sparsity": 0.8,
                  "m1": 4, "n1": 32, "time_us": 1.0, "status": "ok", "message": ""}]
        row = fk.emitted_layer(str(tmp_path), tmp_path / op, timed, small, {4: reordered_tiles(small, 4)}, estimate,
                               "sm_90", EmitParams(nm_kernel=False), logging.getLogger("test"))
        assert row["status"] == "ok" and row["form"] == "gemm", row["message"]
        assert row["unfold_us"] == pytest.approx(want) if want else np.isnan(row["unfold_us"])


def test_a_layer_is_named_whole_or_by_text_only_it_contains():
    from lospmm.flows.kernels import layer_asked

    layers = ["enc.0.query", "enc.0.key", "enc.1.query", "enc.1.key", "fc"]
    assert layer_asked(layers, "enc.0.key") == "enc.0.key"
    assert layer_asked(layers, "1.qu") == "enc.1.query"  # as inspect --layer matches
    assert layer_asked(layers, "fc") == "fc"
    with pytest.raises(LookupError, match=r"'query' is in 2 layers' names: enc.0.query, enc.1.query; give one whole"):
        layer_asked(layers, "query")
    with pytest.raises(LookupError, match=r"'conv' is not in the run; its 5 layers: enc.0.query, .*, fc$"):
        layer_asked(layers, "conv")
    many = [f"block.{i}" for i in range(30)]
    with pytest.raises(LookupError, match=r"block.11 and 18 more \(lospmm inspect RUN --stage prune lists them\)"):
        layer_asked(many, "block")


def test_lospmm_kernel_takes_a_tile_exactly_where_the_search_would_have_tried_it():
    """tile_problem (lospmm kernel's --m1/--n1 check) and the constrain stage share one N1 rule
    (constrain.design_n1s): every N1 the search tries passes, any other is refused with its reason."""
    from lospmm.devices import device_named
    from lospmm.flows.kernels import tile_problem
    from lospmm.kernel.design import design_named
    from lospmm.stages.constrain import constrained_candidates
    from lospmm.stages.reorder import TileStats

    h100 = device_named("h100")
    stats = {4: TileStats(100, 50, 40.0, 4000, 30, 0.1)}
    for label in ("baseline", "chained,v=4", "staged,tiles=8", "staged,tiles=4,warps=4", "chained,slices=4"):
        design = design_named(label)
        # the N1 the search tries, less a block the design cannot launch (registers are ptxas's to say)
        searched = {c.n1 for c in constrained_candidates(4096, stats, h100, design=design)
                    if not design.block_problem(4, c.n1)}
        assert searched
        for n1 in range(16, 1100, 16):
            if n1 in searched:
                tile_problem(design, 4, n1, h100)
            else:
                with pytest.raises(ValueError, match=f"^--(n1|m1 4 --n1) {n1}"):
                    tile_problem(design, 4, n1, h100)
    with pytest.raises(ValueError, match=r"^--n1 64: design staged,tiles=8 has N1 = 32"):
        tile_problem(design_named("staged,tiles=8"), 4, 64, h100)
    with pytest.raises(ValueError, match=r"^--m1 4 --n1 512: 4 slices × N1 = 512: 2048 threads a block, over 1024"):
        tile_problem(design_named("chained,slices=4"), 4, 512, h100)
