"""lospmm.torch: the nn.Module importer, the search on a module, and the whole-model drop-in (host
emulation here; the same on the device under the `gpu` marker)."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import lospmm.torch as lt  # noqa: E402
from lospmm.flows.inputs.weights import saved_graph, tensor_infos  # noqa: E402
from lospmm.loader import KernelDirError, load_kernel  # noqa: E402
from lospmm.sparse_file import read_matrix  # noqa: E402
from lospmm.kernel.epilogue import Epilogue  # noqa: E402
from lospmm.stages.extract import graph_shapes  # noqa: E402


class Tiny(nn.Module):
    """Every kind of tensor the importer meets: convs (stride 2, padding, dilation, depthwise, 1×1),
    a norm with an integer buffer, an embedding, a linear layer used and one never called."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pw = nn.Conv2d(16, 32, 1)
        self.dilated = nn.Conv2d(32, 32, 3, padding=2, dilation=2, bias=False)
        self.table = nn.Embedding(7, 32)
        self.fc = nn.Linear(32, 10)
        self.unused = nn.Linear(32, 32)

    def forward(self, x, ids=None):
        x = torch.relu(self.bn(self.stem(x)))
        x = torch.relu(self.pw(self.dw(x)))
        x = torch.relu(self.dilated(x)).mean(dim=(2, 3))
        if ids is not None:
            x = x + self.table(ids)
        return self.fc(x)


def _model(seed=0):
    torch.manual_seed(seed)
    return Tiny().eval()


def test_the_importer_finds_each_gemm_weight_with_its_geometry_and_says_why_not_for_the_rest():
    x = torch.randn(2, 3, 16, 16)
    found = {w.name: w for w in lt.layer_weights(_model(), (x, torch.tensor([1, 2])))}
    assert set(found) == set(_model().state_dict())  # every tensor is listed
    stem, dilated, fc = found["stem.weight"], found["dilated.weight"], found["fc.weight"]
    assert (stem.op, stem.rows, stem.cols, stem.batch) == ("conv", 16, 27, 2)
    assert stem.conv == {"cin": 3, "kh": 3, "kw": 3, "stride": 2, "pad": 1, "groups": 1, "h_in": 16, "w_in": 16,
                         "h_out": 8, "w_out": 8, "dilation": 1}
    assert (dilated.conv["dilation"], dilated.conv["pad"], dilated.conv["h_out"]) == (2, 2, 8)
    assert (fc.op, fc.rows, fc.cols, fc.n) == ("linear", 10, 32, 2)  # N: the input's rows
    reasons = {name: w.reason for name, w in found.items() if not w.op}
    assert "bias of Conv2d" in reasons["stem.bias"]
    assert "BatchNorm2d" in reasons["bn.running_mean"] and "integer" in reasons["bn.num_batches_tracked"]
    assert "embedding/lookup table" in reasons["table.weight"]
    assert "not called by the example input" in reasons["unused.weight"]
    # the depthwise convolution: its own weight (16 × 1·3·3), searched as the dense convolution whose A is
    # that weight block-diagonal over all 16 input channels (K = 16·3·3)
    assert (found["dw.weight"].op, found["dw.weight"].cols, found["dw.weight"].conv["groups"]) == ("conv", 9, 16)
    shapes = {s.layer: s for s in graph_shapes("tiny", found.values(), tokens=1, batch=1)}
    assert (shapes["dw.weight"].k, shapes["dw.weight"].groups, shapes["dw.weight"].cin) == (16 * 9, 16, 16)
    assert (shapes["stem.weight"].n, shapes["fc.weight"].n) == (2 * 8 * 8, 2)
    assert sorted(s.layer for s in shapes.values() if s.ok) == ["dilated.weight", "dw.weight", "fc.weight",
                                                                "pw.weight", "stem.weight"]


class StdConv2d(nn.Conv2d):
    """timm-style: the weight standardised in forward, so the raw weight is not what it multiplies."""

    def forward(self, x):
        w = (self.weight - self.weight.mean(dim=(1, 2, 3), keepdim=True)) / (self.weight.std() + 1e-5)
        return self._conv_forward(x, w, self.bias)


def test_the_importer_leaves_the_model_as_it_was_and_skips_modules_with_their_own_forward():
    model = _model().train()
    model.pw = StdConv2d(16, 32, 1)
    before = model.bn.running_mean.clone()
    found = {w.name: w for w in lt.layer_weights(model, torch.randn(2, 3, 16, 16))}
    assert model.training and model.bn.training  # the mode is restored
    assert torch.equal(model.bn.running_mean, before)  # and the forward pass did not touch the statistics
    assert not found["pw.weight"].op and "overrides nn.Conv2d's forward" in found["pw.weight"].reason


def test_uneven_strides_and_other_padding_modes_are_excluded_with_the_reason():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=(1, 2)), nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect"))
    found = {w.name: w for w in lt.layer_weights(model, torch.randn(1, 3, 12, 12))}
    assert "uneven stride" in found["0.weight"].reason and "reflect" in found["1.weight"].reason


def test_a_saved_model_carries_its_geometry_to_extract(tmp_path):
    x = torch.randn(2, 3, 16, 16)
    path = lt.save_model(_model(), x, tmp_path / "tiny.safetensors")
    names = {t.name: t.shape for t in tensor_infos(path)}
    assert names == {"stem.weight": (16, 3, 3, 3), "pw.weight": (32, 16, 1, 1), "dilated.weight": (32, 32, 3, 3),
                     "fc.weight": (10, 32), "stem.bias": (16,), "pw.bias": (32,), "dw.weight": (16, 1, 3, 3),
                     "dw.bias": (16,), "fc.bias": (10,)}  # only GEMM weights travel, and the biases their kernels fuse
    graph = {w.name: w for w in saved_graph(path)}
    assert graph == {w.name: w for w in lt.layer_weights(_model(), x)}
    # what each kernel fuses: the module's bias, and the activation applied to its output alone (the
    # stem's output goes to its BatchNorm first, dw's to pw)
    assert {n: (w.bias, w.activation) for n, w in graph.items() if w.op} == {
        "stem.weight": ("stem.bias", ""), "dw.weight": ("dw.bias", ""), "pw.weight": ("pw.bias", "relu"),
        "dilated.weight": ("", "relu"), "fc.weight": ("fc.bias", "")}
    from safetensors.numpy import save_file

    save_file({"w": np.zeros((2, 2), np.float32)}, str(tmp_path / "plain.safetensors"))
    assert saved_graph(tmp_path / "plain.safetensors") is None
    with pytest.raises(ValueError, match="no nn.Linear or nn.Conv2d weight"):
        lt.save_model(nn.Sequential(nn.ReLU()), x, tmp_path / "none.safetensors")


@pytest.fixture(scope="module")
def searched(tmp_path_factory, prefect_server):
    """One search of Tiny at 0.7 (magnitude), every stage, host-checked kernels."""
    root = tmp_path_factory.mktemp("torch-run") / "artifacts"
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    run_id = lt.search(_model(), x, sparsity=0.7, artifacts=root, name="tiny", m1s=(1, 2, 4), jobs=2)
    return root, run_id, x


def test_sparsify_serves_the_whole_model_on_the_emitted_kernels(searched):
    root, run_id, x = searched
    model = _model()
    fast = lt.sparsify(model, run_id, backend="host", artifacts=root)
    ref = lt.pruned(model, run_id, artifacts=root)
    assert isinstance(fast.stem, lt.SparseConv2d) and isinstance(fast.fc, lt.SparseLinear)
    assert isinstance(fast.bn, nn.BatchNorm2d) and isinstance(model.stem, nn.Conv2d)  # the model itself is untouched
    assert {r.module for r in fast.lospmm_replacements} == {"stem", "dw", "pw", "dilated", "fc"}
    # the implicit-im2col kernels read NCHW X themselves
    assert all(isinstance(getattr(fast, m).kernel, lt.SpConv) for m in ("stem", "dw", "pw", "dilated"))
    # a loaded kernel says which layer it serves and how (it printed `<lospmm.loader.SpMM object at 0x…>`)
    shown = repr(fast.fc.kernel)
    assert shown.startswith("SpMM('fc.weight', M=10 K=32 nnz=") and "sparsity 0.7, fp32, tile " in shown and "backend 'host'" in shown
    assert repr(fast.stem.kernel).startswith("SpConv('stem.weight', M=") and " input, sparsity 0.7" in repr(fast.stem.kernel)
    # the depthwise layer too: its pruned weight, block-diagonal, in an implicit-conv kernel
    assert 0.65 < float((ref.dw.weight == 0).float().mean()) < 0.75 and ref.dw.weight.shape == (16, 1, 3, 3)
    # the reference holds the kernels' pruned weights: about 70% zeros in every searched layer
    assert 0.65 < float((ref.stem.weight == 0).float().mean()) < 0.75
    got = fast(x)  # no torch.no_grad() needed: the copy's own parameters (BN, depthwise) track no grad
    with torch.no_grad():
        want, dense = ref(x), model(x)
    scale = float(want.abs().max())
    assert float((got - want).abs().max()) / scale < 1e-5
    assert float((dense - want).abs().max()) / scale > 1e-3  # pruning changed the output: the test can tell
    with pytest.raises(ValueError, match=r"stem.weight: X must be batch×3×16×16 .*got \(2, 3, 20, 20\)"):
        fast(torch.randn(2, 3, 20, 20))  # a conv kernel reads the input size it was emitted for, no other


def test_every_conv_layer_of_the_run_was_emitted_as_an_implicit_conv_kernel(searched):
    import pyarrow.parquet as pq

    from lospmm.flows.storage.runs import run_record

    root, run_id, _ = searched
    record = run_record(root, run_id)
    emit = next(e for e in record["entries"] if e["stage"] == "emit")
    rows = {r["layer"]: r for r in pq.read_table(root / emit["path"]).to_pylist()}
    assert {k: r["form"] for k, r in rows.items()} == {"stem.weight": "implicit-conv", "pw.weight": "implicit-conv",
                                                       "dw.weight": "implicit-conv", "dilated.weight": "implicit-conv",
                                                       "fc.weight": "gemm"}
    assert all(r["check"] == "host-asan" and r["status"] == "ok" for r in rows.values())
    facts = json.loads((root / rows["dilated.weight"]["kernel_dir"] / "kernel.json").read_text())
    assert facts["conv"]["dilation"] == 2 and facts["epilogue"] == {"bias": False, "relu": True, "activation": "relu"}


def test_the_host_loader_runs_a_kernel_directory_against_scipy(searched):
    root, run_id, _ = searched
    d = next(p for p in lt.kernel_dirs(run_id, root) if p.name.startswith("fc_weight"))
    spmm = load_kernel(d, backend="host")
    a = read_matrix(d / "weight.parquet")
    b = np.random.default_rng(0).standard_normal((32, 45)).astype(np.float32)
    fused = spmm.spec.epilogue  # fc's kernel adds fc's bias itself
    assert fused.bias == tuple(_model().fc.bias.detach().numpy().tolist()) and not fused.activation
    assert np.abs(spmm(b) - fused.reference(a @ b)).max() < 1e-5
    assert np.abs(spmm(b) - a @ b).max() > 1e-3  # the bias is there: the comparison can tell
    with pytest.raises(ValueError, match="fc.weight: B must be 32×N"):
        spmm(b.T.copy())


def test_kernels_of_other_weights_are_refused_by_name(searched):
    root, run_id, _ = searched
    other = _model(seed=1)  # same architecture, other weights
    with pytest.raises(KernelDirError, match="5 of 5 kernels cannot serve.*differ from the model's weight: the kernel was built "
                                               "from other weights .a model searched as lt.fold_batchnorm.model. is served"):
        lt.sparsify(other, run_id, backend="host", artifacts=root)
    partly = _model()
    with torch.no_grad():
        partly.fc.weight.mul_(2.0)  # one layer fine-tuned after the search
    kept = lt.sparsify(partly, run_id, backend="host", artifacts=root, strict=False)
    assert isinstance(kept.fc, nn.Linear) and isinstance(kept.stem, lt.SparseConv2d)
    assert "fc.weight" in next(r.reason for r in kept.lospmm_replacements if r.layer == "fc.weight")
    with pytest.raises(KernelDirError, match="1 of 5 kernels cannot serve"):  # the reference refuses alike
        lt.pruned(partly, run_id, artifacts=root)
    assert torch.equal(lt.pruned(partly, run_id, artifacts=root, strict=False).fc.weight, partly.fc.weight)


def test_what_a_user_gets_wrong_is_named(searched, tmp_path):
    root, run_id, x = searched
    with pytest.raises(KernelDirError, match="emitted no kernels at sparsity 0.5; it has \\[0.7\\]"):
        lt.sparsify(_model(), run_id, backend="host", artifacts=root, sparsity=0.5)
    with pytest.raises(ValueError, match="lt.search: topk: not run option\\(s\\) of lt.search .* kwargs="):
        lt.search(_model(), x, artifacts=tmp_path, topk=3)
    fast = lt.sparsify(_model(), run_id, backend="host", artifacts=root)
    with pytest.raises(ValueError, match="fc.weight: input has 31 features, the kernel takes 32"):
        fast.fc(torch.randn(2, 31))
    from lospmm.kernel.cuda import gpu_present

    if not gpu_present():  # said before any work, by every way of loading a kernel
        kernel = lt.kernel_dirs(run_id, root)[0]
        for load in (lambda: lt.sparsify(_model(), run_id, artifacts=root), lambda: lt.sparse_linear(kernel),
                     lambda: load_kernel(kernel)):
            with pytest.raises(RuntimeError, match="no CUDA device here for backend='cuda'; backend='host'"):
                load()


def test_a_config_error_reads_in_keywords_but_a_command_it_quotes_keeps_its_flags():
    assert lt._as_keywords("--top-k must be >= 1; `lospmm kernel --design nm` writes it; --no-nm-kernel") == (
        "lt.search: top_k must be >= 1; `lospmm kernel --design nm` writes it; no_nm_kernel")


def test_a_kernel_file_edited_since_the_run_is_named_with_the_rerun_that_mends_it(searched, tmp_path):
    root, run_id, x = searched
    copy_root = tmp_path / "copied"
    shutil.copytree(root, copy_root)
    edited = next((copy_root / "10_kernels").glob("*/fc*/kernel.cu"))
    edited.write_text(edited.read_text() + "// edited\n")
    with pytest.raises(KernelDirError, match=f"/{edited.parent.name}/kernel.cu does not match its checksum in "
                                             f"SHA256SUMS; `lospmm rerun --stage emit {run_id} --artifacts "
                                             f"{copy_root}` rebuilds it"):
        lt.sparsify(_model(), run_id, backend="host", artifacts=copy_root)


def test_two_kernels_for_one_layer_serve_neither(searched, tmp_path):
    """A folder holding a run's kernels and a second one of a layer (`lospmm kernel --design …` beside
    them): which to serve is the user's choice, so that layer is refused by name, both directories
    named; strict=False serves the others and leaves it as it was."""
    root, run_id, x = searched
    folder = tmp_path / "mine"
    folder.mkdir()
    for d in lt.kernel_dirs(run_id, root):
        shutil.copytree(d, folder / d.name)
    fc = next(d for d in folder.iterdir() if d.name.startswith("fc"))
    shutil.copytree(fc, folder / "fc-again")
    plan = {r.kernel_dir: r for r in lt.replacements(_model(), folder)}
    for d in (fc, folder / "fc-again"):
        assert plan[str(d)].module == "" and plan[str(d)].reason == (
            f"fc.weight: 2 kernels in the source serve it (fc-again, {fc.name}): keep one")
    with pytest.raises(KernelDirError, match="2 of 6 kernels cannot serve the model: fc.weight: 2 kernels in the "
                                             "source serve it \\(fc-again, fc[^)]*\\): keep one$"):
        lt.sparsify(_model(), folder, backend="host")
    served = lt.sparsify(_model(), folder, backend="host", strict=False)
    assert isinstance(served.fc, nn.Linear) and isinstance(served.stem, lt.SparseConv2d)


class Keyworded(nn.Module):
    """A model called as a tokenizer's output is passed: keyword inputs, one of them optional."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.proj = nn.Linear(8, 6)

    def forward(self, input_ids, attention_mask=None):
        x = self.embed(input_ids)
        if attention_mask is not None:
            x = x * attention_mask[..., None]
        return self.proj(x)


def test_the_importer_takes_args_kwargs_and_a_mapping_as_torch_export_does():
    ids, mask = torch.randint(0, 11, (2, 5)), torch.ones(2, 5)
    by_mapping = lt.layer_weights(Keyworded(), {"input_ids": ids, "attention_mask": mask})
    assert {w.name: w.n for w in by_mapping if w.op} == {"proj.weight": 10}
    assert lt.layer_weights(Keyworded(), (ids,), {"attention_mask": mask}) == by_mapping
    assert lt.example_call(ids) == ((ids,), {})
    with pytest.raises(TypeError, match="example_input and kwargs both give attention_mask"):
        lt.example_call({"attention_mask": mask}, {"attention_mask": mask})


def test_a_wrong_example_input_or_option_is_one_line_and_writes_nothing(tmp_path):
    with pytest.raises(lt.ExampleInputError) as caught:
        lt.search(_model(), torch.randn(2, 5, 16, 16), artifacts=tmp_path)
    line = str(caught.value)
    assert "\n" not in line and line.startswith("Tiny: its forward pass failed on the example input (tensor(2, 5, 16, 16) "
                                                  "float32): RuntimeError:")
    with pytest.raises(ValueError, match="^lt.search: top_k must be >= 1, got 0$"):
        lt.search(_model(), torch.randn(2, 3, 16, 16), artifacts=tmp_path, top_k=0)
    with pytest.raises(ValueError, match="^lt.search: sparsity 1.5: "):
        lt.search(_model(), torch.randn(2, 3, 16, 16), sparsity=1.5, artifacts=tmp_path)
    with pytest.raises(ValueError, match="lt.search: attention_mask: not run option"):
        lt.search(Keyworded(), torch.randint(0, 11, (2, 5)), artifacts=tmp_path, attention_mask=torch.ones(2, 5))
    assert not any(tmp_path.rglob("*.safetensors"))  # checked before any model file is written


def test_an_already_pruned_model_is_searched_at_its_own_sparsity(tmp_path):
    model = _model()
    with torch.no_grad():
        for m in (model.stem, model.pw, model.dilated, model.fc):
            m.weight.mul_((torch.rand(m.weight.shape, generator=torch.Generator().manual_seed(0)) > 0.7).float())
    path = lt.save_model(model, torch.randn(2, 3, 16, 16), tmp_path / "m.safetensors")
    from lospmm.flows.config import RunConfig, resolved
    from lospmm.flows.inputs.layers import kept_sparsity

    def source(p):
        return resolved(RunConfig(zoo=(), weights=str(p), prune="keep", sparsities=(0.5,),
                                  artifacts=str(tmp_path))).sources[0]

    # the searched layers' zeros: the depthwise conv, the biases and the table are not searched
    assert kept_sparsity(source(path)) == pytest.approx(0.7, abs=0.02)
    dense = lt.save_model(_model(), torch.randn(2, 3, 16, 16), tmp_path / "dense.safetensors")
    with pytest.raises(ValueError, match="dense.safetensors: --prune keep keeps the zeros .* hold none"):
        kept_sparsity(source(dense))
    for sparsity in ([0.7], "0.7", True):  # one number: not a list (a TypeError from deep inside) nor a string
        with pytest.raises(ValueError, match="^lt.search: sparsity must be one number in \\(0, 1\\)"):
            lt.search(model, torch.randn(2, 3, 16, 16), prune="keep", sparsity=sparsity, artifacts=tmp_path)
    for sparsity in (None, 0.9):  # a sparsity given does not make a dense model pruned
        with pytest.raises(ValueError, match="^lt.search: .* prune keep keeps the zeros .* hold none: prune them first"):
            lt.search(_model(), torch.randn(2, 3, 16, 16), prune="keep", sparsity=sparsity, artifacts=tmp_path)
    with pytest.raises(ValueError, match="^lt.search: .* a share of 0.[67][0-9]*, and prunes nothing: leave sparsity out"):
        lt.search(model, torch.randn(2, 3, 16, 16), prune="keep", sparsity=0.9, artifacts=tmp_path)


def test_kernels_that_compute_something_else_are_refused(searched, tmp_path):
    from lospmm.flows.kernels import write_full_kernel
    from lospmm.flows.storage.runs import run_record

    root, run_id, _ = searched
    fused = tmp_path / "stem-relu"  # same weights, ReLU fused: the model's BN comes before its ReLU
    write_full_kernel(str(root), run_record(root, run_id), "stem.weight", 2, 64, str(fused), implicit_conv=True,
                      relu=True)
    with pytest.raises(KernelDirError, match="stem.weight: the kernel fuses relu"):
        lt.sparsify(_model(), fused, backend="host")
    strided = _model()
    strided.stem.stride = (1, 1)  # same name, same weights, another convolution
    plan = {r.layer: r for r in lt.replacements(strided, run_id, root)}
    assert "is not the module's" in plan["stem.weight"].reason and plan["pw.weight"].module == "pw"
    standardised = _model()
    plain_pw = standardised.pw
    standardised.pw = StdConv2d(16, 32, 1)
    standardised.pw.load_state_dict(plain_pw.state_dict())
    plan = {r.layer: r for r in lt.replacements(standardised, run_id, root)}
    assert "overrides nn.Conv2d's forward" in plan["pw.weight"].reason


def test_a_module_under_two_names_is_replaced_under_both(searched):
    root, run_id, x = searched
    model = _model()
    model.head = model.fc  # one module, two names
    found = {w.name: w for w in lt.layer_weights(model, x)}
    assert found["fc.weight"].op == "linear" and "the same tensor as fc.weight" in found["head.weight"].reason
    model.table = nn.Embedding(10, 32)
    model.table.weight = model.fc.weight  # a table tied to a searched weight (a decoder tied to its embedding)
    fast, ref = lt.sparsify(model, run_id, backend="host", artifacts=root), lt.pruned(model, run_id, artifacts=root)
    assert fast.head is fast.fc and isinstance(fast.head, lt.SparseLinear)
    assert ref.head is ref.fc and float((ref.head.weight == 0).float().mean()) > 0.6
    assert float((model.fc.weight == 0).float().mean()) < 0.1  # pruned() leaves the model's own weights alone
    assert torch.equal(ref.table.weight, model.fc.weight)  # the tied table is no GEMM: it keeps every value


def test_the_sparsified_model_is_for_inference(searched):
    root, run_id, x = searched
    fast = lt.sparsify(_model(), run_id, backend="host", artifacts=root)
    with pytest.raises(RuntimeError, match="stem.weight: an emitted kernel has no backward"):
        fast(x.clone().requires_grad_())
    with torch.no_grad():
        assert fast(x.clone().requires_grad_()).shape == (2, 10)
    # the operators themselves, called directly: refused by name, not passed by at backward
    b = torch.randn(32, 5, requires_grad=True)
    with pytest.raises(RuntimeError, match="fc.weight: an emitted kernel has no backward"):
        torch.ops.lospmm.spmm(b, fast.fc.name)
    with pytest.raises(RuntimeError, match="stem.weight: an emitted kernel has no backward"):
        torch.ops.lospmm.conv(x.clone().requires_grad_(), fast.stem.name)


def test_an_im2col_kernel_of_a_convolution_serves_it_through_unfold(searched, tmp_path):
    from lospmm.flows.kernels import write_full_kernel
    from lospmm.flows.storage.runs import run_record

    root, run_id, x = searched
    out = tmp_path / "stem-gemm"
    write_full_kernel(str(root), run_record(root, run_id), "stem.weight", 2, 64, str(out))  # no --implicit-conv
    model = _model()
    fast = lt.sparsify(model, out, backend="host")
    assert isinstance(fast.stem, lt.SparseConv2d) and isinstance(fast.stem.kernel, lt.SpMM)
    ref = lt.pruned(model, out)
    with torch.no_grad():
        got, want = fast(x), ref(x)
    assert float((got - want).abs().max()) / float(want.abs().max()) < 1e-5


@pytest.mark.parametrize("design, served", [("streamed,chained", "streamed"), ("staged,tiles=4", "staged,tiles=4"),
                                            ("chained,v=2", "v=2"), ("chained,v=2,slices=2", "chained,v=2,slices=2")])
def test_a_streamed_staged_vector_or_sliced_conv_kernel_serves_its_convolution_with_its_bias_and_activation(
        searched, tmp_path, design, served):
    # the streamed design's implicit-im2col kernel (one loop over the layer's data), the staged one's (a
    # block's copy gathers its tiles' window inputs), a vector one's (two pixels a thread, each lane its
    # own window) and a sliced one's (a tile's columns over two groups of warps, summed through shared
    # memory) fuse the run's bias and ReLU of pw as the baked one does; served in place of the module,
    # each computes the pruned model's output
    from lospmm.flows.kernels import write_full_kernel
    from lospmm.flows.storage.runs import run_record
    from lospmm.kernel.design import design_named

    root, run_id, x = searched
    out = tmp_path / f"pw-{served}"
    facts = write_full_kernel(str(root), run_record(root, run_id), "pw.weight", 4,
                              design_named(design).fixed_n1 or 64, str(out), implicit_conv=True,
                              design=design_named(design))
    assert facts["design"]["label"] == design_named(served).label and facts["host_check"]["status"] == "ok"
    assert facts["epilogue"]["bias"] and facts["epilogue"]["activation"] == "relu"
    model = _model()
    fast = lt.sparsify(model, out, backend="host")
    assert isinstance(fast.pw, lt.SparseConv2d) and isinstance(fast.pw.kernel, lt.SpConv)
    with torch.no_grad():
        got, want = fast(x), lt.pruned(model, out)(x)
    assert float((got - want).abs().max()) / float(want.abs().max()) < 1e-5


def test_a_streamed_search_serves_every_layer_of_a_cnn_in_its_design_with_its_bias_and_activation(tmp_path,
                                                                                                  prefect_server):
    # the streamed design serves convolutions (its conv kernel) and fuses each layer's bias and ReLU: a
    # search in it serves the whole model in it (before, the layers with a bias fell back to the baseline
    # and the convolutions were im2col GEMMs), as the pruned model computes
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    root = tmp_path / "artifacts"
    run_id = lt.search(_model(), x, sparsity=0.7, artifacts=root, name="tiny", m1s=(1, 2, 4), jobs=2, design="streamed")
    fast = lt.sparsify(_model(), run_id, backend="host", artifacts=root)
    designs = {r.module: json.loads((Path(r.kernel_dir) / "kernel.json").read_text())["design"]["label"]
               for r in fast.lospmm_replacements}
    assert designs == dict.fromkeys(("stem", "dw", "pw", "dilated", "fc"), "streamed,based,tile-x,walks=1,v=1")
    assert all(isinstance(getattr(fast, m).kernel, lt.SpConv) for m in ("stem", "dw", "pw", "dilated"))
    with torch.no_grad():
        got, want = fast(x), lt.pruned(_model(), run_id, artifacts=root)(x)
    assert float((got - want).abs().max()) / float(want.abs().max()) < 1e-5


@pytest.mark.gpu
def test_sparsify_on_the_device(tmp_path, prefect_server):
    """The same drop-in on the GPU: searched with the `cuda` timer, kernels launched on torch CUDA tensors."""
    root = tmp_path / "artifacts"
    x = torch.randn(4, 3, 16, 16)
    model = _model()
    run_id = lt.search(model, x, sparsity=0.7, artifacts=root, name="tiny", m1s=(1, 2, 4), timer="cuda")
    fast = lt.sparsify(model, run_id, backend="cuda", artifacts=root).cuda()
    ref = lt.pruned(model, run_id, artifacts=root)  # on the CPU: cuDNN may use TF32
    with torch.no_grad():
        got, want = fast(x.cuda()).cpu(), ref(x)
    assert all(isinstance(getattr(fast, m).kernel, lt.SpConv) for m in ("stem", "pw", "dilated"))
    assert float((got - want).abs().max()) / float(want.abs().max()) < 1e-4
    # the registered operators launch on torch's current stream: a CUDA graph captures them, and
    # torch.compile's CUDA graphs (reduce-overhead) replay them
    static_x = x.cuda()
    with torch.no_grad():
        fast(static_x)  # warm-up: modules loaded outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = fast(static_x)
        static_x.copy_(x.cuda() * 2)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(static_y.cpu(), fast(x.cuda() * 2).cpu())
        compiled = torch.compile(fast, fullgraph=True, mode="reduce-overhead")
        for _ in range(3):  # recorded, then replayed
            out = compiled(x.cuda())
        torch.testing.assert_close(out.cpu(), got)


def test_batchnorm_folds_into_the_preceding_convolution():
    """The inference transform: the folded copy computes what the model computes in eval mode, has
    no BatchNorm after a convolution, and its convolutions carry the folded scale and bias, so a
    search of it prunes and bakes the folded weights. An untraceable model is one clear error."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 4, 1), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 25, 3))
    for bn in (model[1], model[4]):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.data.uniform_(0.5, 1.5)
        bn.bias.data.uniform_(-1, 1)
    model.train()
    folded = lt.fold_batchnorm(model)
    x = torch.randn(2, 3, 5, 5)
    assert model.training  # the model itself is left as it was
    assert not any(isinstance(m, nn.BatchNorm2d) for m in folded.modules())
    assert type(folded).__name__ == "Sequential"  # lt.search names the model's files by it
    torch.testing.assert_close(folded(x), model.eval()(x), rtol=1e-5, atol=1e-5)
    convs = [m for m in folded.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 2 and all(c.bias is not None for c in convs)
    assert not torch.equal(convs[0].weight, model[0].weight)  # scaled by gamma / sqrt(var + eps)
    names = {w.name for w in lt.layer_weights(folded, x) if w.op in ("conv", "linear")}
    assert len(names) == 3

    class Branchy(nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x  # data-dependent: fx cannot trace it

    with pytest.raises(ValueError, match="torch.fx cannot trace the model"):
        lt.fold_batchnorm(Branchy())


def test_the_kernels_are_registered_operators_that_torch_compile_traces_whole(searched):
    """torch.ops.lospmm.spmm / conv: a fake implementation from kernel.json alone (shapes without
    running a kernel), opcheck's schema and fake checks, and a sparsified model under
    torch.compile(fullgraph=True) — no graph break — computing what it computes eagerly."""
    root, run_id, x = searched
    fast = lt.sparsify(_model(), run_id, backend="host", artifacts=root)
    name = fast.fc.name
    assert name.startswith("host|") and name.endswith(fast.fc.kernel.dir.name)
    b = torch.randn(32, 5)
    torch.library.opcheck(torch.ops.lospmm.spmm.default, (b, name),
                          test_utils=("test_schema", "test_faketensor"))
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fake = torch.ops.lospmm.conv(torch.empty(7, 3, 16, 16), fast.stem.name)
    assert tuple(fake.shape) == (7, *fast.stem(x).shape[1:])  # the stem's stride 2 read from kernel.json
    torch._dynamo.reset()
    compiled = torch.compile(fast, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), fast(x))


def test_a_sparsified_model_exports_with_its_kernels_named(searched, tmp_path):
    """torch.export keeps each kernel as one lospmm op call whose argument names its kernel
    directory: the exported program, saved and loaded again, runs the same kernels."""
    root, run_id, x = searched
    fast = lt.sparsify(_model(), run_id, backend="host", artifacts=root)
    exported = torch.export.export(fast, (x,))
    calls = [n for n in exported.graph.nodes if n.op == "call_function" and "lospmm" in str(n.target)]
    assert sorted(str(n.target) for n in calls) == ["lospmm.conv.default"] * 4 + ["lospmm.spmm.default"]
    assert {n.args[1] for n in calls} == {fast.stem.name, fast.dw.name, fast.pw.name, fast.dilated.name,
                                            fast.fc.name}
    torch.export.save(exported, tmp_path / "fast.pt2")
    again = torch.export.load(tmp_path / "fast.pt2")
    torch.testing.assert_close(again.module()(x), fast(x))


class GeluOutput(nn.Module):
    """transformers' GELUActivation in miniature: a module without parameters that applies F.gelu."""

    def forward(self, x):
        return nn.functional.gelu(x)


class Fusions(nn.Module):
    """Each pattern the importer reads: a GELU module after a layer, a wrapper module, a functional
    GELU (not fusable: the model's code applies it), a tanh GELU (another function), a shared ReLU
    (fused: applying it again changes nothing), and a layer whose output is also used elsewhere."""

    def __init__(self):
        super().__init__()
        self.up, self.act = nn.Linear(8, 16), nn.GELU()
        self.mid, self.wrapped = nn.Linear(16, 16), GeluOutput()
        self.functional = nn.Linear(16, 16)
        self.tanh = nn.Linear(16, 16)
        self.shared_a, self.shared_b, self.relu = nn.Linear(16, 16), nn.Linear(16, 16), nn.ReLU()
        self.residual = nn.Linear(16, 16)

    def forward(self, x):
        x = self.wrapped(self.mid(self.act(self.up(x))))
        x = nn.functional.gelu(self.functional(x))
        x = nn.functional.gelu(self.tanh(x), approximate="tanh")
        x = self.relu(self.shared_b(self.relu(self.shared_a(x))))
        y = self.residual(x)
        return torch.relu(y) + y


def test_the_importer_reads_which_activation_each_kernel_can_fuse():
    assert lt.following_activations(Fusions()) == {"up": "gelu", "mid": "gelu", "shared_a": "relu",
                                                   "shared_b": "relu"}

    class Untraceable(Fusions):  # data-dependent control flow where the layers are called: nothing is guessed
        def forward(self, x):
            return super().forward(x) if bool(x.sum() > 0) else x

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Fusions()

        def forward(self, x):
            return self.inner(x) if bool(x.sum() > 0) else x

    assert lt.following_activations(Untraceable()) == {}
    # … while a model untraceable above its layers is read in each layer's parent
    assert lt.following_activations(Outer()) == {"inner.up": "gelu", "inner.mid": "gelu", "inner.shared_a": "relu",
                                                 "inner.shared_b": "relu"}


def test_a_gelu_kernel_replaces_the_layer_and_its_gelu_module(tmp_path, prefect_server):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 32), nn.GELU(), nn.Linear(32, 8)).eval()
    x = torch.randn(6, 24)
    root = tmp_path / "artifacts"
    run_id = lt.search(model, x, sparsity=0.7, artifacts=root, name="mlp", m1s=(1, 2), jobs=2)
    fast = lt.sparsify(model, run_id, backend="host", artifacts=root)
    assert {r.layer: r.fused for r in fast.lospmm_replacements} == {"0.weight": "bias+gelu", "2.weight": "bias"}
    assert isinstance(fast[1], nn.Identity) and isinstance(model[1], nn.GELU)  # the kernel applies it now
    with torch.no_grad():
        want = lt.pruned(model, run_id, artifacts=root)(x)
    assert float((fast(x) - want).abs().max()) / float(want.abs().max()) < 1e-5
    # the same kernels refuse a model that applies no GELU there
    plain = nn.Sequential(model[0], nn.Identity(), model[2])
    with pytest.raises(KernelDirError, match="0.weight: the kernel fuses gelu, but the model does not apply gelu"):
        lt.sparsify(plain, run_id, backend="host", artifacts=root)
    biased = copy.deepcopy(model)
    with torch.no_grad():
        biased[2].bias.add_(1.0)
    with pytest.raises(KernelDirError, match="2.weight: the kernel fuses a bias that is not the module's"):
        lt.sparsify(biased, run_id, backend="host", artifacts=root)


class WrappedGelu(nn.Module):
    """A wrapper without parameters whose child does more than the GELU: not the activation alone."""

    def __init__(self):
        super().__init__()
        self.post = Doubler()

    def forward(self, x):
        return self.post(nn.functional.gelu(x))


class Doubler(nn.Module):
    def forward(self, x):
        return x * 2


class OptionalGelu(nn.Module):
    """The GELU runs only when `scale` is given; symbolic tracing takes that branch."""

    def __init__(self):
        super().__init__()
        self.fc, self.act = nn.Linear(8, 8), nn.GELU()

    def forward(self, x, scale=None):
        y = self.fc(x)
        return self.act(y) * scale if scale is not None else y


class SharedLayer(nn.Module):
    """One nn.Linear under two names: followed by ReLU under one, used bare under the other, in a model
    fx cannot trace whole (data-dependent control flow at the top)."""

    def __init__(self):
        super().__init__()
        fc = nn.Linear(8, 8)
        self.a, self.b = ReluAfter(fc), Bare(fc)

    def forward(self, x):
        return self.a(x) + self.b(x) if bool(x.sum() > -1e9) else x


class ReluAfter(nn.Module):
    def __init__(self, fc):
        super().__init__()
        self.fc = fc

    def forward(self, x):
        return torch.relu(self.fc(x))


class Bare(ReluAfter):
    def forward(self, x):
        return self.fc(x)


def test_a_fusion_is_kept_only_where_the_example_input_computes_the_same():
    x = torch.randn(3, 8)
    wrapped = nn.Sequential(nn.Linear(8, 8), WrappedGelu())
    assert lt.following_activations(wrapped) == {}  # the wrapper's child doubles: not the GELU alone
    assert {w.name: w.activation for w in lt.layer_weights(wrapped, x) if w.op} == {"0.weight": ""}
    optional = OptionalGelu()
    assert lt.following_activations(optional) == {"fc": "gelu"}  # what the graph read says …
    assert {w.name: w.activation for w in lt.layer_weights(optional, x) if w.op} == {"fc.weight": ""}  # … refuted
    assert {w.name: w.activation for w in lt.layer_weights(optional, (x, torch.tensor(2.0))) if w.op} == {
        "fc.weight": "gelu"}  # the branch the example takes
    shared = SharedLayer()
    assert lt.following_activations(shared) == {}


def test_a_kernel_fusing_an_activation_but_not_the_modules_bias_is_refused(tmp_path):
    import scipy.sparse as sp

    from lospmm.flows.kernels import emitted_kernel
    from lospmm.stages.reorder import reordered_tiles

    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU())
    a = sp.csr_matrix(model[0].weight.detach().numpy())
    emitted_kernel(str(tmp_path), a, reordered_tiles(a, 1), "0.weight", 0.0, 32, "sm_90", tmp_path / "k",
                   compile_=False, verify=False, epilogue=Epilogue(activation="relu"))
    (plan,) = lt.replacements(model, tmp_path / "k")
    assert "fuses relu but not the module's bias" in plan.reason and not plan.module


def test_an_fp16_kernel_of_fp32_weights_serves_the_model_in_fp16(tmp_path):
    """A run with --dtype fp16 of an fp32 file: its kernel rounds A to fp16 and fuses the file's bias.
    The model converted to fp16 is served by it (its bias is the file's rounded, as the kernel's is);
    the fp32 model is refused, saying to convert it, not to give --dtype (the run had it)."""
    import scipy.sparse as sp

    from lospmm.flows.config import source_design
    from lospmm.flows.kernels import emitted_kernel
    from lospmm.kernel.design import design_named
    from lospmm.stages.reorder import reordered_tiles

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8)).eval()
    with torch.no_grad():
        model[0].bias.copy_(torch.randn(8) * 1e-2 + 1 / 3)  # values fp16 cannot hold exactly
    a = sp.csr_matrix(model[0].weight.detach().numpy())
    emitted_kernel(str(tmp_path), a, reordered_tiles(a, 1), "0.weight", 0.0, 32, "sm_90", tmp_path / "k",
                   compile_=False, verify=False, design=source_design(design_named("chained"), "fp16"),
                   epilogue=Epilogue(tuple(model[0].bias.tolist())))
    (fp16,) = lt.replacements(copy.deepcopy(model).half(), tmp_path / "k")
    assert fp16.module == "0" and fp16.fused == "bias", fp16.reason
    (fp32,) = lt.replacements(model, tmp_path / "k")
    assert "the kernel computes in fp16, the module's weight is float32" in fp32.reason and \
        "model.to(torch.float16)" in fp32.reason and not fp32.module
    # lt.pruned is the reference in any dtype: the fp32 model keeps its own fp32 values where the kernel keeps a weight
    reference = lt.pruned(model, tmp_path / "k")
    assert reference[0].weight.dtype == torch.float32 and torch.equal(reference[0].weight, model[0].weight)
    with torch.no_grad():
        model[0].weight[0, 0] += 0.5  # another weight than the kernel's, even in fp16
    with pytest.raises(KernelDirError, match="1 of the kernel's 128 nonzeros differ from the model's weight"):
        lt.pruned(model, tmp_path / "k")


def test_a_half_model_is_searched_and_served_in_its_own_dtype(tmp_path, prefect_server):
    """An fp16 model: its file keeps fp16, the run's kernels are fp16 (half kernels, GEMM form, the
    model's bias and ReLU fused), and the served model computes in fp16 — no silent upcast — within
    fp16's rounding of the pruned model computed in float64."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 8)).eval().half()
    x = torch.randn(6, 24).half()
    root = tmp_path / "artifacts"
    run_id = lt.search(model, x, sparsity=0.7, artifacts=root, name="mlp16", m1s=(1, 2), jobs=2)
    fast = lt.sparsify(model, run_id, backend="host", artifacts=root)
    # the bias and the ReLU fused into the half kernels, as in fp32
    assert {r.layer: (r.module, r.fused) for r in fast.lospmm_replacements} == {"0.weight": ("0", "bias+relu"),
                                                                               "2.weight": ("2", "bias")}
    facts = fast[0].kernel.facts
    assert facts["precision"]["dtype"] == "fp16" and facts["host_check"]["status"] == "ok"
    assert facts["design"]["dtype"] == "fp16" and facts["launch"]["columns_per_thread"] == 2
    # searched as a half kernel: half candidates (B tiles 2·N1 wide), half proxies, the half ranker,
    # and an estimate of the half kernel itself
    from lospmm.flows.storage.ranker_store import ranker_metadata, shipped_ranker
    from lospmm.flows.storage.runs import artifacts_of, run_record
    from lospmm.flows.storage.store import read_artifact

    record = run_record(str(root), run_id)

    def rows(stage):
        return [r for e in artifacts_of(record, stage) for r in read_artifact(root / e["path"]).to_pylist()]

    assert all(r["num_b_tiles"] == -(-r["n"] // (2 * r["n1"])) for r in rows("constrain") if r["n1"])
    assert {r["ranker"] for r in rows("rank")} == {f"lambdamart:{ranker_metadata(shipped_ranker(half=True))['version']}"}
    proxies = [r["kernel"] for r in rows("compile") if r["status"] == "ok"]
    assert proxies and all(k.startswith("lospmm_half_proxy") for k in proxies)
    emitted = rows("emit")
    assert {r["dtype"] for r in emitted} == {"fp16"} and all(r["full_time_us"] > 0 for r in emitted)
    got = fast(x)
    assert got.dtype == torch.float16
    with torch.no_grad():
        want = lt.pruned(model, run_id, artifacts=root).double()(x.double())
    assert float((got.double() - want).abs().max()) <= 0.02 * float(want.abs().max())
    with pytest.raises(KernelDirError, match="0.weight: the kernel computes in fp16, the module's weight is float32"):
        lt.sparsify(copy.deepcopy(model).float(), run_id, backend="host", artifacts=root)
    torch.manual_seed(0)  # the same model never converted: fp32 weights that fp16 cannot hold; the dtype is named
    fp32 = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    with pytest.raises(KernelDirError, match="0.weight: the kernel computes in fp16, the module's weight is float32"):
        lt.sparsify(fp32, run_id, backend="host", artifacts=root)


def test_an_nm_pruned_model_is_served_by_nm_kernels(tmp_path, prefect_server):
    """prune="nm:4:8:8": every Linear of an MLP is served by the N:M kernel (the estimate's choice, its
    compressed A filled from weight.parquet), ReLU fused, equal to the pruned model on the host."""
    import pyarrow.parquet as pq

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64)).eval()
    x = torch.randn(256, 64)
    root = tmp_path / "artifacts"
    run_id = lt.search(model, x, prune="nm:4:8:8", artifacts=root, name="mlp", m1s=(1, 2, 4), jobs=2)
    rows = pq.read_table(next((root / "10_kernels").glob("*.parquet"))).to_pylist()
    assert [r["design"].split(" ")[0] for r in rows] == ["nm", "nm"] and all(r["check"] == "host-asan" for r in rows)
    fast = lt.sparsify(model, run_id, backend="host", artifacts=root)
    with torch.no_grad():
        got, want = fast(x[:5]), lt.pruned(model, run_id, artifacts=root)(x[:5])
    assert isinstance(fast[1], nn.Identity)  # the ReLU went into the first kernel
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_layer_that_gets_no_kernel_is_a_warning_naming_it(tmp_path, prefect_server):
    """As `lospmm run` exits 3 naming it: a layer the pattern cannot take (K = 30, not a multiple of 4)
    is named by lt.search in a SearchWarning with its reason, and the others go on. Where no layer
    gets one, there is nothing to serve: RuntimeError, and the run's kernels are no source."""
    model = nn.Sequential(nn.Linear(32, 30), nn.ReLU(), nn.Linear(30, 8)).eval()
    with pytest.warns(lt.SearchWarning, match="lt.search: 1 of 2 layers did not produce what was asked: 2.weight: "
                                              "K=30 is not a multiple of M=4 .* \\(`lospmm inspect "):
        lt.search(model, torch.randn(16, 32), prune="nm:2:4", artifacts=tmp_path, until="prune")
    narrow = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6)).eval()
    with pytest.raises(RuntimeError, match="lt.search: 2 of 2 layers did not produce what was asked: 0.weight: "
                                           "K=6 is not a multiple of M=4") as failed:
        lt.search(narrow, torch.randn(16, 6), prune="nm:2:4", artifacts=tmp_path)
    run_id = re.search(r"`lospmm inspect (\S+) --artifacts ", str(failed.value))[1]  # (pasted as said, it finds the run)
    with pytest.raises(KernelDirError, match=f"run {run_id}: no layer got a kernel"):
        lt.sparsify(narrow, run_id, backend="host", artifacts=tmp_path, strict=False)


def test_a_pruned_model_searched_without_keep_is_a_warning_naming_keep(tmp_path, prefect_server):
    """A model pruned before lt.search (torch.nn.utils.prune's 80% here) and pruned again by magnitude
    at 0.7: its layers keep their own zeros, sparser than asked, and lt.search says so and names
    prune="keep"; with keep it says nothing."""
    import warnings

    from torch.nn.utils import prune

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
    prune.l1_unstructured(model[0], "weight", amount=0.8)
    with pytest.warns(lt.SearchWarning, match="1 of its 2 searched layers already held zeros \\(80.0% of their "
                                              "weights: pruned before\\?\\) and were pruned again by magnitude to 0.7; prune='keep' .*"
                                              "at sparsity 0.7 they kept their own zeros"):
        run_id = lt.search(model, torch.randn(16, 32), sparsity=0.7, artifacts=tmp_path, until="prune")
    with pytest.raises(KernelDirError, match=f"no kernels to serve: run {run_id} stopped after prune \\(--until prune\\)"):
        lt.sparsify(model, run_id, backend="host", artifacts=tmp_path)  # (it said "0 emitted (model, sparsity) sets")
    with warnings.catch_warnings():
        warnings.simplefilter("error", lt.SearchWarning)
        lt.search(model, torch.randn(16, 32), prune="keep", artifacts=tmp_path, until="prune")


def test_one_model_serves_a_mix_of_kernel_designs(tmp_path):
    """Three layers in three designs (baked v=4 walking, streamed, the N:M kernel), each directory
    carrying its own: one nn.Sequential of SparseLinear serves them together, as the pruned model."""
    from lospmm.flows.kernels import emitted_kernel
    from lospmm.kernel.choices import NM_DESIGN
    from lospmm.kernel.design import design_named
    from lospmm.kernel.nm import NMTiling
    from lospmm.stages.prune import NMPattern, random_nm_pruned, random_pruned
    from lospmm.stages.reorder import reordered_tiles

    rng = np.random.default_rng(0)
    layers = [(random_pruned(96, 64, 0.8, rng), "chained,v=4,walks=2", None),
              (random_pruned(64, 96, 0.7, rng), "streamed,chained", None),
              # 4:32 in vectors of 32 rows: its stages gather B's rows (a third module global, filled too)
              (random_nm_pruned(32, 64, NMPattern(4, 32, 32), rng), "nm", NMTiling(4, 32, 32, 32, 64, 8, 4))]
    modules = []
    for i, (a, design, nm) in enumerate(layers):
        out = tmp_path / f"k{i}"
        facts = emitted_kernel(str(tmp_path), a, None if nm else reordered_tiles(a, 4), f"l{i}", 0.8, 32, "sm_90",
                               out, verify=False, design=NM_DESIGN if nm else design_named(design), nm=nm)
        assert facts["compile"]["status"] == "ok" and facts["design"]["label"] == (
            NM_DESIGN if nm else design_named(design)).label
        modules.append(lt.sparse_linear(out, backend="host"))
    assert NMTiling(4, 32, 32, 32, 64, 8, 4).gathers
    model = nn.Sequential(*modules)
    x = torch.randn(5, 64)
    want = x.numpy()
    for a, _, _ in layers:
        want = want @ a.toarray().T
    with torch.no_grad():
        torch.testing.assert_close(model(x), torch.from_numpy(want.astype(np.float32)), rtol=1e-4, atol=1e-4)


def test_the_module_loads_again_with_its_operators_defined_once():
    # a torch.library namespace is defined once a process: a reload (autoreload, a notebook) must not
    # define it again
    import importlib

    module = importlib.reload(lt)
    assert module.spmm is torch.ops.lospmm.spmm.default and module.conv is torch.ops.lospmm.conv.default


def test_an_nm_convolution_is_served_by_the_implicit_conv_nm_kernel(tmp_path):
    """A convolution pruned 2:4 along its flattened window (Cin·kh·kw) in the N:M kernel's conv form (its
    stages gather the pixels' inputs from NCHW X, its compressed A and bias filled as module data, ReLU
    fused): SpConv serves the module, with no im2col, as the model computes."""
    from lospmm.flows.kernels import emitted_kernel
    from lospmm.kernel.choices import NM_DESIGN
    from lospmm.kernel.geometry import ConvGeometry
    from lospmm.kernel.nm import NMTiling, held_pattern
    import scipy.sparse as sp

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU()).eval()
    with torch.no_grad():  # keep the 2 largest of every 4 weights along K
        w = model[0].weight.reshape(16, -1, 4)
        w.mul_(torch.zeros_like(w).scatter_(2, w.abs().topk(2, dim=2).indices, 1.0))
    weight = model[0].weight.detach().reshape(16, -1).numpy()
    a = sp.csr_matrix(weight)
    assert held_pattern(a) == (2, 4, 1)
    geometry = ConvGeometry(cin=8, h=10, w=10, kh=3, kw=3, stride=2, pad=1)
    out = tmp_path / "conv-nm"
    facts = emitted_kernel(str(tmp_path), a, None, "0.weight", 0.5, 0, "sm_90", out, conv=geometry, design=NM_DESIGN,
                           epilogue=Epilogue(tuple(model[0].bias.tolist()), "relu"), nm=NMTiling(2, 4, 1, 16, 64, 4, 4))
    assert facts["compile"]["status"] == "ok" and facts["host_check"]["status"] == "ok"
    assert facts["conv"]["cin"] == 8 and facts["nm"]["label"] == "2:4,16x64,4x4"
    fast = lt.sparsify(model, out, backend="host")
    assert isinstance(fast[0], lt.SparseConv2d) and isinstance(fast[0].kernel, lt.SpConv)
    x = torch.randn(3, 8, 10, 10)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_half_nm_convolution_is_served_by_the_half_implicit_conv_nm_kernel(tmp_path, dtype):
    """The same 2:4 convolution in a half model: the N:M kernel's conv form in its dtype (X and Y NCHW
    16-bit, packed sums, bias and ReLU in fp32 before the one rounding) serves the module with no im2col,
    as the model computes within the dtype's rounding."""
    from lospmm.flows.kernels import emitted_kernel
    from lospmm.kernel.choices import NM_DESIGN
    from lospmm.kernel.design import design_in
    from lospmm.kernel.geometry import ConvGeometry
    from lospmm.kernel.nm import NMTiling
    from lospmm.kernel.numbers import NumberFormat
    import scipy.sparse as sp

    torch.manual_seed(0)
    kind = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    model = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU()).eval()
    with torch.no_grad():  # keep the 2 largest of every 4 weights along K
        w = model[0].weight.reshape(16, -1, 4)
        w.mul_(torch.zeros_like(w).scatter_(2, w.abs().topk(2, dim=2).indices, 1.0))
    model = model.to(kind)
    a = sp.csr_matrix(model[0].weight.detach().float().reshape(16, -1).numpy())
    geometry = ConvGeometry(cin=8, h=10, w=10, kh=3, kw=3, stride=2, pad=1)
    out = tmp_path / "conv-nm"
    design = design_in(NumberFormat.half(dtype, "packed"), NM_DESIGN)
    facts = emitted_kernel(str(tmp_path), a, None, "0.weight", 0.5, 0, "sm_90", out, conv=geometry, design=design,
                           epilogue=Epilogue(tuple(model[0].bias.float().tolist()), "relu"),
                           nm=NMTiling(2, 4, 1, 16, 64, 4, 4))
    assert facts["compile"]["status"] == "ok" and facts["host_check"]["status"] == "ok"
    assert facts["params"] == ["const lospmm_h16* X", "lospmm_h16* Y", "int batch"]
    fast = lt.sparsify(model, out, backend="host")
    assert isinstance(fast[0], lt.SparseConv2d) and isinstance(fast[0].kernel, lt.SpConv)
    x = torch.randn(3, 8, 10, 10).to(kind)
    with torch.no_grad():
        got = fast(x)
        want = model.float()(x.float())  # the same rounded weights and X, in fp32
    assert got.dtype == kind and got.shape == want.shape
    torch.testing.assert_close(got.float(), want, rtol=0.02 if dtype == "fp16" else 0.1, atol=0.02 if dtype == "fp16" else 0.1)


def test_sparse_linear_refuses_a_second_bias_for_a_kernel_that_adds_its_own(tmp_path):
    """A kernel emitted from a model's weights fuses its layer's bias (and the ReLU after it): given
    the bias again, sparse_linear would add it twice without a sign; it refuses, and without it the
    module is the linear layer and its ReLU, as its repr says."""
    from lospmm.flows.kernels import emitted_kernel
    from lospmm.kernel.epilogue import Epilogue
    from lospmm.stages.prune import random_pruned
    from lospmm.stages.reorder import reordered_tiles

    rng = np.random.default_rng(3)
    a = random_pruned(32, 48, 0.8, rng)
    bias = rng.standard_normal(32).astype(np.float32)
    out = tmp_path / "k"
    facts = emitted_kernel(str(tmp_path), a, reordered_tiles(a, 4), "fc", 0.8, 32, "sm_90", out, verify=False,
                           epilogue=Epilogue(tuple(float(b) for b in bias), "relu"))
    assert facts["compile"]["status"] == "ok"
    with pytest.raises(ValueError, match="fc: the kernel adds its layer's bias itself .*bias\\+relu.*added twice"):
        lt.sparse_linear(out, bias=torch.from_numpy(bias), backend="host")
    layer = lt.sparse_linear(out, backend="host")
    assert "fuses bias+relu" in repr(layer)
    x = torch.randn(5, 48)
    want = np.maximum(x.numpy() @ a.toarray().T + bias, 0)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), torch.from_numpy(want.astype(np.float32)), rtol=1e-4, atol=1e-4)
    # a kernel that applies the ReLU without a bias (an ONNX MatMul then Relu): a bias could only come after it
    relu_only = tmp_path / "relu"
    emitted_kernel(str(tmp_path), a, reordered_tiles(a, 4), "fc", 0.8, 32, "sm_90", relu_only, verify=False,
                   epilogue=Epilogue(activation="relu"))
    with pytest.raises(ValueError, match="fc: the kernel applies relu to A·B itself, and a bias added after it"):
        lt.sparse_linear(relu_only, bias=torch.from_numpy(bias), backend="host")


def test_a_model_pruned_with_torchs_own_pruning_is_read_as_it_computes(tmp_path):
    """torch.nn.utils.prune keeps `weight_orig` and `weight_mask` until prune.remove: the layer's
    weight is their product, named `weight`, as sparsify and the model's forward see it."""
    from safetensors.numpy import load_file
    from torch.nn.utils import prune

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    prune.l1_unstructured(model[0], "weight", amount=0.75)
    found = {w.name: w for w in lt.layer_weights(model, torch.randn(4, 16))}
    assert set(found) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert (found["0.weight"].op, found["0.weight"].bias, found["0.weight"].activation) == ("linear", "0.bias", "relu")
    saved = load_file(str(lt.save_model(model, torch.randn(4, 16), tmp_path / "m.safetensors")))
    np.testing.assert_array_equal(saved["0.weight"], model[0].weight.detach().numpy())
    assert (saved["0.weight"] == 0).sum() == 384 and "0.weight_orig" not in saved
