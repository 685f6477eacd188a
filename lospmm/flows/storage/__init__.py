"""What the flow keeps on disk: atomic, checksummed artifacts and locks (store), the Arrow building
blocks of the schemas (schemas), the content-addressed compile cache (compile_cache), run records
(runs) and ranker models (ranker_store)."""
