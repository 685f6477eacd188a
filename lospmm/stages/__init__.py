"""Pure stage computations: numpy/scipy in, typed records out. No Prefect, no file I/O.

The stages in DAG order, with the module that holds each one's logic. The flow's adapter for a
stage is `lospmm.flows.tasks.<stage>` (reads its inputs, calls the module, writes the artifact);
the DAG itself, each node's inputs and parameters, is declared once in `lospmm.flows.dag`.

    1 extract    lospmm.stages.extract    zoo model or weights -> GEMM shapes
    2 prune      lospmm.stages.prune      shapes -> sparse A (CSR)
    3 reorder    lospmm.stages.reorder    A, M1 -> A_tiles (Algorithm 1)
    4 constrain  lospmm.stages.constrain  A_tiles, device -> (M1, N1) candidates with removed_by
    5 rank       lospmm.stages.rank       kept candidates -> LambdaMART score, top-K chosen
    6 cluster    lospmm.stages.cluster    A_tiles of a chosen M1 -> proxy block functions
    7 pad        lospmm.stages.pad        chosen candidate -> proxy launch (Eq. 5-6)
    8 compile    lospmm.stages.compile    proxy source (lospmm.kernel.render) -> cubin via NVRTC
    9 time       lospmm.stages.time       proxy -> time from the run's Timer (estimate | cuda)
   10 emit       lospmm.stages.emit       timed proxies -> chosen tile -> full kernel, checked

Not stages, used by them: `lospmm.kernel` (every kernel: its description, rendering, checks,
packages and timers), `lospmm.search` (one layer's whole search, composed from these for the
benchmarks and train-ranker), `lospmm.devices` (the GPU table and occupancy), `lospmm.status`.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    """One stage's facts, stated once: its name, its artifact layer (the folder under the artifact
    root) and the module that holds its logic. Its adapter is `lospmm.flows.tasks.<name>` (a task
    function of the same name); its inputs and parameters are its node in `lospmm.flows.dag`."""

    name: str
    layer: str
    module: str


STAGE_TABLE: tuple[Stage, ...] = (
    Stage("extract", "01_shapes", "lospmm.stages.extract"),
    Stage("prune", "02_pruned", "lospmm.stages.prune"),
    Stage("reorder", "03_reordered", "lospmm.stages.reorder"),
    Stage("constrain", "04_candidates", "lospmm.stages.constrain"),
    Stage("rank", "05_ranked", "lospmm.stages.rank"),
    Stage("cluster", "06_clusters", "lospmm.stages.cluster"),
    Stage("pad", "07_launch", "lospmm.stages.pad"),
    Stage("compile", "08_compiled", "lospmm.stages.compile"),
    Stage("time", "09_timed", "lospmm.stages.time"),
    Stage("emit", "10_kernels", "lospmm.stages.emit"),
)
STAGES = tuple(s.name for s in STAGE_TABLE)
STAGE_MODULES = {s.name: s.module for s in STAGE_TABLE}
STAGE_LAYERS = {s.name: s.layer for s in STAGE_TABLE}
