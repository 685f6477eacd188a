"""Reading weights files: the header's tensor names, shapes and dtypes, one tensor's values, and the errors."""

from __future__ import annotations

import re

import numpy as np
import scipy.sparse as sp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from lospmm.flows.inputs.weights import WeightsFileError, load_tensor, tensor_infos

# numpy dtype -> the safetensors header's name for it
_DTYPES = {np.float32: "F32", np.float64: "F64", np.float16: "F16", np.int8: "I8", np.int32: "I32",
           np.int64: "I64", np.uint8: "U8", np.bool_: "BOOL"}


def test_infos_come_from_the_header_and_tensors_load_with_their_values(tmp_path):
    path = tmp_path / "model.safetensors"
    tensors = {"layer1.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
               "layer1.bias": np.array([1, -2, 3], dtype=np.int64),
               "scale": np.array(0.5, dtype=np.float16)}
    save_file(tensors, str(path))
    infos = {i.name: (i.shape, i.dtype) for i in tensor_infos(path)}
    assert infos == {"layer1.weight": ((3, 4), "F32"), "layer1.bias": ((3,), "I64"), "scale": ((), "F16")}
    assert all(isinstance(d, int) for i in tensor_infos(str(path)) for d in i.shape)  # str paths too
    for name, want in tensors.items():
        got = load_tensor(path, name)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@settings(max_examples=25, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z][a-z0-9_.]{0,12}", fullmatch=True),
                       st.tuples(st.sampled_from(sorted(_DTYPES, key=str)),
                                 st.lists(st.integers(0, 4), max_size=3)),
                       min_size=1, max_size=5))
def test_any_header_reads_back(tmp_path_factory, spec):
    # tmp_path_factory, not tmp_path: a function-scoped fixture would be shared by every example
    path = tmp_path_factory.mktemp("w") / "w.safetensors"
    save_file({n: np.zeros(shape, dtype) for n, (dtype, shape) in spec.items()}, str(path))
    got = {i.name: (i.shape, i.dtype) for i in tensor_infos(path)}
    assert got == {n: (tuple(shape), _DTYPES[dtype]) for n, (dtype, shape) in spec.items()}


def test_a_missing_file_or_a_directory_is_named(tmp_path):
    missing = tmp_path / "nope.safetensors"
    with pytest.raises(WeightsFileError, match="nope.safetensors"):
        tensor_infos(missing)
    with pytest.raises(WeightsFileError, match=re.escape(str(tmp_path))):
        tensor_infos(tmp_path)  # a directory is not a weights file


@pytest.mark.parametrize("junk", [b"", b"not a safetensors file at all", (10**6).to_bytes(8, "little") + b"{}"])
def test_a_junk_file_is_named(tmp_path, junk):
    path = tmp_path / "junk.safetensors"
    path.write_bytes(junk)
    with pytest.raises(WeightsFileError, match="junk.safetensors"):
        tensor_infos(path)
    assert issubclass(WeightsFileError, ValueError)  # callers that catch ValueError still catch it


@pytest.mark.parametrize("name, content", [
    ("model.pt", b"not even a pickle"),  # by its suffix
    ("weights", b"PK\x03\x04" + bytes(60)),  # torch.save's zip archive (torch >= 1.6)
    ("weights", b"\x80\x02\x8a\nl\xfc\x9cF" + bytes(60)),  # its older pickle
], ids=["suffix", "zip", "pickle"])
def test_a_torch_checkpoint_is_named_as_one_with_what_to_give_instead(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(WeightsFileError) as e:
        tensor_infos(path)
    line = str(e.value)
    assert "\n" not in line and str(path) in line and "looks like a torch checkpoint" in line
    assert "lt.search(model, example_input)" in line and "lt.save_model(model, example_input, 'model.safetensors')" in line


def test_a_missing_tensor_is_named(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"w": np.ones((2, 2), np.float32)}, str(path))
    with pytest.raises(ValueError, match=r"^encoder\.missing: .*model\.safetensors"):
        load_tensor(path, "encoder.missing")


def test_bfloat16_weights_load_as_the_same_float32_values(tmp_path):
    import json as json_
    import struct

    values = np.array([[1.0, -2.5, 3.140625], [0.0, 1e-3, -65280.0]], np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2")  # these values are exact in bfloat16
    header = json_.dumps({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, bf16.nbytes]}}).encode()
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bf16.tobytes())
    from lospmm.flows.inputs.weights import load_tensor, tensor_infos

    assert [(t.name, t.shape) for t in tensor_infos(path)] == [("w", (2, 3))]
    out = load_tensor(path, "w")
    assert out.dtype == np.float32 and out.shape == (2, 3)
    np.testing.assert_array_equal(out, (bf16.astype(np.uint32) << 16).view(np.float32).reshape(2, 3))
    assert out[0, 1] == -2.5 and out[1, 2] == -65280.0


def test_an_io_error_while_loading_stays_an_io_error(tmp_path, monkeypatch):
    """So the layer's failure counts as transient (retried, never cached), not as bad data."""
    import builtins
    import errno

    from lospmm.flows.inputs import weights as weights_module

    path = tmp_path / "w.safetensors"
    save_file({"w": np.ones((4, 4), np.float32)}, str(path))

    class FailingRead:
        def __init__(self, f):
            self._f = f

        def read(self, *a):
            raise OSError(errno.EIO, "Input/output error")

        def __getattr__(self, name):
            return getattr(self._f, name)

    monkeypatch.setattr(weights_module, "open", lambda *a, **k: FailingRead(builtins.open(*a, **k)), raising=False)
    with pytest.raises(OSError, match="Input/output error"):
        load_tensor(path, "w")


@pytest.mark.parametrize("model_type, transposed", [("gpt2", True), ("gpt_bigcode", False), (None, False)])
def test_a_gpt2_conv1d_weight_is_searched_as_its_transpose(tmp_path, model_type, transposed):
    """GPT-2's Conv1D stores a layer's weight input × output (y = x·W + b): its A (output × input) is the
    tensor transposed, told by config.json's model_type; GPT-BigCode's c_attn is an nn.Linear's, and a
    file without config.json is read as nn.Linear's layout."""
    import json

    import pyarrow.parquet as pq

    from lospmm.flows.config import RunConfig, resolved
    from tests.conftest import run_directly

    rng = np.random.default_rng(0)
    stored = {"h.0.attn.c_attn.weight": rng.standard_normal((16, 48)).astype(np.float32),  # in 16, out 48
              "h.0.mlp.c_fc.weight": rng.standard_normal((16, 64)).astype(np.float32),
              "h.0.attn.c_attn.bias": np.zeros(48, np.float32)}
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_file(stored, str(folder / "model.safetensors"))
    if model_type:
        (folder / "config.json").write_text(json.dumps({"model_type": model_type, "n_embd": 16}))
    plan = resolved(RunConfig(zoo=(), weights=str(folder / "model.safetensors"), tokens=32, m1s=(2,),
                              until="prune", prune="magnitude", artifacts=str(tmp_path / "art")))
    done = run_directly(plan, 0.5)
    shapes = {r["layer"]: r for r in pq.read_table(plan.root / done["extract"]["path"]).to_pylist() if r["op"] == "linear"}
    pruned = {r["layer"]: r for r in pq.read_table(plan.root / done["prune"]["path"]).to_pylist()}
    for name, w in stored.items():
        if w.ndim != 2:
            continue
        a = w.T if transposed else w
        assert (shapes[name]["m"], shapes[name]["k"]) == a.shape
        row = pruned[name]
        got = sp.csr_matrix((row["data"], row["indices"], row["indptr"]), shape=a.shape).toarray()
        assert np.array_equal(got != 0, np.abs(a) >= np.median(np.abs(a))) and np.array_equal(got[got != 0], a[got != 0])


def _sharded(folder, tensors: dict, shards: int = 2):
    """A sharded checkpoint as Hugging Face writes it: model-0000i-of-0000n.safetensors and the index."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    names, weight_map = list(tensors), {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[i::shards]}
        save_file(part, str(folder / shard), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(part, shard)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 0},
                                                                     "weight_map": weight_map}))
    return folder


def test_a_sharded_checkpoint_reads_as_one_model_from_its_index_or_its_folder(tmp_path):
    from lospmm.flows.inputs.weights import open_weights, weights_sha256

    rng = np.random.default_rng(0)
    tensors = {f"layer{i}.weight": rng.standard_normal((8, 4 + i)).astype(np.float32) for i in range(5)}
    folder = _sharded(tmp_path / "m", tensors)
    for given in (folder, folder / "model.safetensors.index.json"):
        assert sorted(i.name for i in tensor_infos(given)) == sorted(tensors)
        for name, want in tensors.items():
            np.testing.assert_array_equal(load_tensor(given, name), want)
        with pytest.raises(ValueError, match="nope.weight: no such tensor"):
            load_tensor(given, "nope.weight")
    # one SHA-256 over the index and every shard: any shard rewritten changes it
    before = weights_sha256(folder)
    assert before == weights_sha256(folder / "model.safetensors.index.json")
    with open_weights(folder, before) as f:
        assert len(f.infos()) == 5
    save_file({"layer1.weight": np.zeros((8, 5), np.float32), "layer3.weight": tensors["layer3.weight"]},
              str(folder / "model-00002-of-00002.safetensors"))
    assert weights_sha256(folder) != before
    from lospmm.flows.inputs.weights import WeightsChanged

    with pytest.raises(WeightsChanged, match="index and its shards"):
        open_weights(folder, before)


def test_a_sharded_checkpoints_faults_are_named(tmp_path):
    import json

    tensors = {f"l{i}.weight": np.ones((4, 4), np.float32) for i in range(4)}
    folder = _sharded(tmp_path / "m", tensors)
    index = folder / "model.safetensors.index.json"
    (folder / "model-00002-of-00002.safetensors").rename(folder / "moved.safetensors")
    with pytest.raises(WeightsFileError, match=re.escape(f"weights index {index}: its shard model-00002-of-00002."
                                                         f"safetensors (2 tensors, l1.weight first) is missing")):
        tensor_infos(folder)
    (folder / "moved.safetensors").rename(folder / "model-00002-of-00002.safetensors")
    listed = json.loads(index.read_text())
    listed["weight_map"]["l9.weight"] = "model-00001-of-00002.safetensors"
    index.write_text(json.dumps(listed))
    with pytest.raises(WeightsFileError, match="it puts tensor l9.weight in model-00001-of-00002.safetensors, whose "
                                               "header lacks it"):
        tensor_infos(index)
    index.write_text('{"weight_map": {}}')
    with pytest.raises(WeightsFileError, match="its weight_map names no tensors"):
        tensor_infos(index)
    index.unlink()  # two shards and no index: which model is meant cannot be told
    with pytest.raises(WeightsFileError, match="2 safetensors files .* and no index"):
        tensor_infos(folder)
    whole = (folder / "model-00001-of-00002.safetensors").read_bytes()
    (folder / "model-00001-of-00002.safetensors").write_bytes(whole[:-8])  # a shard cut short, named
    with pytest.raises(WeightsFileError, match="model-00001-of-00002.safetensors is cut short"):
        tensor_infos(folder / "model-00001-of-00002.safetensors")


def test_a_hugging_face_cache_snapshot_of_links_is_read_where_it_is_given(tmp_path):
    """The hub cache's snapshot folder holds links to blobs/<hash>: a path resolved through them named
    the index blobs/<hash>, read as one file (a nonsense header size). The run keeps the links."""
    import os

    from lospmm.flows.config import RunConfig, resolved
    from lospmm.flows.kernels import checked_unchanged

    tensors = {f"layer{i}.dense.weight": np.ones((16, 16), np.float32) for i in range(4)}
    made = _sharded(tmp_path / "made", tensors)
    blobs, snapshot = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "rev1"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, f in enumerate(sorted(made.iterdir())):
        f.rename(blobs / f"{i:040x}")
        os.symlink(blobs / f"{i:040x}", snapshot / f.name)
    (source,) = resolved(RunConfig(zoo=(), weights=str(snapshot))).sources
    assert source.path == str(snapshot / "model.safetensors.index.json") and source.label == "rev1"
    assert sorted(i.name for i in tensor_infos(source.path)) == sorted(tensors)
    # a shard gone since the run planned: the weights changed, in one line
    checked_unchanged(source.path, source.sha256)
    (snapshot / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ValueError, match="the weights changed since the run started .*its shard "
                                         "model-00002-of-00002.safetensors is not readable"):
        checked_unchanged(source.path, source.sha256)


def test_a_torch_checkpoints_shard_index_or_a_folder_of_none_is_named(tmp_path):
    (tmp_path / "pytorch_model.bin.index.json").write_text('{"weight_map": {"a": "pytorch_model-00001-of-00002.bin"}}')
    with pytest.raises(WeightsFileError, match="the index of a torch checkpoint's shards"):
        tensor_infos(tmp_path / "pytorch_model.bin.index.json")
    (tmp_path / "model.onnx").write_bytes(b"x")
    with pytest.raises(WeightsFileError, match=r"no safetensors file or index in it; give the file to read "
                                               r"\(model.onnx, pytorch_model.bin.index.json\)"):
        tensor_infos(tmp_path)
