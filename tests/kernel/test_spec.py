"""KernelSpec: one description of a kernel that every reader asks, and the only reader and writer of
kernel.json (versioned; a version it does not know is refused in one line)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from lospmm.kernel.design import design_named, half_design
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.geometry import ConvGeometry
from lospmm.kernel.numbers import NumberFormat, rounded_matrix
from lospmm.kernel.render import CodegenParams, kernel_source, proxy_source
from lospmm.kernel.spec import KERNEL_JSON_VERSION, KernelSpec, KernelSpecError
from lospmm.stages.cluster import proxy_clusters
from lospmm.stages.prune import random_pruned
from lospmm.stages.reorder import reordered_tiles


def _matrix(m=40, k=24, sparsity=0.7, seed=0):
    a = random_pruned(m, k, sparsity, np.random.default_rng(seed)).tolil()
    a[3] = 0  # an empty row: its zeroing block is part of the grid
    return a.tocsr()


def test_a_gemm_kernels_facts_describe_its_launch_and_read_back_the_same():
    a = _matrix()
    tiles = reordered_tiles(a, 4)
    kernel = kernel_source(a, tiles, 64)
    spec = kernel.spec.located("enc.0", 0.7, "sm_90", tiles)
    facts = spec.facts()
    assert facts["version"] == KERNEL_JSON_VERSION
    assert facts["kernel"] == kernel.name and facts["grid"]["x"] == kernel.grid_x > tiles.num_tiles
    assert (facts["m"], facts["k"], facts["nnz"], facts["m1"], facts["n1"]) == (40, 24, a.nnz, 4, 64)
    assert facts["empty_rows"] == [3] and sorted(facts["row_order"] + facts["empty_rows"]) == list(range(40))
    assert facts["params"] == ["const float* B", "float* C", "int N"] and facts["arch"] == "sm_90"
    assert "epilogue" not in facts and "conv" not in facts and "precision" not in facts  # a plain fp32 GEMM kernel
    results = {"compile": {"status": "ok", "registers": 40}, "full_time_us": float("nan")}
    text = spec.to_json(results)
    back = KernelSpec.from_json(text)
    assert back == spec and dict(back.results) == {"compile": {"status": "ok", "registers": 40}, "full_time_us": None}
    assert json.loads(text)["full_time_us"] is None  # strict JSON: a missing figure is null


@pytest.mark.parametrize("what", ["conv", "half", "v4 and bias+gelu", "streamed", "streamed conv and bias+relu"])
def test_every_kind_of_kernel_reads_back_as_the_spec_it_was_written_from(what):
    a = _matrix(24, 18)
    design, epilogue, conv = design_named("baseline"), Epilogue(), None
    if what.endswith("conv") or what.startswith("streamed conv"):
        conv, epilogue = ConvGeometry(cin=2, h=5, w=5, kh=3, kw=3, pad=1), Epilogue(tuple([0.5] * 24), "relu")
        design = design_named("streamed,column-x,walks=2" if what.startswith("streamed") else "baseline")
    elif what == "half":
        design = half_design(NumberFormat.half("bf16", "f32"), design_named("chained"))
        a = rounded_matrix(a, "bf16")[0]
    elif what == "v4 and bias+gelu":
        design, epilogue = design_named("chained,v=4,walks=3,column-x"), Epilogue(tuple(range(24)), "gelu")
    else:
        design = design_named("streamed,chained")
    tiles = reordered_tiles(a, 2)
    rounding = rounded_matrix(a, "bf16")[1] if what == "half" else None
    spec = kernel_source(a, tiles, 32, CodegenParams(design=design), epilogue, conv).spec.located(
        "layer", 0.9, "sm_90", tiles, rounding)
    back = KernelSpec.from_json(spec.to_json({}))
    assert back == spec and back.facts() == spec.facts()
    assert back.form == ("conv" if conv else "gemm") and back.dtype == design.dtype and back.epilogue == epilogue


def test_what_a_kernel_can_serve_is_asked_of_its_spec():
    a = _matrix(16, 12)
    tiles = reordered_tiles(a, 2)
    v4 = kernel_source(a, tiles, 8, CodegenParams(design=design_named("v=4"))).spec
    assert (v4.column_multiple, v4.element_bytes, v4.alignment, v4.launch_count(6)) == (4, 4, 16, 8)
    assert v4.serves((12, 5)) == "" and "B must be 12×N" in v4.serves((11, 5))
    assert v4.input_shape(7) == (12, 7) and v4.output_shape(7) == (16, 7) and not v4.n1_at_launch
    half = kernel_source(rounded_matrix(a, "fp16")[0], tiles, 8,
                         CodegenParams(design=design_named("fp16"))).spec
    assert (half.column_multiple, half.element_bytes, half.alignment, half.number.ctype) == (2, 2, 4, "lospmm_h16")
    assert half.params == ("const lospmm_h16* B", "lospmm_h16* C", "int N")
    g = ConvGeometry(cin=3, h=4, w=4, kh=3, kw=3, pad=1)
    conv = kernel_source(_matrix(8, 27), reordered_tiles(_matrix(8, 27), 2), 16, conv=g).spec
    assert conv.argument_names == ("X", "Y", "batch") and conv.columns(2) == 32 and conv.count(32) == 2
    assert conv.output_shape(2) == (2, 8, 4, 4) and "X must be batch×3×4×4" in conv.serves((2, 3, 5, 4))
    proxy = proxy_source(16, 12, proxy_clusters(a, tiles, 0.7, 2)).spec
    assert proxy.form == "proxy" and proxy.n1_at_launch and proxy.params[-1] == "const int* cluster_of"


def test_a_kernel_json_of_another_version_or_contradicting_itself_is_refused_in_one_line():
    tiles = reordered_tiles(_matrix(), 4)
    spec = kernel_source(_matrix(), tiles, 64).spec.located("enc.0", 0.7, "sm_90", tiles)
    facts = json.loads(spec.to_json({}))
    with pytest.raises(KernelSpecError, match=r"kernel.json version 2; this lospmm reads versions up to 1"):
        KernelSpec.from_json(json.dumps({**facts, "version": 2}), "kernel.json")
    unversioned = {k: v for k, v in facts.items() if k != "version"}  # written before the field: read as it was
    assert KernelSpec.from_json(json.dumps(unversioned)) == spec
    with pytest.raises(KernelSpecError, match="parameters .* are not a gemm kernel's"):
        KernelSpec.from_json(json.dumps({**facts, "params": ["const lospmm_h16* B", "lospmm_h16* C", "int N"]}))
    with pytest.raises(KernelSpecError, match="cannot read its kernel"):
        KernelSpec.from_json(json.dumps({k: v for k, v in facts.items() if k != "m"}))
    with pytest.raises(KernelSpecError, match="not JSON"):
        KernelSpec.from_json("{")
    with pytest.raises(KernelSpecError, match="says a bias is fused but not its values"):
        KernelSpec.from_json(json.dumps({**facts, "epilogue": {"bias": True, "relu": False}}))
    conv = kernel_source(_matrix(8, 27), reordered_tiles(_matrix(8, 27), 2), 16,
                         conv=ConvGeometry(cin=3, h=4, w=4, kh=3, kw=3, pad=1)).spec
    with pytest.raises(KernelSpecError, match="a conv kernel takes only the grid's order, walks and baked or streamed"):
        dataclasses.replace(conv, design=design_named("streamed,chained"))
