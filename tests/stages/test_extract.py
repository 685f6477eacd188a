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
    keys = [(s.op, s.m, s.n, s.k, s.stride, s.h_in) for s in shapes if s.ok]
    assert len(keys) == len(set(keys))
    assert folded_duplicates(shapes) == shapes
    assert shapes[2].layers[:3] == ("layer1.0.conv2", "layer1.1.conv2", "layer1.2.conv2")


def test_convolutions_fold_only_with_the_same_geometry():
    # an implicit-im2col kernel reads its input by the geometry: layer2.0.conv2 (3×3 stride 2 on
    # 56×56) and layer2.1.conv2 (stride 1 on 28×28) share M, N and K but not a kernel
    by_layer = {name: s for s in zoo_shapes("resnet50") for name in s.layers}
    first, second = by_layer["layer2.0.conv2"], by_layer["layer2.1.conv2"]
    assert (first.m, first.n, first.k) == (second.m, second.n, second.k)
    assert first.layer != second.layer and (first.stride, second.stride) == (2, 1)
    assert second.layers == ("layer2.1.conv2", "layer2.2.conv2", "layer2.3.conv2")


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


BERT_LIKE = [  # (name, shape, dtype) as a small BERT checkpoint lists them
    ("embeddings.word_embeddings.weight", (30522, 384), "F32"),
    ("embeddings.position_embeddings.weight", (512, 384), "F32"),
    ("embeddings.token_type_embeddings.weight", (2, 384), "F32"),
    ("embeddings.position_ids", (1, 512), "I64"),
    ("embeddings.LayerNorm.weight", (384,), "F32"),
    ("encoder.layer.0.attention.self.query.weight", (384, 384), "F32"),
    ("encoder.layer.0.attention.self.query.bias", (384,), "F32"),
    ("encoder.layer.0.output.dense.weight", (384, 1536), "BF16"),
    ("cls.predictions.decoder.weight", (30522, 384), "F32"),  # the output head: a GEMM, though tied
    ("vocab_table", (30522, 384), "F32"),  # a lookup table by its rows (the config's vocab_size)
    ("features.0.weight", (32, 3, 3, 3), "F32"),
]


def test_a_checkpoint_keeps_only_gemm_weights_and_names_why_each_other_tensor_is_excluded():
    from lospmm.stages.extract import ModelConfig, excluded_reason

    infos = [TensorInfo(n, s, d) for n, s, d in BERT_LIKE]
    config = ModelConfig(vocab_size=30522, max_position_embeddings=512, type_vocab_size=2, hidden_size=384)
    shapes = {s.layer: s for s in weight_shapes("bert", infos, tokens=64, config=config)}
    kept = sorted(n for n, s in shapes.items() if s.ok)
    assert kept == ["cls.predictions.decoder.weight", "encoder.layer.0.attention.self.query.weight",
                    "encoder.layer.0.output.dense.weight"]
    reasons = {t.name: excluded_reason(t, config) for t in infos}
    assert reasons["embeddings.word_embeddings.weight"] == "embedding/lookup table (by its name)"
    assert reasons["embeddings.position_ids"].startswith("integer or other non-float buffer (I64)")
    assert reasons["embeddings.LayerNorm.weight"] == "norm weight (1-D)"
    assert reasons["encoder.layer.0.attention.self.query.bias"] == "bias (1-D)"
    assert reasons["vocab_table"] == "embedding/lookup table (30522 rows = config's vocab_size)"
    assert reasons["features.0.weight"].startswith("convolution weight")
    skipped = shapes["embeddings.position_ids"]
    assert skipped.status == "skipped" and "excluded, integer" in skipped.message
    # without a config the table named like a plain weight is a GEMM: only names and dtypes tell
    assert excluded_reason(TensorInfo("vocab_table", (30522, 384), "F32")) is None


def test_a_linear_layer_whose_rows_equal_a_table_size_is_still_a_gemm():
    """Seen on a real BERT-tiny checkpoint: intermediate_size = max_position_embeddings = 512, so the
    FFN-up weight [512, hidden] has a position table's shape; its name says it is a linear layer."""
    from lospmm.stages.extract import ModelConfig, excluded_reason

    config = ModelConfig(vocab_size=8000, max_position_embeddings=512, type_vocab_size=2, hidden_size=128)
    assert excluded_reason(TensorInfo("encoder.layer.0.intermediate.dense.weight", (512, 128), "F32"), config) is None
    assert excluded_reason(TensorInfo("model.layers.0.mlp.up_proj.weight", (512, 128), "F32"), config) is None
    assert excluded_reason(TensorInfo("pos_table", (512, 128), "F32"), config).startswith("embedding/lookup table")


def test_a_checkpoints_pooler_gets_one_row_per_sequence():
    """BERT's pooler multiplies each sequence's first token only: N = sequences, not tokens (issue 22)."""
    infos = [TensorInfo("encoder.layer.0.output.dense.weight", (8, 8), "F32"),
             TensorInfo("bert.pooler.dense.weight", (8, 8), "F32"), TensorInfo("bert.pooler.dense.bias", (8,), "F32")]
    shapes = {s.layer: s for s in weight_shapes("bert", infos, tokens=4096, sequences=32)}
    assert shapes["bert.pooler.dense.weight"].n == 32 and shapes["encoder.layer.0.output.dense.weight"].n == 4096
    with pytest.raises(ValueError, match=r"bert\.pooler\.dense\.weight: a pooler's N is the number of sequences"):
        weight_shapes("bert", infos, tokens=4096)  # no guess: the caller says how many sequences
    with pytest.raises(ValueError, match="1 to tokens = 16"):
        weight_shapes("bert", infos, tokens=16, sequences=32)
    assert weight_shapes("net", infos[:1], tokens=64)[0].n == 64  # no pooler: nothing more to say
