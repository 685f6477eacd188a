"""A run's options, validated once into a plan of typed values (Device, Timer, sources, stage params)."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow.parquet as pq
import pytest
from safetensors.numpy import save_file

from lospmm.flows.config import ConfigError, RunConfig, resolved, resolved_timer
from lospmm.flows.storage.ranker_store import ranker_metadata
from lospmm.kernel.cuda import gpu_present
from lospmm.devices import device_named
from lospmm.kernel.estimate import EstimateTimer


def test_a_plan_holds_typed_values():
    plan = resolved(RunConfig(zoo=("bert-base", "resnet50"), gpu="A100", th_row=0.3, top_k=4, seed=7, m1s=(8, 2, 8)))
    assert plan.device is device_named("a100")
    assert plan.search.constrain.th_row == 0.3 and plan.search.rank.top_k == 4 and plan.emit.chosen_by.endswith("top-4")
    assert plan.prune["zoo"].method == "random" and plan.prune["weights"].method == "magnitude"
    assert plan.prune["zoo"].seed == 7 and plan.search.m1s == (2, 8)
    assert [s.name for s in plan.sources] == ["bert-base", "resnet50"] and plan.sources[0].kind == "zoo"
    assert plan.ranker.version == ranker_metadata()["version"]
    assert plan.jobs >= 1 and plan.root.is_absolute()
    if not gpu_present():
        assert isinstance(plan.timer, EstimateTimer) and plan.timer.device is plan.device


def test_zoo_sources_keep_only_the_sizes_their_model_uses():
    plan = resolved(RunConfig(zoo=("bert-base", "mobilenetv2"), batch=2, seq_len=64, cnn_batch=8, image_size=96))
    bert, cnn = plan.sources
    assert (bert.zoo.batch, bert.zoo.seq_len) == (2, 64) and bert.zoo.cnn_batch == 4  # CNN sizes at defaults
    assert (cnn.zoo.cnn_batch, cnn.zoo.image_size) == (8, 96) and cnn.zoo.batch == 32


def test_a_weights_source_is_its_content(tmp_path):
    path = tmp_path / "My Model.v2.safetensors"
    save_file({"w": np.ones((4, 4), np.float32)}, str(path))
    plan = resolved(RunConfig(zoo=(), weights=str(path), prune="random"))
    (src,) = plan.sources
    assert src.kind == "weights" and src.label == "My_Model_v2" and src.path == str(path.resolve())
    assert src.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert plan.prune["weights"].method == "random"  # an explicit --prune wins over the default
    assert "path" not in src.key_form()


def test_without_the_ranker_the_rank_key_names_no_model():
    plan = resolved(RunConfig(zoo=("shufflenetv2",), rank=False))
    assert plan.ranker.version == "none" and plan.emit.chosen_by == "top-1 proxy of every kept candidate"


@pytest.mark.parametrize("change, message", [
    ({"zoo": ("bert-large",)}, "unknown zoo model"), ({"sparsities": (1.5,)}, "--sparsity 1.5"),
    ({"until": "deploy"}, "--until"), ({"gpu": "x9"}, "unknown GPU"), ({"prune": "l1"}, "--prune 'l1'"),
    ({"m1s": (0,)}, "--m1"), ({"th_col": -1.0}, "--th-col"), ({"timer": "fast"}, "--timer 'fast'"),
    ({"jobs": -1}, "--jobs"), ({"top_k": 0}, "--top-k"), ({"dask": "host:8786"}, "--dask must be a scheduler address"), ({"zoo": (), "weights": None}, "nothing to run"),
    ({"weights": "/no/such.safetensors"}, "/no/such.safetensors"),
])
def test_bad_options_are_named(change, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        resolved(RunConfig(**{"zoo": ("bert-base",), **change}))


def test_unknown_options_in_a_deployment_dict_are_named():
    with pytest.raises(ConfigError, match="unknown run option.*colour"):
        RunConfig.from_dict({"zoo": ["bert-base"], "colour": "red"})
    assert RunConfig.from_dict(RunConfig(zoo=("resnet50",)).as_dict()) == RunConfig(zoo=("resnet50",))


def test_the_cuda_timer_needs_a_gpu():
    if gpu_present():
        pytest.skip("a GPU is present")
    with pytest.raises(ConfigError, match="no CUDA device"):
        resolved_timer("cuda", device_named("h100"))
    assert resolved_timer("auto", device_named("h100")).name == "estimate:h100-2026-11-23"  # the H100's calibration
    assert resolved_timer("auto", device_named("a100")).name == "estimate"


def test_a_repeated_sparsity_or_model_is_searched_once():
    plan = resolved(RunConfig(zoo=("shufflenetv2", "shufflenetv2"), sparsities=(0.9, 0.5, 0.9)))
    assert plan.sparsities == (0.9, 0.5) and [s.name for s in plan.sources] == ["shufflenetv2"]


@pytest.mark.parametrize("where, message", [
    ("file", "is a file; give a directory"), ("under a file", "which is a file"),
])
def test_an_artifact_root_that_cannot_be_a_directory_is_named(tmp_path, where, message):
    (tmp_path / "f").write_text("x")
    root = tmp_path / "f" if where == "file" else tmp_path / "f" / "art"
    with pytest.raises(ConfigError, match=message):
        resolved(RunConfig(zoo=("shufflenetv2",), artifacts=str(root)))


def test_an_unwritable_root_and_a_full_disk_are_found_before_any_work(tmp_path, monkeypatch):
    import errno
    import tempfile

    from lospmm.flows import config

    def read_only(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    with monkeypatch.context() as m:
        m.setattr(tempfile, "NamedTemporaryFile", read_only)
        with pytest.raises(ConfigError, match="cannot write there \\(Read-only file system\\).*lospmm inspect"):
            resolved(RunConfig(zoo=("shufflenetv2",), artifacts=str(tmp_path / "ro")))
    with pytest.raises(ConfigError, match="MiB free"):
        config.checked_root(tmp_path / "full", min_free=2**62)
    assert config.checked_root(tmp_path / "fine") == (tmp_path / "fine").resolve()
    assert [p.name for p in (tmp_path / "fine").iterdir()] == []  # the probe leaves nothing behind


def test_a_garbage_ranker_file_is_named_before_any_work(tmp_path):
    (tmp_path / "r.txt").write_text("not a lightgbm model")
    (tmp_path / "r.json").write_text('{"version": "x"}')
    with pytest.raises(ConfigError, match="--ranker.*r.txt: not a LightGBM text model"):
        resolved(RunConfig(zoo=("shufflenetv2",), ranker=str(tmp_path / "r")))


@pytest.mark.parametrize("model, metadata, named", [
    ("shipped", "{}", "e.json: its metadata has no version"),  # a valid model, metadata not ours
    ("shipped", "nope", "e.json: unreadable metadata"),  # the metadata is at fault, not the model
    ("shipped", None, "no .*e.json"),
])
def test_a_bad_ranker_names_the_file_at_fault(tmp_path, model, metadata, named):
    from lospmm.flows.storage.ranker_store import SHIPPED

    (tmp_path / "e.txt").write_text(SHIPPED.with_suffix(".txt").read_text())
    if metadata is not None:
        (tmp_path / "e.json").write_text(metadata)
    for given in ("e", "e.txt"):  # with or without a suffix
        with pytest.raises(ConfigError, match=named):
            resolved(RunConfig(zoo=("shufflenetv2",), ranker=str(tmp_path / given)))


def test_magnitude_pruning_of_a_zoo_model_is_refused():
    with pytest.raises(ConfigError, match="--prune magnitude needs real weights"):
        resolved(RunConfig(zoo=("resnet50",), prune="magnitude"))


def test_weights_without_a_gemm_weight_are_refused_before_any_work(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    path = tmp_path / "no_gemm.safetensors"
    save_file({"bias": np.zeros(8, np.float32), "conv": np.zeros((2, 2, 3, 3), np.float32),
               "embeddings.word_embeddings.weight": np.zeros((10, 4), np.float32)}, str(path))
    with pytest.raises(ConfigError, match="no GEMM weight to search \\(3 tensors: 1 bias .1-D., 1 convolution weight"):
        resolved(RunConfig(weights=str(path)))


def test_an_empty_or_cut_short_weights_file_is_refused_before_any_work(tmp_path):
    # a copy or download cut off keeps its header: every tensor is listed, the last ones' bytes are missing
    whole = tmp_path / "whole.safetensors"
    save_file({"a.weight": np.ones((32, 16), np.float32), "b.weight": np.ones((64, 32), np.float32)}, str(whole))
    data = whole.read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[:-100])
    with pytest.raises(ConfigError, match=f"weights file {cut} is cut short: {len(data) - 100:,} bytes, where its "
                                          f"header puts tensor b.weight up to byte {len(data):,}"):
        resolved(RunConfig(weights=str(cut)))
    assert [s.label for s in resolved(RunConfig(zoo=(), weights=str(whole))).sources] == ["whole"]
    for name in ("empty.safetensors", "empty.onnx"):
        (tmp_path / name).write_bytes(b"")
        with pytest.raises(ConfigError, match=f"^weights file {tmp_path / name} is empty \\(0 bytes\\)$"):
            resolved(RunConfig(weights=str(tmp_path / name)))


def test_a_config_json_beside_the_checkpoint_is_read_and_keyed(tmp_path):
    import json

    import numpy as np
    from safetensors.numpy import save_file

    from lospmm.stages.extract import ModelConfig

    path = tmp_path / "model.safetensors"
    save_file({"dense.weight": np.ones((4, 4), np.float32)}, str(path))
    bare = resolved(RunConfig(zoo=(), weights=str(path))).sources[0]
    assert bare.model_config is None
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 30522, "hidden_size": 384, "n_positions": 512}))
    told = resolved(RunConfig(zoo=(), weights=str(path))).sources[0]
    assert told.model_config == ModelConfig(vocab_size=30522, max_position_embeddings=512, hidden_size=384)
    assert told.key_form() != bare.key_form()  # what extract is told is part of its key
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json \\(beside --weights\\): not readable JSON"):
        resolved(RunConfig(weights=str(path)))


def test_im2col_reaches_the_emit_parameters(tmp_path):
    from lospmm.flows.config import RunConfig, resolved

    for implicit in (True, False):
        plan = resolved(RunConfig(zoo=("shufflenetv2",), artifacts=str(tmp_path), implicit_conv=implicit))
        assert plan.emit.implicit_conv is implicit


def test_an_unreachable_dask_scheduler_is_one_line_before_anything_starts(tmp_path):
    """Tried as a new user would: no scheduler at the address. The run is refused at validation
    (before Prefect's server), naming the address and the cause, within the connect timeout."""
    import socket
    import time

    pytest.importorskip("prefect_dask")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=rf"--dask tcp://127.0.0.1:{port}: no Dask scheduler answers there") as e:
        resolved(RunConfig(zoo=("shufflenetv2",), artifacts=str(tmp_path), dask=f"tcp://127.0.0.1:{port}"))
    assert "\n" not in str(e.value) and time.monotonic() - t0 < 30


def test_a_checkpoints_config_json_and_the_device_are_read_once(tmp_path, monkeypatch):
    """The validation reads what it must (the config.json beside --weights, the device table) and
    the plan takes those, instead of reading them again."""
    import json

    from lospmm.flows import config

    weights = tmp_path / "w.safetensors"
    save_file({"fc.weight": np.ones((8, 8), np.float32)}, str(weights))
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 30522}))
    calls = {"model_config": 0, "device_named": 0}
    for name in calls:
        real = getattr(config, name)

        def counted(*a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(*a, **k)

        monkeypatch.setattr(config, name, counted)
    plan = resolved(RunConfig(zoo=(), weights=str(weights), artifacts=str(tmp_path / "a")))
    assert calls == {"model_config": 1, "device_named": 1}
    assert plan.sources[0].model_config is not None and plan.sources[0].model_config.vocab_size == 30522


def test_a_checkpoints_pooler_gets_batch_rows_and_only_its_key_follows_batch(tmp_path):
    from lospmm.flows.dag import NODES, node_key
    from tests.conftest import run_directly

    bert, gpt = tmp_path / "bert.safetensors", tmp_path / "gpt.safetensors"
    save_file({"encoder.dense.weight": np.ones((8, 8), np.float32), "pooler.dense.weight": np.ones((8, 8), np.float32)},
              str(bert))
    save_file({"h.0.mlp.c_fc.weight": np.ones((8, 8), np.float32)}, str(gpt))

    def plan(path, batch, **more):
        return resolved(RunConfig(zoo=(), weights=str(path), tokens=256, batch=batch, until="extract",
                                  artifacts=str(tmp_path / "art"), **more))

    def key(p):
        return node_key("extract", NODES["extract"].params(p, p.sources[0], 0.9), [])

    p = plan(bert, 2)
    assert p.sources[0].sequences == 2
    rows = {r["layer"]: r["n"] for r in pq.read_table(p.root / run_directly(p, 0.9)["extract"]["path"]).to_pylist()}
    assert rows == {"encoder.dense.weight": 256, "pooler.dense.weight": 2}
    assert key(plan(bert, 2)) != key(plan(bert, 4)) and key(plan(gpt, 2)) == key(plan(gpt, 4))
    with pytest.raises(ConfigError, match=r"^--batch 512 > --tokens 256: pooler\.dense\.weight gets one row per "
                                          r"sequence .*give --batch <= --tokens$"):
        plan(bert, 512)
    assert plan(gpt, 512).sources[0].sequences == 0  # no pooler: --batch is no concern of this checkpoint


def test_the_kernels_dtype_is_the_weights_own_unless_given_and_a_device_without_it_is_refused(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    from lospmm.flows.config import ConfigError, RunConfig, resolved

    half = tmp_path / "half.safetensors"
    save_file({"enc.0.weight": np.ones((8, 8), np.float16), "enc.0.bias": np.ones(8, np.float16)}, str(half))
    plain = tmp_path / "plain.safetensors"
    save_file({"enc.0.weight": np.ones((8, 8), np.float32)}, str(plain))

    def dtype(**options):
        plan = resolved(RunConfig(zoo=(), artifacts=str(tmp_path / "art"), **options))
        return plan.sources[0].dtype

    assert dtype(weights=str(half)) == "fp16" and dtype(weights=str(plain)) == "fp32"
    assert dtype(weights=str(half), dtype="fp32") == "fp32" and dtype(weights=str(plain), dtype="bf16") == "bf16"
    assert resolved(RunConfig(zoo=("bert-base",), artifacts=str(tmp_path / "art"))).sources[0].dtype == "fp32"
    with pytest.raises(ConfigError, match="half: fp16 kernels need sm_80 or newer; the v100 is sm_70"):
        resolved(RunConfig(zoo=(), weights=str(half), gpu="v100", artifacts=str(tmp_path / "art")))
    with pytest.raises(ConfigError, match="--dtype 'fp8'"):
        resolved(RunConfig(zoo=(), weights=str(plain), dtype="fp8", artifacts=str(tmp_path / "art")))


def test_a_half_source_is_searched_in_its_half_design_with_the_half_ranker(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    from lospmm.flows.config import ConfigError, RunConfig, resolved
    from lospmm.flows.dag import NODES
    from lospmm.flows.storage.ranker_store import SHIPPED_HALF
    from lospmm.kernel.design import design_named

    half = tmp_path / "half.safetensors"
    save_file({"enc.0.weight": np.ones((8, 8), np.float16)}, str(half))

    def plan(**options):
        return resolved(RunConfig(zoo=("bert-base",), weights=str(half), artifacts=str(tmp_path / "art"), **options))

    p = plan(design="chained", accumulate="f32")
    zoo, weights = p.sources
    assert p.design_for(zoo) == design_named("chained")
    assert p.design_for(weights) == design_named("fp16,acc=f32,chained")
    assert p.ranker_for(weights).path == str(SHIPPED_HALF) and p.ranker_for(zoo).path is None
    # constrain spans the source's design (its rows name it for pad, compile and time), emit serves in it;
    # the rank stage gets its ranker
    assert NODES["constrain"].params(p, weights, 0.9)["designs"] == (design_named("fp16,acc=f32,chained"),)
    assert NODES["emit"].params(p, weights, 0.9)["design"] == design_named("fp16,acc=f32,chained")
    assert NODES["rank"].params(p, weights, 0.9)["ranker"].path == str(SHIPPED_HALF)
    assert NODES["rank"].params(p, zoo, 0.9)["ranker"].path is None  # the shipped fp32 model
    # --ranker serves the sources of the kind it ranks; the shipped model of the other kind the rest
    from lospmm.flows.storage.ranker_store import SHIPPED

    mixed = plan(ranker=str(SHIPPED))
    assert mixed.ranker_for(zoo).path == str(SHIPPED) and mixed.ranker_for(weights).path == str(SHIPPED_HALF)
    assert plan(ranker=str(SHIPPED_HALF)).ranker_for(weights).path == str(SHIPPED_HALF)
    with pytest.raises(ConfigError, match="ranks half kernels; this run's sources are fp32"):
        resolved(RunConfig(zoo=("bert-base",), artifacts=str(tmp_path / "art"), ranker=str(SHIPPED_HALF)))
    with pytest.raises(ConfigError, match="ranks fp32 kernels; this run's sources are fp16"):
        resolved(RunConfig(zoo=(), weights=str(half), artifacts=str(tmp_path / "art"), ranker=str(SHIPPED)))
    for options, why in (({"design": "fp16"}, "take their dtype from --dtype"),
                         ({"design": "chained,v=4"}, "half: fp16 kernels: design .* one packed pair per thread"),
                         ({"accumulate": "f64"}, "--accumulate 'f64'"),
                         ({"accumulate": "f32", "promote_every": 4}, "--promote-every 4")):
        with pytest.raises(ConfigError, match=why):
            plan(**options)
    with pytest.raises(ConfigError, match="are a half run's"):
        resolved(RunConfig(zoo=("bert-base",), artifacts=str(tmp_path / "art"), accumulate="f32"))


def test_the_reorder_keeps_to_the_runs_load_balance_threshold(tmp_path):
    plan = resolved(RunConfig(zoo=("shufflenetv2",), th_row=0.1, reorder=("identity", "algorithm1"),
                              reorder_budget=0.0, artifacts=str(tmp_path)))
    assert plan.search.reorder.max_cov_nnz == 0.1 and plan.search.reorder.strategies == ("identity", "algorithm1")
    with pytest.raises(ConfigError, match="--reorder"):
        resolved(RunConfig(zoo=("shufflenetv2",), reorder=("nope",), artifacts=str(tmp_path)))


def test_design_auto_searches_every_candidate_design_with_the_design_aware_ranker(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    from lospmm.flows.config import ConfigError, RunConfig, resolved
    from lospmm.flows.dag import NODES
    from lospmm.flows.storage.ranker_store import SHIPPED, SHIPPED_DESIGNS, SHIPPED_HALF
    from lospmm.kernel.choices import DESIGN_CANDIDATES
    from lospmm.kernel.design import design_named

    half = tmp_path / "half.safetensors"
    save_file({"enc.0.weight": np.ones((8, 8), np.float16)}, str(half))
    p = resolved(RunConfig(zoo=("bert-base",), weights=str(half), design="auto", artifacts=str(tmp_path / "art")))
    zoo, weights = p.sources
    # fp32 candidates span every design, ranked together by the design-aware model
    assert p.designs_for(zoo) == tuple(design_named(d) for d in DESIGN_CANDIDATES)
    assert NODES["constrain"].params(p, zoo, 0.9)["designs"] == p.designs_for(zoo)
    assert p.ranker_for(zoo).path == str(SHIPPED_DESIGNS)
    # a half source has one grid so far: its own design and the half ranker
    assert p.designs_for(weights) == (design_named("fp16"),) and p.ranker_for(weights).path == str(SHIPPED_HALF)
    # a ranker of one design cannot rank several designs' tiles together: said before any work
    with pytest.raises(ConfigError, match="ranks the tiles of one kernel design"):
        resolved(RunConfig(zoo=("bert-base",), design="auto", ranker=str(SHIPPED), artifacts=str(tmp_path / "a2")))
    # a forced design is searched alone, with the shipped model
    forced = resolved(RunConfig(zoo=("bert-base",), design="chained,v=4", artifacts=str(tmp_path / "a3")))
    assert forced.designs_for(forced.sources[0]) == (design_named("chained,v=4"),)
    assert forced.ranker_for(forced.sources[0]).path is None


def test_a_run_in_the_staged_design_searches_it_alone_with_the_shipped_ranker(tmp_path):
    # the staged design has its own proxy and estimate: a run searches in it
    from lospmm.kernel.design import design_named

    plan = resolved(RunConfig(zoo=("shufflenetv2",), design="staged,tiles=4", artifacts=str(tmp_path)))
    assert plan.designs_for(plan.sources[0]) == (design_named("staged,tiles=4"),)
    assert plan.ranker_for(plan.sources[0]).path is None


def test_a_ranker_over_staged_designs_is_trained_on_their_blocking_and_auto_names_the_runs_candidates():
    from lospmm.flows.config import run_designs, trained_designs
    from lospmm.kernel.design import design_named
    from lospmm.stages.rank import DESIGN_FEATURES, STAGED_FEATURES, design_feature_names, feature_value

    staged = design_named("staged,tiles=4,warps=2")
    designs = trained_designs("auto;staged,tiles=4,warps=2")
    assert designs == run_designs("auto") + (staged,)
    # its tiles are told from the baseline's by tiles a block and warps a tile (1 and 1 for the others)
    assert design_feature_names(designs) == DESIGN_FEATURES + STAGED_FEATURES
    assert design_feature_names(run_designs("auto")) == DESIGN_FEATURES
    row = {"design": staged.label}
    assert (feature_value(row, "tiles_per_block"), feature_value(row, "tile_warps")) == (4, 2)
    assert feature_value({"design": ""}, "tiles_per_block") == 1
    with pytest.raises(ConfigError, match="name two or more designs"):
        trained_designs("staged,tiles=4")


@pytest.mark.parametrize("text, said", [
    ("", "--design '' names no design: give one (auto, baseline, chained"),
    (" , ", "--design ' , ' names no design"),
    ("walks=0", "--design: walks=W must be >= 1, got 0"),
    ("v=3", "--design: v=V must be one of (1, 2, 4), got 3"),
    ("AUTO", "(`auto`, `baseline`, or tokens: baked|streamed"),
    ("auto,v=4", "--design 'auto,v=4': `auto` stands alone"),  # (it said "cannot read 'auto'" and listed auto)
    ("tiles=3", "--design: tiles=G is a staged design's (2, 4, 8, 16), and only its; got based, tiles=3"),
])
def test_a_design_that_cannot_be_read_is_said_in_the_flags_words(tmp_path, text, said):
    """--design's errors name its tokens (walks=W, v=V), not KernelDesign's fields, list `auto` and
    `baseline` beside them, and an empty one is refused rather than read as the baseline."""
    with pytest.raises(ConfigError) as refused:
        resolved(RunConfig(zoo=("shufflenetv2",), design=text, artifacts=str(tmp_path)))
    assert said in str(refused.value) and "column_walks" not in str(refused.value)
