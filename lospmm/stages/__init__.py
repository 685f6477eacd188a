"""Pure stage computations: numpy/scipy in, typed records out. No Prefect, no file I/O."""
