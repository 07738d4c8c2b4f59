"""Code analyzers evaluated on the basic blocks of real kernels (issue 4, DESIGN §9).

Available here: ``model`` (our resource model), ``llvm-mca``, ``osaca``, ``native`` (our own
measurement of the block's multiset), ``written`` (the block measured as written, BHive's
method) and ``loop`` (the larger of native's throughput and the block's longest loop-carried
chain with measured latencies). Tools of the seed's harness that cannot run on this
machine are listed in :data:`UNAVAILABLE` with the reason, so that the report names them.

Every analyzer has ``name``, ``describe()`` and ``predict(blocks) -> {(benchmark, block_id):
Result}``; :func:`predictions_frame` turns the answers into the predictions table.
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from cpumap.evaluate.analyzers.base import (
    PREDICTION_COLUMNS,
    BatchError,
    BlockInput,
    Result,
    ToolResult,
    block_inputs,
    predict_blocks,
    render_att,
    run_batched,
    run_tool,
)
from cpumap.evaluate.analyzers.internal import ModelAnalyzer, NativeAnalyzer, WrittenAnalyzer
from cpumap.evaluate.analyzers.llvm_mca import LlvmMca
from cpumap.evaluate.analyzers.loop import FirstOk, LoopAnalyzer, Precomputed
from cpumap.evaluate.analyzers.osaca import Osaca

__all__ = [
    "ANALYZERS",
    "BatchError",
    "BlockInput",
    "FirstOk",
    "LlvmMca",
    "LoopAnalyzer",
    "ModelAnalyzer",
    "NativeAnalyzer",
    "Osaca",
    "PREDICTION_COLUMNS",
    "PREDICTION_SCHEMA",
    "Precomputed",
    "Result",
    "ToolResult",
    "UNAVAILABLE",
    "WrittenAnalyzer",
    "block_inputs",
    "predict_blocks",
    "predictions_frame",
    "render_att",
    "run_batched",
    "run_tool",
]

#: Arrow schema of the predictions tables (types fixed, also for empty tables).
PREDICTION_SCHEMA = pa.schema([
    ("benchmark", pa.string()), ("block_id", pa.int64()), ("analyzer", pa.string()),
    ("cycles", pa.float64()), ("status", pa.string()), ("error", pa.string()),
    ("seconds", pa.float64()),
])

#: The analyzers this harness can run, in report order.
ANALYZERS = ["model", "native", "written", "loop", "llvm-mca", "osaca"]

#: Analyzers of the seed's harness that are not run here, and why.
UNAVAILABLE = {
    "uiCA": "models Intel cores only, Sandy Bridge to Rocket/Alder Lake (no AMD core, no "
            "Sapphire Rapids), and ships as source that needs Intel XED built from source: "
            "neither is in PyPI or Debian, the registries cpumap installs from",
    "IACA": "Intel's analyzer, discontinued in 2019: Intel microarchitectures only (Haswell "
            "to Skylake), a closed-source binary not packaged for Debian",
    "Ithemal": "learned model trained on BHive measurements of Intel CPUs (Ivy Bridge, "
               "Haswell, Skylake): no model of a newer Intel or of any AMD core, and no package "
               "in PyPI or Debian",
    "Gus": "QEMU-based dynamic analyzer from F. Gruber's PhD work: no public release to "
           "install",
}


def predictions_frame(analyzer: str, blocks: list[BlockInput],
                      results: dict[tuple[str, int], Result]) -> pd.DataFrame:
    """The predictions table (CONTRACTS columns) of one analyzer, one row per block."""
    rows = []
    for b in blocks:
        r = results.get(b.key) or Result(status="failed", error="no result")
        rows.append({"benchmark": b.benchmark, "block_id": b.block_id, "analyzer": analyzer,
                     "cycles": float(r.cycles) if r.status == "ok" else float("nan"),
                     "status": r.status, "error": r.error, "seconds": float(r.seconds)})
    df = pd.DataFrame(rows, columns=PREDICTION_COLUMNS)
    return df.astype({"block_id": "int64", "cycles": "float64", "seconds": "float64"})
