"""The pipeline's DAG, declared once: for each stage, its task adapter, the stages whose artifacts
it reads, and how its parameters follow from the run's plan. The flow submits exactly the
parameters `Node.params` returns and derives the cache key from that same dict, so the key and
the call cannot disagree.

A stage's code version is a hash of its adapter module and, transitively, of every `lospmm`
module the adapter imports (its stage module, codegen, the compile cache, the artifact store…):
editing anything that computes a stage's output changes that stage's key, and through the input
keys, every stage downstream of it. Modules in RUNTIME_ONLY report progress and compute nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

import pyarrow as pa

from lospmm.flows.config import RunPlan, Source
from lospmm.flows.storage.store import artifact_key, module_closure, module_closure_hash
from lospmm.stages import STAGES
from lospmm.stages.reorder import partitioner_version


@dataclass(frozen=True)
class Node:
    stage: str
    inputs: tuple[str, ...]  # stages whose artifacts this one reads (same source and sparsity)
    params: Callable[[RunPlan, Source, float], dict[str, Any]]

    @property
    def adapter_module(self) -> str:
        return f"lospmm.flows.tasks.{self.stage}"

    @property
    def task(self):
        return getattr(importlib.import_module(self.adapter_module), self.stage)

    @property
    def per_sparsity(self) -> bool:
        return self.stage != "extract"



DAG: tuple[Node, ...] = (
    Node("extract", (), lambda plan, src, s: {"source": src}),
    Node("prune", ("extract",), lambda plan, src, s: {"source": src, "sparsity": s, "params": plan.prune[src.kind]}),
    Node("reorder", ("prune",), lambda plan, src, s: {"m1s": plan.search.m1s, "params": plan.search.reorder,
                                                      "partitioner": partitioner_version()}),
    Node("constrain", ("reorder",),
         lambda plan, src, s: {"device": plan.device, "params": plan.search.constrain, "designs": plan.designs_for(src),
                               "implicit_conv": plan.config.implicit_conv}),
    Node("rank", ("constrain",), lambda plan, src, s: {"params": plan.search.rank, "ranker": plan.ranker_for(src)}),
    Node("cluster", ("prune", "reorder", "rank"),
         lambda plan, src, s: {"device": plan.device, "sparsity": s, "params": plan.search.cluster}),
    # from constrain on, each row names its design: pad, compile and time read it there
    Node("pad", ("rank",), lambda plan, src, s: {"device": plan.device}),
    Node("compile", ("cluster",),
         lambda plan, src, s: {"arch": plan.device.arch, "verify": plan.config.verify, "check": plan.proxy_check}),
    Node("time", ("pad", "compile", "cluster"), lambda plan, src, s: {"timer": plan.timer}),
    Node("emit", ("time", "prune", "reorder", "extract"),
         lambda plan, src, s: {"timer": plan.timer, "arch": plan.device.arch, "params": plan.emit,
                               "design": plan.design_for(src), "source": src}),
)
NODES = {n.stage: n for n in DAG}
assert tuple(NODES) == STAGES, "the DAG lists every stage once, in order"

# Modules that only report (progress): they compute no artifact, so they are no stage's version.
RUNTIME_ONLY = ("lospmm.flows.execution.progress",)


def artifact_schemas() -> dict[str, pa.Schema]:
    """Each stage's artifact schema (declared in the catalog), in DAG order."""
    from lospmm.flows.catalog import schema

    return {n.stage: schema(n.stage) for n in DAG}


def list_columns() -> set[str]:
    """Every list-typed (payload) column name of any stage's artifact."""
    from lospmm.flows.storage.schemas import list_columns as of

    return set().union(*(of(s) for s in artifact_schemas().values()))


def code_version(module: str) -> str:
    """Hash of a lospmm module and every lospmm module it imports, transitively ("" outside lospmm)."""
    if not module.startswith("lospmm"):
        return ""
    return module_closure_hash(module, prefix="lospmm", skip=RUNTIME_ONLY)


@lru_cache(maxsize=None)
def stage_version(stage: str) -> str:
    """The code version of the stage's adapter module: the adapter and everything it imports."""
    return code_version(NODES[stage].adapter_module)


def version_modules(stage: str) -> set[str]:
    """The modules whose source is part of `stage`'s version."""
    return set(module_closure(NODES[stage].adapter_module, prefix="lospmm", skip=RUNTIME_ONLY))


def key_form(value: Any) -> Any:
    """A parameter as it enters a key: objects with `key_form()` say so themselves (a Source leaves
    out where its file lies), dataclasses become their fields, tuples lists. What an object does is
    part of it too: its class's code version (a Timer's code times, a Device's table entry sizes)."""
    typed = not isinstance(value, type)
    if typed and hasattr(value, "key_form"):
        return {**_type_form(value), **key_form(value.key_form())}
    if typed and dataclasses.is_dataclass(value):
        return {**_type_form(value), **{f.name: key_form(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, dict):
        return {str(k): key_form(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [key_form(v) for v in value]
    if isinstance(value, bytes):
        return hashlib.sha256(value).hexdigest()
    return value


def _type_form(value: Any) -> dict[str, str]:
    module = type(value).__module__
    return {"__type__": f"{module}.{type(value).__qualname__}", "__code__": code_version(module)}


def node_key(stage: str, params: dict[str, Any], input_keys: list[str]) -> str:
    """The artifact (and Prefect cache) key of one node: stage, code version, parameters, inputs."""
    return artifact_key(stage, stage_version(stage), key_form(params), input_keys)
