"""An ONNX model as a source: its GEMM weights with the graph's shapes, every other initializer
named with its reason, and each weight read back as the GEMM's A."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from lospmm.flows.config import ConfigError, RunConfig, resolved  # noqa: E402
from lospmm.flows.inputs.onnx_model import graph_weight_matrix, graph_weights  # noqa: E402
from lospmm.stages.extract import graph_shapes  # noqa: E402
from tests.conftest import run_directly  # noqa: E402

RNG = np.random.default_rng(0)
WEIGHTS = {
    "conv1.w": RNG.standard_normal((8, 3, 3, 3)).astype(np.float32),
    "conv1.b": RNG.standard_normal(8).astype(np.float32),
    "dw.w": RNG.standard_normal((8, 1, 3, 3)).astype(np.float32),
    "pw.w": RNG.standard_normal((16, 8, 1, 1)).astype(np.float32),
    "fc.w": RNG.standard_normal((10, 16)).astype(np.float32),  # Gemm transB=1: (out, in)
    "fc.b": RNG.standard_normal(10).astype(np.float32),
    "proj.w": RNG.standard_normal((16, 12)).astype(np.float32),  # MatMul: (in, out)
    "embed": RNG.standard_normal((100, 16)).astype(np.float32),
}


def small_model(path, batch="batch"):
    """A CNN branch (3×3 stride-2 conv with bias, depthwise 3×3, pointwise 1×1, pool, Gemm) and a
    token branch (an embedding Gather, then a MatMul)."""
    nodes = [
        helper.make_node("Conv", ["x", "conv1.w", "conv1.b"], ["c1"], name="conv1", strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "dw.w"], ["c2"], name="dw", group=8, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c2", "pw.w"], ["c3"], name="pw"),
        helper.make_node("GlobalAveragePool", ["c3"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["logits"], name="fc", transB=1),
        helper.make_node("Gather", ["embed", "ids"], ["e"], name="embedding"),
        helper.make_node("MatMul", ["e", "proj.w"], ["p"], name="proj"),
    ]
    graph = helper.make_graph(
        nodes, "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("p", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in WEIGHTS.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_gemm_weights_come_with_the_graphs_shapes_and_every_other_initializer_with_its_reason(tmp_path):
    found = {w.name: w for w in graph_weights(small_model(tmp_path / "m.onnx"))}
    conv = found["conv1.w"]
    assert (conv.op, conv.rows, conv.cols, conv.batch) == ("conv", 8, 27, 0)  # a symbolic batch stays 0
    assert conv.conv == {"cin": 3, "kh": 3, "kw": 3, "stride": 2, "pad": 1, "groups": 1, "h_in": 16, "w_in": 16,
                         "h_out": 8, "w_out": 8, "dilation": 1}
    assert found["pw.w"].op == "conv" and found["pw.w"].cols == 8 and found["dw.w"].conv["groups"] == 8
    assert (found["fc.w"].op, found["fc.w"].rows, found["fc.w"].cols) == ("linear", 10, 16)
    assert (found["proj.w"].rows, found["proj.w"].cols, found["proj.w"].n) == (12, 16, 10)  # N = 2·5 tokens
    assert found["conv1.b"].reason == "bias of Conv conv1" and found["fc.b"].reason == "bias of Gemm fc"
    assert found["embed"].reason == "embedding/lookup table of Gather embedding"
    shapes = {s.layer: s for s in graph_shapes("m", found.values(), tokens=64, batch=4)}
    assert shapes["conv1.w"].n == 4 * 8 * 8 and shapes["fc.w"].n == 64  # the graph leaves both symbolic
    assert shapes["dw.w"].status == "skipped" and "depthwise" in shapes["dw.w"].message
    assert sorted(n for n, s in shapes.items() if s.ok) == ["conv1.w", "fc.w", "proj.w", "pw.w"]


def test_each_weight_reads_back_as_the_gemms_a(tmp_path):
    path = small_model(tmp_path / "m.onnx")
    assert np.array_equal(graph_weight_matrix(path, "conv1.w"), WEIGHTS["conv1.w"].reshape(8, 27))
    assert np.array_equal(graph_weight_matrix(path, "fc.w"), WEIGHTS["fc.w"])  # transB: already (out, in)
    assert np.array_equal(graph_weight_matrix(path, "proj.w"), WEIGHTS["proj.w"].T)  # MatMul: X·W
    with pytest.raises(ValueError, match="embed: not a GEMM weight"):
        graph_weight_matrix(path, "embed")


def test_an_onnx_model_runs_through_prune_with_its_own_weights(tmp_path):
    path = small_model(tmp_path / "m.onnx")
    plan = resolved(RunConfig(zoo=(), weights=str(path), tokens=64, cnn_batch=2, m1s=(2,), until="prune",
                              artifacts=str(tmp_path / "art")))
    done = run_directly(plan, 0.5)
    shapes = {r["layer"]: r for r in pq.read_table(plan.root / done["extract"]["path"]).to_pylist()}
    assert shapes["conv1.w"]["op"] == "conv" and shapes["conv1.w"]["n"] == 2 * 8 * 8
    assert shapes["embed"]["status"] == "skipped"
    pruned = {r["layer"]: r for r in pq.read_table(plan.root / done["prune"]["path"]).to_pylist()}
    assert sorted(pruned) == ["conv1.w", "fc.w", "proj.w", "pw.w"] and all(r["status"] == "ok" for r in pruned.values())
    kept = np.asarray(pruned["proj.w"]["data"], np.float32)
    assert np.isin(kept, WEIGHTS["proj.w"]).all() and len(kept) == WEIGHTS["proj.w"].size // 2  # its own values
    assert np.min(np.abs(kept)) >= np.median(np.abs(WEIGHTS["proj.w"])) - 1e-6


def test_a_model_without_gemm_weights_or_unreadable_is_refused_up_front(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a protobuf")
    with pytest.raises(ConfigError, match="junk.onnx is not readable"):
        resolved(RunConfig(zoo=(), weights=str(junk)))
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph), str(tmp_path / "relu.onnx"))
    with pytest.raises(ConfigError, match="no MatMul, Gemm or Conv weight"):
        resolved(RunConfig(zoo=(), weights=str(tmp_path / "relu.onnx")))


def test_global_pruning_over_a_model_keeps_the_requested_share_of_all_its_weights(tmp_path):
    path = small_model(tmp_path / "m.onnx")
    plan = resolved(RunConfig(zoo=(), weights=str(path), tokens=64, m1s=(2,), until="prune", prune="global",
                              artifacts=str(tmp_path / "art")))
    pruned = pq.read_table(plan.root / run_directly(plan, 0.75)["prune"]["path"]).to_pylist()
    total = sum(WEIGHTS[n].size for n in ("conv1.w", "pw.w", "fc.w", "proj.w"))
    assert sum(r["nnz"] for r in pruned) == round(0.25 * total)
    shares = {r["layer"]: r["sparsity_achieved"] for r in pruned}
    assert len(set(shares.values())) > 1  # one threshold, so each layer keeps its own share


def test_a_weight_passed_through_identity_nodes_is_still_the_convs_weight(tmp_path):
    """torch's exporter routes shared initializers through Identity (11 of MobileNetV2's convs)."""
    nodes = [helper.make_node("Identity", ["pw.w"], ["pw.w.alias"]),
             helper.make_node("Identity", ["pw.w.alias"], ["pw.w.alias2"]),
             helper.make_node("Conv", ["x", "pw.w.alias2"], ["y"], name="pw")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(WEIGHTS["pw.w"], "pw.w")])
    path = tmp_path / "identity.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    (w,) = graph_weights(path)
    assert (w.name, w.op, w.rows, w.cols) == ("pw.w", "conv", 16, 8) and w.conv["h_out"] == 5
    assert np.array_equal(graph_weight_matrix(path, "pw.w"), WEIGHTS["pw.w"].reshape(16, 8))
