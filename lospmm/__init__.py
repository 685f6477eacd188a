"""lospmm: sparsity-specialised SpMM kernels for pruned networks (LO-SpMM)."""

__version__ = "0.1.0"
