"""The DAG's keys: declared once, and each stage's code version covers everything that computes its
output — and nothing of the stages downstream of it."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
from safetensors.numpy import save_file

from lospmm.flows.storage import store
from lospmm.flows.config import RunConfig, resolved
from lospmm.flows.dag import DAG, NODES, key_form, node_key, stage_version, version_modules
from lospmm.stages import STAGE_MODULES, STAGES
from tests.conftest import run_directly


@pytest.fixture()
def edited(monkeypatch):
    """edit(module, text): the module's source as the version hashing reads it, with `text` appended."""
    real = store._source
    edits: dict[str, str] = {}

    def source(module):
        return real(module) + edits.get(module.name, "")  # a ModuleSpec: sources are read, not imported

    monkeypatch.setattr(store, "_source", source)

    def edit(module: str, text: str = "\n_EDITED = True\n") -> None:  # code: a comment is no edit of it
        edits[module] = text
        store.module_closure_hash.cache_clear()
        stage_version.cache_clear()

    yield edit
    store.module_closure_hash.cache_clear()
    stage_version.cache_clear()


def _versions() -> dict[str, str]:
    return {s: stage_version(s) for s in STAGES}


def test_editing_occupancy_changes_every_stage_that_sizes_blocks_with_it(edited):
    # Eq. 5 (active blocks per SM) used to live in pad.py while cluster called it: cluster's key did
    # not move when it changed. It is in occupancy.py now, and cluster's version covers it.
    before = _versions()
    edited("lospmm.devices")
    after = _versions()
    changed = {s for s in STAGES if after[s] != before[s]}
    # reorder prices its candidate orders with the estimate on the device table: it moves too
    assert {"reorder", "constrain", "cluster", "pad", "time", "emit"} <= changed
    assert not changed & {"extract", "prune"}


def test_editing_a_stage_module_changes_it_and_no_stage_upstream(edited):
    before = _versions()
    edited("lospmm.stages.pad")
    after = _versions()
    assert after["pad"] != before["pad"]
    assert all(after[s] == before[s] for s in STAGES[: STAGES.index("pad")])


def test_editing_the_emit_adapter_changes_emits_key_and_nothing_upstream(edited):
    plan = resolved(RunConfig(zoo=("shufflenetv2",)))
    before = _versions()
    emit_params = NODES["emit"].params(plan, plan.sources[0], 0.9)
    key_before = node_key("emit", emit_params, ["t", "p", "r"])
    edited("lospmm.flows.tasks.emit")
    after = _versions()
    assert {s for s in STAGES if after[s] != before[s]} == {"emit"}
    assert node_key("emit", emit_params, ["t", "p", "r"]) != key_before


def test_no_stage_version_holds_a_module_of_a_stage_downstream_of_it():
    for i, stage in enumerate(STAGES):
        mods = version_modules(stage)
        assert STAGE_MODULES[stage] in mods and NODES[stage].adapter_module in mods
        for later in STAGES[i + 1:]:
            if STAGE_MODULES[later] == STAGE_MODULES[stage]:
                continue
            assert STAGE_MODULES[later] not in mods, (stage, later)
            assert NODES[later].adapter_module not in mods, (stage, later)


def test_a_parameter_objects_code_is_part_of_the_key(edited):
    plan = resolved(RunConfig(zoo=("shufflenetv2",)))
    form = key_form({"timer": plan.timer})
    edited("lospmm.kernel.estimate")  # the estimate timer's model
    assert key_form({"timer": plan.timer}) != form
    # and a Source leaves out where a weights file lies: its content identifies it
    src = plan.sources[0]
    assert "path" not in key_form(src)


def test_every_node_key_changes_with_its_parameters_and_inputs():
    plan = resolved(RunConfig(zoo=("shufflenetv2",)))
    other = resolved(RunConfig(zoo=("shufflenetv2",), th_row=0.1, top_k=3, gpu="a100", seed=1, m1s=(2, 4)))
    src = plan.sources[0]
    for node in DAG:
        p = node.params(plan, src, 0.9)
        assert node_key(node.stage, p, ["a"]) != node_key(node.stage, p, ["b"])
    moved = {n.stage for n in DAG
             if node_key(n.stage, n.params(plan, src, 0.9), []) != node_key(n.stage, n.params(other, src, 0.9), [])}
    # seed -> prune, m1s -> reorder, gpu -> constrain/cluster/pad/compile/time/emit, th_row -> constrain,
    # top_k -> rank and emit (its chosen_by); extract's parameters did not change
    assert moved == set(STAGES) - {"extract"}


def test_a_cnn_size_leaves_bert_keys_alone():
    a = resolved(RunConfig(zoo=("bert-base", "resnet50")))
    b = resolved(RunConfig(zoo=("bert-base", "resnet50"), cnn_batch=8))
    key = lambda plan, i: node_key("extract", NODES["extract"].params(plan, plan.sources[i], 0.9), [])  # noqa: E731
    assert key(a, 0) == key(b, 0) and key(a, 1) != key(b, 1)


def _executed_modules(fn) -> set[str]:
    """lospmm modules whose functions ran during fn() (this thread and threads it starts)."""
    seen: set[str] = set()

    def profile(frame, event, arg):
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name.startswith("lospmm"):
                seen.add(name)

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return seen


def test_every_module_a_stage_runs_is_in_its_version(tmp_path):
    """Run each adapter on a small weights file under a profiler: every lospmm module whose code ran
    must be in that stage's version (or only report progress)."""
    rng = np.random.default_rng(0)
    weights = tmp_path / "w.safetensors"
    save_file({"a.weight": rng.standard_normal((64, 48)).astype(np.float32),
               "b.weight": rng.standard_normal((96, 64)).astype(np.float32)}, str(weights))
    plan = resolved(RunConfig(zoo=(), weights=str(weights), tokens=512, m1s=(2, 8), top_k=2,
                              artifacts=str(tmp_path / "art"), verify=True))
    def profiled(stage, call):
        result = {}
        ran = _executed_modules(lambda: result.update(call()))
        allowed = version_modules(stage) | {"lospmm.flows.execution.progress"}  # progress reports, computes nothing
        # the parameter objects' own code (a Timer's model) enters the key through key_form
        allowed |= {type(v).__module__ for v in NODES[stage].params(plan, plan.sources[0], 0.8).values()}
        assert ran - allowed == set(), stage
        return result

    done = run_directly(plan, 0.8, profiled)
    assert done["emit"]["rows"] == 2
