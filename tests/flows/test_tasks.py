"""The stage adapters run in this process (no Prefect): one identity per layer, emitted kernel
directories checked before reuse, transient failures retried and never served, as the flow runs them."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from safetensors.numpy import save_file

from lospmm.flows.config import RunConfig, resolved
from lospmm.flows.storage.store import valid_sidecar
from tests.conftest import run_directly

NAMES = ("enc.0", "enc_0", "enc 0", "ü", "ß", "block." + "x" * 300)


@pytest.fixture()
def colliding(tmp_path):
    """Six layers whose sanitised names collide (three `enc_0`, two all-non-ASCII) or are too long."""
    rng = np.random.default_rng(0)
    path = tmp_path / "w.safetensors"
    save_file({name: rng.standard_normal((32 + 8 * i, 24)).astype(np.float32) for i, name in enumerate(NAMES)},
              str(path))
    return resolved(RunConfig(zoo=(), weights=str(path), tokens=256, m1s=(2, 8), top_k=2,
                              artifacts=str(tmp_path / "art")))


def _emitted(plan, done):
    return pq.read_table(plan.root / done["emit"]["path"]).to_pylist()


def test_every_layer_has_its_own_kernel_directory(colliding):
    done = run_directly(colliding, 0.7)
    rows = _emitted(colliding, done)
    assert sorted(r["layer"] for r in rows) == sorted(NAMES)
    assert all(r["status"] == "ok" and r["check"] == "host-asan" for r in rows), [r["message"] for r in rows]
    dirs = {r["kernel_dir"] for r in rows}
    assert len(dirs) == len(NAMES)  # no two layers share one
    for r in rows:
        facts = json.loads((colliding.root / r["kernel_dir"] / "kernel.json").read_text())
        assert facts["layer"] == r["layer"] and facts["m"] == r["m"]  # each built from its own weights
        assert len((colliding.root / r["kernel_dir"]).name) <= 73


@pytest.mark.parametrize("damage", ["flip a cubin byte", "edit kernel.json", "delete the directory"])
def test_a_damaged_kernel_directory_is_rebuilt_not_served(colliding, damage):
    done = run_directly(colliding, 0.7)
    row = _emitted(colliding, done)[0]
    d = colliding.root / row["kernel_dir"]
    good = (d / "kernel.cubin").read_bytes()
    if damage == "flip a cubin byte":
        data = bytearray(good)
        data[len(data) // 2] ^= 0xFF
        (d / "kernel.cubin").write_bytes(bytes(data))
    elif damage == "edit kernel.json":
        facts = json.loads((d / "kernel.json").read_text())
        (d / "kernel.json").write_text(json.dumps({**facts, "n1": 1024}))
    else:
        shutil.rmtree(d)
    assert valid_sidecar(colliding.root / done["emit"]["path"]) is None  # the artifact no longer checks out
    warned = []
    logger = type("Log", (), {"warning": lambda self, fmt, *a: warned.append(fmt % a)})()
    from lospmm.flows.pipeline import _reusable

    assert not _reusable(colliding.root / done["emit"]["path"], "emit", "w", logger)
    # the flow says why it computes emit again, naming the file at fault
    at_fault = {"flip a cubin byte": "kernel.cubin does not match its checksum",
                "edit kernel.json": "kernel.json does not match its checksum",
                "delete the directory": "SHA256SUMS is missing"}[damage]
    named = Path(row["kernel_dir"]).relative_to(Path(done["emit"]["path"]).parent)  # from the artifact's folder
    assert len(warned) == 1 and warned[0].startswith(f"emit w: {named}/") and at_fault in warned[0] \
        and warned[0].endswith("; computing it again"), warned
    again = run_directly(colliding, 0.7)
    assert again["emit"]["reused"] is False and again["time"]["reused"] is True  # only emit recomputes
    assert (d / "kernel.cubin").read_bytes() == good
    assert valid_sidecar(colliding.root / again["emit"]["path"]) is not None


def test_a_full_disk_is_retried_and_never_cached(colliding, monkeypatch):
    import lospmm.kernel.package as kernels  # where a kernel directory copies its cubin in

    real, calls = shutil.copyfile, []

    def full_disk(src, dst, *a, **k):
        calls.append(dst)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(kernels.shutil, "copyfile", full_disk)
    done = run_directly(colliding, 0.7)
    rows = _emitted(colliding, done)
    assert all(r["status"] == "error" and "No space left" in r["message"] for r in rows)
    assert len(calls) == 2 * len(NAMES)  # each layer tried twice
    assert valid_sidecar(colliding.root / done["emit"]["path"]) is None  # written for inspection, not reused

    monkeypatch.setattr(kernels.shutil, "copyfile", real)  # space freed
    again = run_directly(colliding, 0.7)
    assert again["emit"]["reused"] is False
    assert all(r["status"] == "ok" for r in _emitted(colliding, again))


def test_a_transient_failure_that_passes_on_the_retry_costs_nothing(colliding, monkeypatch):
    import lospmm.kernel.package as kernels  # where a kernel directory copies its cubin in

    real, failed = shutil.copyfile, set()

    def once(src, dst, *a, **k):  # the first copy into each kernel directory fails
        if Path(dst).parent not in failed:
            failed.add(Path(dst).parent)
            raise OSError(errno.EIO, "Input/output error")
        return real(src, dst, *a, **k)

    monkeypatch.setattr(kernels.shutil, "copyfile", once)
    done = run_directly(colliding, 0.7)
    assert all(r["status"] == "ok" for r in _emitted(colliding, done))
    assert valid_sidecar(colliding.root / done["emit"]["path"]) is not None
