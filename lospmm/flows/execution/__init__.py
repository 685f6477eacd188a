"""How the flow's tasks run: the task wrapper and its run context (taskio), kernel-unit compiles on
threads or a Dask cluster (units), progress reports (progress), the embedded Prefect server (server)."""
