"""The catalog: every artifact the flow writes, declared once (in the Kedro sense). Each artifact
has a module here, named after its layer, holding its Arrow schema (`SCHEMA`; artifacts/README.md
documents every column), the stage record a row stands for (`RECORD`), and the converters between
rows and records (`<record>_row`, `<record>_from_row`, and readers of a whole artifact). The
adapter that writes an artifact (`lospmm.flows.tasks.<stage>`) and every reader of it import that
module, so editing an artifact's columns changes the version of the stages that write or read it,
never of one upstream.

    stage      layer            module                        record
    extract    01_shapes        lospmm.flows.catalog.shapes       stages.extract.LayerShape
    prune      02_pruned        lospmm.flows.catalog.pruned       scipy.sparse.csr_matrix
    reorder    03_reordered     lospmm.flows.catalog.reordered    stages.reorder.Tiles
    constrain  04_candidates    lospmm.flows.catalog.candidates   stages.constrain.Candidate
    rank       05_ranked        lospmm.flows.catalog.ranked       stages.rank.RankedCandidate
    cluster    06_clusters      lospmm.flows.catalog.clusters     stages.cluster.ProxyClusters
    pad        07_launch        lospmm.flows.catalog.launch       stages.pad.ProxyLaunch
    compile    08_compiled      lospmm.flows.catalog.compiled     a compile-cache result
    time       09_timed         lospmm.flows.catalog.timed        stages.timing.Timing
    emit       10_kernels       lospmm.flows.catalog.kernels      a kernel directory's kernel.json
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pyarrow as pa

from lospmm.stages import STAGE_LAYERS

# The catalog module of each stage's artifact: its layer's name without the number.
ARTIFACT_MODULES = {stage: "lospmm.flows.catalog." + layer.split("_", 1)[1] for stage, layer in STAGE_LAYERS.items()}


def artifact(stage: str) -> ModuleType:
    """The catalog module of `stage`'s artifact (imported on demand: a stage depends only on the
    artifacts it writes and reads)."""
    return importlib.import_module(ARTIFACT_MODULES[stage])


def schema(stage: str) -> pa.Schema:
    return artifact(stage).SCHEMA
