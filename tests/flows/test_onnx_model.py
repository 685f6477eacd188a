"""An ONNX model as a source: its GEMM weights with the graph's shapes, every other initializer
named with its reason, and each weight read back as the GEMM's A."""

from __future__ import annotations

import re

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
    fused = " (fused into its weight's kernel)"  # as lospmm.torch's importer: the bias and the Relu after conv1
    assert found["conv1.b"].reason == "bias of Conv conv1" + fused and found["fc.b"].reason == "bias of Gemm fc" + fused
    assert (conv.bias, conv.activation) == ("conv1.b", "relu") and (found["fc.w"].bias, found["fc.w"].activation) == (
        "fc.b", "")
    assert (found["pw.w"].bias, found["pw.w"].activation, found["proj.w"].bias) == ("", "", "")
    assert found["embed"].reason == "embedding/lookup table of Gather embedding"
    shapes = {s.layer: s for s in graph_shapes("m", found.values(), tokens=64, batch=4)}
    assert shapes["conv1.w"].n == 4 * 8 * 8 and shapes["fc.w"].n == 64  # the graph leaves both symbolic
    # the depthwise conv: its 8 × 1·3·3 weight searched block-diagonally over its 8 input channels
    assert (shapes["dw.w"].k, shapes["dw.w"].groups, shapes["dw.w"].cin) == (8 * 9, 8, 8)
    assert sorted(n for n, s in shapes.items() if s.ok) == ["conv1.w", "dw.w", "fc.w", "proj.w", "pw.w"]


def test_an_onnx_layers_bias_and_the_activation_that_alone_reads_it_are_fused(tmp_path):
    """A MatMul's bias is the Add of a 1-D initializer that alone reads its output, then the Relu or exact
    Gelu that alone reads that; a scaled Gemm, a weight two nodes use, or an output read twice fuse nothing
    (or no activation). The emit stage reads a fused bias from the graph (flows.kernels.layer_epilogue)."""
    from lospmm.flows.inputs.onnx_model import graph_tensor
    from lospmm.flows.kernels import layer_epilogue

    w = {name: RNG.standard_normal(shape).astype(np.float32) for name, shape in (
        ("a.w", (16, 8)), ("a.b", (8,)), ("g.w", (8, 8)), ("g.b", (8,)), ("s.w", (8, 16)), ("s.b", (8,)),
        ("t.w", (8, 8)), ("u.w", (8, 8)), ("u.b", (8,)), ("v.w", (8, 8)), ("v.b", (8, 1)), ("n.w", (8, 8)),
        ("k.w", (8, 8)))}
    branch = helper.make_graph([helper.make_node("Identity", ["k"], ["k_seen"])], "branch", [],
                               [helper.make_tensor_value_info("k_seen", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("MatMul", ["x", "a.w"], ["a"], name="a"), helper.make_node("Add", ["a.b", "a"], ["ab"]),
             helper.make_node("Relu", ["ab"], ["ar"]),
             helper.make_node("MatMul", ["ar", "g.w"], ["g"], name="g"), helper.make_node("Add", ["g", "g.b"], ["gb"]),
             helper.make_node("Gelu", ["gb"], ["gg"], domain=""),
             helper.make_node("Gemm", ["gg", "s.w", "s.b"], ["s"], name="s", transB=1, alpha=2.0),
             helper.make_node("Relu", ["s"], ["sr"]),
             helper.make_node("MatMul", ["sr", "t.w"], ["t1"], name="t1"), helper.make_node("Relu", ["t1"], ["t1r"]),
             helper.make_node("MatMul", ["t1r", "t.w"], ["t2"], name="t2"),  # t.w tied: used twice
             helper.make_node("Relu", ["t2"], ["t2r"]),
             helper.make_node("MatMul", ["t2r", "u.w"], ["u"], name="u"), helper.make_node("Add", ["u", "u.b"], ["ub"]),
             helper.make_node("Relu", ["ub"], ["yu"]), helper.make_node("Sigmoid", ["ub"], ["z"]),  # ub read twice
             # a bias along the rows (8 × 1) is no bias of the outputs: nothing fused
             helper.make_node("MatMul", ["yu", "v.w"], ["v"], name="v"), helper.make_node("Add", ["v", "v.b"], ["vb"]),
             helper.make_node("Relu", ["vb"], ["vr"]),
             # a Gemm that scales its product (alpha), without a bias: its Relu is not the kernel's to apply
             helper.make_node("Gemm", ["vr", "n.w"], ["n"], name="n", transB=1, alpha=-1.0),
             helper.make_node("Relu", ["n"], ["nr"]),
             # an If's branch reads k's output: the Relu is not its only reader
             helper.make_node("MatMul", ["nr", "k.w"], ["k"], name="k"), helper.make_node("Relu", ["k"], ["y"]),
             helper.make_node("If", ["cond"], ["kept"], then_branch=branch, else_branch=branch)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16]),
                                               helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in ("y", "z", "kept")],
                              [numpy_helper.from_array(v, k) for k, v in w.items()])
    path = tmp_path / "chain.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))
    found = {g.name: g for g in graph_weights(path)}
    assert {n: (found[n].bias, found[n].activation) for n in ("a.w", "g.w", "s.w", "t.w", "u.w", "v.w", "n.w", "k.w")} \
        == {"a.w": ("a.b", "relu"), "g.w": ("g.b", "gelu"), "s.w": ("", ""), "t.w": ("", ""), "u.w": ("u.b", ""),
            "v.w": ("", ""), "n.w": ("", ""), "k.w": ("", "")}
    np.testing.assert_array_equal(graph_tensor(path, "g.b"), w["g.b"])
    epilogue = layer_epilogue({"layer": "g.w", "bias": "g.b", "activation": "gelu", "source": str(path)})
    assert epilogue.bias == tuple(w["g.b"].tolist()) and epilogue.activation == "gelu"


def test_a_bias_added_after_a_conv_without_one_is_fused_only_per_channel(tmp_path):
    """TF's exporters write a Conv without a bias and an Add after it: an (M, 1, 1) or (1, M, 1, 1)
    initializer is one value per output channel (fused, with the Relu after it); an (M) one broadcasts
    along the image's width, no bias of the channels: nothing fused."""
    w = {"c.w": RNG.standard_normal((4, 3, 3, 3)), "c.b": RNG.standard_normal((1, 4, 1, 1)),
         "d.w": RNG.standard_normal((4, 4, 1, 1)), "d.b": RNG.standard_normal((4, 1, 1)),
         "e.w": RNG.standard_normal((4, 4, 1, 1)), "e.b": RNG.standard_normal(4)}
    nodes = [helper.make_node("Conv", ["x", "c.w"], ["c"], name="c", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "c.b"], ["cb"]), helper.make_node("Relu", ["cb"], ["cr"]),
             helper.make_node("Conv", ["cr", "d.w"], ["d"], name="d"), helper.make_node("Add", ["d.b", "d"], ["db"]),
             helper.make_node("Conv", ["db", "e.w"], ["e"], name="e"), helper.make_node("Add", ["e", "e.b"], ["eb"]),
             helper.make_node("Relu", ["eb"], ["y"])]
    graph = helper.make_graph(nodes, "tf", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()])
    path = tmp_path / "tf.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    found = {g.name: g for g in graph_weights(path)}
    assert {n: (found[n].bias, found[n].activation) for n in ("c.w", "d.w", "e.w")} == {
        "c.w": ("c.b", "relu"), "d.w": ("d.b", ""), "e.w": ("", "")}
    from lospmm.flows.kernels import layer_epilogue

    epilogue = layer_epilogue({"layer": "c.w", "bias": "c.b", "activation": "relu", "source": str(path)})
    assert epilogue.bias == tuple(w["c.b"].astype(np.float32).ravel().tolist()) and epilogue.activation == "relu"


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
    # the classifier after the convolutions gets their batch (--cnn-batch set the image input's), not
    # --tokens; the token branch, whose ids are static [2, 5], its 10 rows
    assert shapes["fc.w"]["n"] == 2 and shapes["proj.w"]["n"] == 10
    assert shapes["embed"]["status"] == "skipped"
    pruned = {r["layer"]: r for r in pq.read_table(plan.root / done["prune"]["path"]).to_pylist()}
    assert sorted(pruned) == ["conv1.w", "dw.w", "fc.w", "proj.w", "pw.w"]
    assert all(r["status"] == "ok" for r in pruned.values())
    assert pruned["dw.w"]["nnz"] == WEIGHTS["dw.w"].size // 2  # its own weight's share, not the block-diagonal A's
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
    total = sum(WEIGHTS[n].size for n in ("conv1.w", "dw.w", "pw.w", "fc.w", "proj.w"))
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


# --- issue 22: what torch.onnx.export writes, weights in Constant nodes, symbolic image sizes -----------------


def _bert_like():
    """A module tree as BERT's: a ModuleList of attention blocks, a pooler, a Sequential head."""
    import torch

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.key = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16, bias=False)

        def forward(self, x):
            return self.query(x) + self.key(x)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Attention(), Attention()])
            self.pooler = torch.nn.Linear(16, 16)
            self.head = torch.nn.Sequential(torch.nn.Linear(16, 4))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.head(self.pooler(x))

    torch.manual_seed(0)
    return Net().eval()


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_a_torch_export_names_each_layer_by_its_module_path_as_its_state_dict_does(tmp_path, dynamo):
    """The dynamo exporter folds each Linear's transposed weight into an initializer `val_N` and the
    TorchScript one into `onnx::MatMul_N`: the layer keeps the module's name all the same."""
    torch = pytest.importorskip("torch")
    if dynamo:
        pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript")
    model, path = _bert_like(), tmp_path / "bert_like.onnx"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(model, (torch.randn(2, 5, 16),), str(path), dynamo=dynamo)
    inits = {t.name for t in onnx.load(str(path)).graph.initializer}
    assert not {"layers.0.query.weight", "pooler.weight"} & inits  # the exporter did rename them
    found = {w.name: w for w in graph_weights(path)}
    state = model.state_dict()
    linears = [n for n in state if n.endswith(".weight")]
    assert sorted(n for n, w in found.items() if w.op == "linear") == sorted(linears)
    for name in linears:
        assert np.array_equal(graph_weight_matrix(path, name), state[name].numpy()), name
    assert found["pooler.weight"].n == 10  # 2·5 rows from the graph's static shapes


def _initializer_graph(name: str, metadata: dict | None = None, node_name: str = "node_MatMul_1", extra=()):
    node = helper.make_node("MatMul", ["x", name], ["y"], name=node_name)
    for key, value in (metadata or {}).items():
        node.metadata_props.add(key=key, value=value)
    return node, [numpy_helper.from_array(WEIGHTS["proj.w"], name), *extra]


def test_a_recovered_name_never_repeats_another_and_an_unknown_module_keeps_the_generated_name(tmp_path):
    scopes = {"pkg.torch.onnx.name_scopes": "['', 'fc', 'linear']"}
    a, inits_a = _initializer_graph("val_3", scopes, "node_MatMul_3")
    b, inits_b = _initializer_graph("val_5", scopes, "node_MatMul_5")  # the same module again
    c, inits_c = _initializer_graph("val_7", {"pkg.torch.onnx.name_scopes": "['', 'linear']"}, "node_MatMul_7")
    d, inits_d = _initializer_graph("onnx::MatMul_9", None, "/encoder/layer.0/query/MatMul")
    e, inits_e = _initializer_graph("val_11", {"namespace": ": M/head: Sequential/head.0: Linear/linear: aten.linear"},
                                    "node_MatMul_11")
    nodes = [a, b, c, d, e]
    for i, n in enumerate(nodes):
        n.output[0] = f"y{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(5)],
                              [*inits_a, *inits_b, *inits_c, *inits_d, *inits_e])
    path = tmp_path / "names.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    names = [w.name for w in graph_weights(path)]
    assert names == ["fc.weight", "val_5", "val_7", "encoder.layer.0.query.weight", "head.0.weight"]
    assert np.array_equal(graph_weight_matrix(path, "head.0.weight"), WEIGHTS["proj.w"].T)


def _as_constants(model):
    """The model with every initializer moved into a Constant node (as some exporters write weights)."""
    constants = [helper.make_node("Constant", [], [t.name], value=t) for t in model.graph.initializer]
    nodes = list(model.graph.node)
    del model.graph.node[:], model.graph.initializer[:]
    model.graph.node.extend([*constants, *nodes])
    return model


def test_weights_held_in_constant_nodes_are_read_as_initializers_are(tmp_path):
    path = small_model(tmp_path / "m.onnx")
    held = tmp_path / "constants.onnx"
    model = _as_constants(onnx.load(str(path)))
    # an integer shape constant and an Identity before a weight: neither trips the reading
    model.graph.node.insert(0, helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(
        np.array([2, 5], np.int64), "shape")))
    proj = next(n for n in model.graph.node if n.op_type == "MatMul")
    model.graph.node.insert(0, helper.make_node("Identity", ["proj.w"], ["proj.w.alias"]))
    proj.input[1] = "proj.w.alias"
    onnx.save(model, str(held))
    assert not onnx.load(str(held)).graph.initializer
    want = {w.name: w for w in graph_weights(path)}
    found = {w.name: w for w in graph_weights(held)}
    assert found == want  # every weight with the same shapes, every other tensor with the same reason
    assert np.array_equal(graph_weight_matrix(held, "proj.w"), WEIGHTS["proj.w"].T)
    assert np.array_equal(graph_weight_matrix(held, "conv1.w"), WEIGHTS["conv1.w"].reshape(8, 27))
    plan = resolved(RunConfig(zoo=(), weights=str(held), tokens=64, m1s=(2,), until="prune",
                              artifacts=str(tmp_path / "art")))
    pruned = pq.read_table(plan.root / run_directly(plan, 0.5)["prune"]["path"]).to_pylist()
    searched = sorted(s.layer for s in graph_shapes("m", want.values(), tokens=64, batch=1) if s.ok)
    assert sorted(r["layer"] for r in pruned if r["status"] == "ok") == searched and "proj.w" in searched


def _dynamic_cnn(path):
    """Two convolutions after an input of symbolic batch, height and width, as an exporter with
    dynamic axes writes it."""
    nodes = [helper.make_node("Conv", ["images", "conv1.w", "conv1.b"], ["c1"], name="conv1", strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c1", "pw.w"], ["c2"], name="pw")]
    weights = {"conv1.w": WEIGHTS["conv1.w"], "conv1.b": WEIGHTS["conv1.b"],
               "pw.w": RNG.standard_normal((16, 8, 1, 1)).astype(np.float32)}
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                                                           ["batch", 3, "height", "width"])],
                              [helper.make_tensor_value_info("c2", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_input_shapes_give_the_convolutions_after_a_symbolic_image_size_their_sizes(tmp_path):
    path = _dynamic_cnn(tmp_path / "cnn.onnx")
    found = {w.name: w for w in graph_weights(path)}
    assert not found["conv1.w"].op and "--input-shape" in found["conv1.w"].reason
    assert found["conv1.b"].reason == "bias of Conv conv1"
    fixed = {w.name: w for w in graph_weights(path, (("images", (2, 3, 20, 12)),))}
    assert fixed["conv1.w"].conv["h_out"] == 10 and fixed["conv1.w"].conv["w_out"] == 6 and fixed["conv1.w"].batch == 2
    assert fixed["pw.w"].op == "conv" and fixed["pw.w"].conv["h_in"] == 10  # shape inference carried it on
    plan = resolved(RunConfig(zoo=(), weights=str(path), input_shapes=("images:2x3x20x12",), m1s=(2,), until="prune",
                              artifacts=str(tmp_path / "art")))
    assert plan.sources[0].input_shapes == (("images", (2, 3, 20, 12)),)
    done = run_directly(plan, 0.5)
    shapes = {r["layer"]: r for r in pq.read_table(plan.root / done["extract"]["path"]).to_pylist()}
    assert shapes["conv1.w"]["n"] == 2 * 10 * 6 and shapes["pw.w"]["n"] == 2 * 10 * 6
    pruned = pq.read_table(plan.root / done["prune"]["path"]).to_pylist()
    assert sorted(r["layer"] for r in pruned if r["status"] == "ok") == ["conv1.w", "pw.w"]


def test_input_shapes_are_part_of_the_extract_key(tmp_path):
    from lospmm.flows.dag import NODES, node_key

    path = _dynamic_cnn(tmp_path / "cnn.onnx")

    def key(*shapes):
        plan = resolved(RunConfig(zoo=(), weights=str(path), input_shapes=shapes, artifacts=str(tmp_path / "art")))
        return node_key("extract", NODES["extract"].params(plan, plan.sources[0], 0.9), [])

    assert len({key("images:1x3x32x32"), key("images:1x3x64x64"), key("images:2x3x32x32")}) == 3
    assert key("images:1x3x32x32") == key("'images':1x3x32x32")  # trtexec's quoting: the same shapes
    with pytest.raises(ConfigError, match=r"no MatMul, Gemm or Conv weight .*; Conv conv1: not a 2-D convolution "
                                          r"with a static input size .*--input-shape NAME:1x3xHxW"):
        key()  # without them nothing is searched, and the line says what to give


@pytest.mark.parametrize("shapes, message", [
    (("pixels:1x3x32x32",), "--input-shape pixels: "),  # not an input of the graph: named, with those there
    (("images:1x3x32",), "--input-shape images: 3 dims given, input 'images' of"),
    (("images:1x4x32x32",), "--input-shape images: dim 1 is 3 in"),
    (("images:1x3x0x32",), "--input-shape 'images:1x3x0x32': give NAME:DIMS"),
    (("images:1x3xHx32",), "--input-shape 'images:1x3xHx32': give NAME:DIMS"),
    (("images:1x3x8x8", "images:1x3x9x9"), "--input-shape images: given twice"),
])
def test_bad_input_shapes_are_refused_in_one_line_before_any_work(tmp_path, shapes, message):
    path = _dynamic_cnn(tmp_path / "cnn.onnx")
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        resolved(RunConfig(zoo=(), weights=str(path), input_shapes=shapes, artifacts=str(tmp_path / "art")))
    assert "\n" not in str(e.value)
    if "pixels" in message:
        assert str(e.value).endswith("has no input 'pixels' (its inputs: images)")
    assert not (tmp_path / "art" / "01_shapes").exists()


def test_input_shapes_without_an_onnx_model_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"--input-shape images: .*give --weights MODEL\.onnx"):
        resolved(RunConfig(zoo=("resnet50",), input_shapes=("images:1x3x32x32",), artifacts=str(tmp_path)))
