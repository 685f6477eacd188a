"""What a run reports: the per-layer run summary and Prefect artifacts (summary), and
`lospmm inspect`'s views of runs and artifacts (inspection)."""
