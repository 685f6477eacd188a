"""Behaviour unchanged (issue 31): every kernel the system can emit renders byte for byte as the
generators before lospmm/kernel/ rendered it, and its kernel.json describes it with the same facts.
The digests in unchanged.json were recorded from main at cba135e (see its `about`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from lospmm.kernel.design import design_named, half_design
from lospmm.kernel.epilogue import Epilogue
from lospmm.kernel.geometry import ConvGeometry
from lospmm.kernel.numbers import NumberFormat, in_format, rounded_matrix
from lospmm.kernel.render import CodegenParams, kernel_source, proxy_source
from lospmm.stages.cluster import ClusterParams, proxy_clusters
from lospmm.stages.reorder import reordered_tiles

RECORDED = json.loads(Path(__file__).with_name("unchanged.json").read_text())


def _cases() -> list[dict]:
    """Every form, design, number format, epilogue and convolution geometry, on three matrices (one
    with empty rows), tiles of M1 1, 3 and 8: 890 kernels."""
    cases = []
    mats = [dict(m=37, k=53, density=0.2, seed=1), dict(m=64, k=96, density=0.1, seed=2),
            dict(m=19, k=40, density=0.35, seed=3, empty_rows=(0, 7, 18))]
    fp32 = ["baseline", "chained", "column-x", "chained,column-x", "walks=4", "chained,walks=4", "v=2", "v=4",
            "chained,v=4,walks=4", "chained,v=2,column-x,walks=3", "v=4,column-x"]
    epilogues = [dict(bias=False, activation=""), dict(bias=True, activation=""), dict(bias=True, activation="relu"),
                 dict(bias=False, activation="gelu"), dict(bias=True, activation="gelu")]
    for mat in mats:
        for m1 in (1, 3, 8):
            for design in fp32:
                for ep in (epilogues if design in ("baseline", "chained,v=4,walks=4", "v=2") else epilogues[:1]):
                    cases.append(dict(kind="full", mat=mat, m1=m1, n1=32 if m1 != 3 else 96, design=design, **ep))
                cases.append(dict(kind="proxy", mat=mat, m1=m1, design=design))
            cases.append(dict(kind="full", mat=mat, m1=m1, n1=64, design="baseline", n1_at_launch=True))
            cases.append(dict(kind="full", mat=mat, m1=m1, n1=64, design="chained,v=4", n1_at_launch=True))
            cases.append(dict(kind="full", mat=mat, m1=m1, n1=128, design="baseline", prefetch=3, shard_nnz=40))
            cases.append(dict(kind="proxy", mat=mat, m1=m1, design="chained,v=2", prefetch=2, shard_nnz=30))
            for design in ("streamed", "streamed,chained", "streamed,v=4", "streamed,chained,column-x,walks=4,v=2"):
                cases.append(dict(kind="full", mat=mat, m1=m1, n1=64, design=design))
            for dtype in ("fp16", "bf16"):
                for acc, promote in (("packed", 0), ("f32", 0), ("packed", 3)):
                    for loads in ("based", "chained"):
                        design = f"{dtype},acc={acc},{loads}" + (f",promote={promote}" if promote else "")
                        for ep in (epilogues if loads == "chained" and acc == "packed" else epilogues[:2]):
                            cases.append(dict(kind="full", mat=mat, m1=m1, n1=32, design=design, **ep))
                        cases.append(dict(kind="proxy", mat=mat, m1=m1, design=design))
    convs = [dict(cin=3, h=9, w=11, kh=3, kw=3, stride=1, pad=1, dilation=1),
             dict(cin=4, h=12, w=12, kh=7, kw=7, stride=2, pad=3, dilation=1),
             dict(cin=5, h=10, w=10, kh=3, kw=3, stride=1, pad=2, dilation=2),
             dict(cin=8, h=6, w=6, kh=1, kw=1, stride=1, pad=0, dilation=1)]
    for ci, g in enumerate(convs):
        for m1 in (1, 4):
            for order in ("tile-x", "column-x"):
                for ep in epilogues:
                    mat = dict(m=13, k=g["cin"] * g["kh"] * g["kw"], density=0.3, seed=10 + ci, empty_rows=(2,))
                    cases.append(dict(kind="conv", mat=mat, m1=m1, n1=64, design=order, conv=g, **ep))
    return cases


def _matrix(mat: dict, dtype: str) -> sp.csr_matrix:
    rng = np.random.default_rng(mat["seed"])
    a = sp.random(mat["m"], mat["k"], density=mat["density"], format="csr", random_state=rng, dtype=np.float64)
    a.data = rng.standard_normal(a.nnz)
    a = a.tolil()
    for r in mat.get("empty_rows", ()):
        a[r, :] = 0
    a = sp.csr_matrix(a, dtype=np.float32).astype(np.float64)
    a.eliminate_zeros()
    a.sort_indices()
    return a if dtype == "fp32" else rounded_matrix(a, dtype)[0]


def _rendered(case: dict):
    design = design_named(case["design"])
    a = _matrix(case["mat"], design.dtype)
    tiles = reordered_tiles(a, case["m1"])
    params = CodegenParams(case.get("prefetch", 1), case.get("shard_nnz", 4096), design, case.get("n1_at_launch", False))
    bias = tuple(float(v) for v in np.random.default_rng(99).standard_normal(a.shape[0]).astype(np.float32)) \
        if case.get("bias") else ()
    epilogue = Epilogue(bias, case.get("activation", ""))
    if case["kind"] == "proxy":
        return proxy_source(a.shape[0], a.shape[1], proxy_clusters(a, tiles, 0.9, 2, ClusterParams()), params)
    conv = ConvGeometry(**case["conv"]) if case["kind"] == "conv" else None
    return kernel_source(a, tiles, case["n1"], params, epilogue, conv)


def test_every_kernel_the_renderers_emit_is_byte_identical_to_the_generators_before_the_kernel_package():
    cases = _cases()
    assert len(cases) == len(RECORDED["corpus"]) == 890
    differ = []
    for i, case in enumerate(cases):
        k = _rendered(case)
        record = {"units": [hashlib.sha256(u.encode()).hexdigest()[:16] for u in k.units], "name": k.name,
                  "kind": "full" if k.spec.form == "gemm" else k.spec.form, "params": list(k.params),
                  "layout": k.layout.facts(), "num_tiles": k.num_tiles, "m1": k.m1, "design": k.design.label}
        got = [k.sha256[:32], hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]]
        if got != RECORDED["corpus"][str(i)]:
            differ.append((i, case))
    assert not differ, f"{len(differ)} of {len(cases)} kernels differ from before, the first: {differ[:3]}"


@pytest.mark.parametrize("run", ["default", "v4", "fp16"])
def test_the_shufflenet_main_jobs_kernels_are_byte_identical_with_the_same_facts(run):
    """The layers of `lospmm run --zoo shufflenetv2 --sparsity 0.9` (and with `--design
    chained,v=4,walks=4`, `--dtype fp16`), each at the tile that run chose, rendered as the emit stage
    renders it: kernel.cu's sha256 and kernel.json's description as recorded before the refactor."""
    from lospmm.flows.kernels import conv_geometry
    from lospmm.flows.catalog.shapes import shape_row
    from lospmm.stages.extract import ZooParams, used_zoo_params, zoo_shapes
    from lospmm.stages.prune import PruneParams, pruned_layer

    design = {"default": design_named("baseline"), "v4": design_named("chained,v=4,walks=4"),
              "fp16": half_design(NumberFormat.half("fp16"), design_named("baseline"))}[run]
    recorded = RECORDED["shufflenetv2"][run]
    shapes = {s.layer: s for s in zoo_shapes("shufflenetv2", used_zoo_params("shufflenetv2", ZooParams()))}
    for layer, want in recorded.items():
        shape = shapes[layer]
        pruned = pruned_layer(shape, 0.9, PruneParams(method="random", seed=0)).matrix
        tiles = reordered_tiles(pruned, want["m1"])
        conv = conv_geometry(shape_row(shape, "shufflenetv2", "")) if want["form"] == "implicit-conv" else None
        a, rounding = in_format(pruned, design.number)
        kernel = kernel_source(a, tiles, want["n1"], CodegenParams(design=design), Epilogue(), conv)
        facts = kernel.spec.located(layer, 0.9, "sm_90", tiles, rounding).facts()
        facts.pop("version")
        assert (kernel.name, kernel.sha256) == (want["kernel"], want["kernel_cu_sha256"]), layer
        assert hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest() == want["facts_sha256"], layer
