"""The bottom floor: how results are kept on disk, so that nothing on disk is ever half-written.

``files`` (atomic writes through a temporary file and a rename, checked Parquet reads, log
redirection), ``db`` (the append-only Parquet measurement database: schema, parts, loading,
aggregation of repetitions), ``archive`` (results/ as a tar with a checksum manifest, restore)
and ``merge`` (databases of several nodes into one). Imports nothing else from cpumap.
"""
