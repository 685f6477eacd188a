"""Prefect flows and tasks: they wire the stages (lospmm.stages) together and keep what they make.
Nothing here computes a search decision.

    pipeline.py   the flow (a Prefect deployment's entrypoint): each source and sparsity through the DAG
    dag.py        the DAG, declared once: each node's inputs and parameters, its cache key and code version
    config.py     what a run is asked to do (RunConfig) and, validated, what it will do (RunPlan)
    catalog/      every artifact, declared once: schema, record type, row converters (one module each)
    tasks/        one adapter per stage: read its inputs, call the stage, write its artifact
    execution/    how tasks run: the task wrapper and context, unit compiles, progress, the local server
    storage/      atomic checksummed artifacts, the compile cache, run records, ranker models
    inputs/       readers of checkpoints, ONNX graphs and the run's sources
    reports/      the run summary and `lospmm inspect`'s views
    kernels.py    kernel directories: a layer's full kernel written, compiled and checked
    training.py   `lospmm train-ranker`: time synthetic kernels, fit the ranker
"""
