"""A CSR matrix as a file: one Parquet row (rows, cols, indptr, indices, data), the project's format,
read the same by any pyarrow. (An npz that numpy 2.5.2 wrote on the GPU machine could not be read
back there inside pytest: its header failed to tokenize. Parquet has no such step.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp


def write_matrix(path: str | Path, a: sp.spmatrix) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    a = sp.csr_matrix(a)
    pq.write_table(pa.table({"rows": [a.shape[0]], "cols": [a.shape[1]], "indptr": [a.indptr.astype(np.int64)],
                             "indices": [a.indices.astype(np.int32)], "data": [a.data.astype(np.float32)]}), path)


def read_matrix(path: str | Path) -> sp.csr_matrix:
    import pyarrow.parquet as pq

    (r,) = pq.read_table(path).to_pylist()
    return sp.csr_matrix((np.asarray(r["data"], np.float32), np.asarray(r["indices"], np.int32),
                          np.asarray(r["indptr"], np.int64)), shape=(r["rows"], r["cols"]))
