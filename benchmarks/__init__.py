"""Benchmarks and the GPU plan: scripts that print tables and write results (benchmarks/results/).
Run them from the repository root as modules, `python -m benchmarks.<name>`, so that both `lospmm`
(from the checkout, installed or not) and their shared support modules (`benchmarks.gpuplan`) import
with no sys.path edits. The library never imports this package."""
