"""Benchmarks and the device program: scripts that print tables and write results (benchmarks/results/).
Run them from the repository root as modules, `python -m benchmarks.<name>`, so that both `lospmm`
(from the checkout, installed or not) and their shared modules import with no sys.path edits. What
goes to a GPU goes through four: `sets` (the kernel sets), `bundle` (the one bundle format), `measure`
(the one way a bundle is checked and timed) and `device` (the program, its steps in order); `analysis`
computes the tables from the rows, anywhere. The library never imports this package."""
