"""Prefect flows and tasks: the DAG (dag), one adapter per stage (tasks/), the artifact store,
run records, summaries and inspect views. Nothing here computes a search decision: that is
lospmm.stages."""
