import pytest

from lospmm.stages.extract import (
    ZOO_NAMES, TensorInfo, ZooParams, folded_duplicates, sanitized_name, weight_shapes, zoo_shapes,
)


def test_bert_base_has_three_encoder_shapes_and_the_pooler():
    shapes = zoo_shapes("bert-base", ZooParams(batch=2, seq_len=16))
    got = {(s.m, s.n, s.k): s.repeat for s in shapes}
    assert got == {(768, 32, 768): 48, (3072, 32, 768): 12, (768, 32, 3072): 12, (768, 2, 768): 1}
    qkv = next(s for s in shapes if s.repeat == 48)
    assert qkv.layers[:3] == tuple(f"encoder.layer.0.attention.self.{p}" for p in ("query", "key", "value"))


@pytest.mark.parametrize("name, layers, skipped", [
    ("resnet50", 54, 0), ("mobilenetv2", 53, 17), ("shufflenetv2", 57, 19),
])
def test_cnn_layer_counts_and_depthwise_skips(name, layers, skipped):
    shapes = zoo_shapes(name)
    assert sum(s.repeat for s in shapes) == layers
    dw = [s for s in shapes if s.op == "depthwise"]
    assert len(dw) == skipped and all(s.status == "skipped" and "depthwise" in s.message for s in dw)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_im2col_dimensions(name):
    p = ZooParams(cnn_batch=3, batch=2, seq_len=8)
    for s in zoo_shapes(name, p):
        if s.op in ("conv", "depthwise"):
            assert s.m == s.cout
            assert s.k == s.cin // s.groups * s.kh * s.kw
            assert s.n == 3 * s.h_out * s.w_out
            assert s.h_out == (s.h_in + 2 * s.pad - s.kh) // s.stride + 1


def test_resnet50_first_conv_and_fc():
    shapes = {s.layer: s for s in zoo_shapes("resnet50", ZooParams(cnn_batch=1))}
    assert (shapes["conv1"].m, shapes["conv1"].n, shapes["conv1"].k) == (64, 112 * 112, 147)
    assert (shapes["fc"].m, shapes["fc"].n, shapes["fc"].k) == (1000, 1, 2048)


def test_duplicates_fold_into_repeat_and_keep_first_name():
    shapes = zoo_shapes("resnet50")
    keys = [(s.op, s.m, s.n, s.k) for s in shapes if s.ok]
    assert len(keys) == len(set(keys))
    assert folded_duplicates(shapes) == shapes


def test_unknown_zoo_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown zoo model 'bert-large'.*resnet50"):
        zoo_shapes("bert-large")


def test_bad_zoo_sizes_are_rejected():
    with pytest.raises(ValueError, match="batch"):
        zoo_shapes("bert-base", ZooParams(batch=0))


def test_weight_shapes_one_linear_layer_per_2d_tensor():
    infos = [TensorInfo("w", (64, 32), "float32"), TensorInfo("b", (64,), "float32"),
             TensorInfo("empty", (0, 8), "float32")]
    shapes = {s.layer: s for s in weight_shapes("net", infos, tokens=128)}
    assert (shapes["w"].op, shapes["w"].m, shapes["w"].n, shapes["w"].k, shapes["w"].status) == ("linear", 64, 128, 32, "ok")
    assert shapes["b"].status == "skipped" and "1-D" in shapes["b"].message
    assert shapes["empty"].status == "error" and "empty dimension" in shapes["empty"].message
    with pytest.raises(ValueError, match="tokens"):
        weight_shapes("net", infos, tokens=0)


def test_sanitized_names_are_identifiers():
    assert sanitized_name("my model.v2/weights") == "my_model_v2_weights"
    assert sanitized_name("7b") == "m_7b"
    assert sanitized_name("../..") == "model"
