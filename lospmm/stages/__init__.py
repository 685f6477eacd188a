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
    8 compile    lospmm.stages.compile    proxy source (lospmm.stages.codegen) -> cubin via NVRTC
    9 time       lospmm.stages.timing     proxy -> time from the run's Timer (estimate | cuda)
   10 emit       lospmm.stages.emit       timed proxies -> chosen tile -> full kernel, checked

Shared by several: `search` (one layer's whole search, for the benchmarks; train-ranker uses its first steps),
`occupancy` (registers per block, resident and active blocks), `devices` (the GPU table),
`status` (the one Status enum).
"""

STAGES = ("extract", "prune", "reorder", "constrain", "rank", "cluster", "pad", "compile", "time", "emit")
STAGE_MODULES = {
    "extract": "lospmm.stages.extract",
    "prune": "lospmm.stages.prune",
    "reorder": "lospmm.stages.reorder",
    "constrain": "lospmm.stages.constrain",
    "rank": "lospmm.stages.rank",
    "cluster": "lospmm.stages.cluster",
    "pad": "lospmm.stages.pad",
    "compile": "lospmm.stages.compile",
    "time": "lospmm.stages.timing",
    "emit": "lospmm.stages.emit",
}
