"""Write the vendored BHive sample (data/bhive-sample/): a fixed random draw of blocks from a
few applications of a BHive corpus directory, with its license and a README.

    .venv/bin/python benchmarks/vendor_bhive_sample.py [--corpus DIR] [--per-app N]

The default run and the tests read the sample; the corpus profile reads a whole corpus
directory of the same format (``hex,frequency`` lines per application).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from cpumap.evaluate.coverage import read_corpus  # noqa: E402

APPS = ("eigen-matmat", "gzip-compress", "openblas-dgemm.goto", "openssl", "redis-server",
        "sqlite")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "corpora" / "bhive")
    ap.add_argument("--per-app", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "bhive-sample")
    args = ap.parse_args()
    out = args.out
    (out / "sources").mkdir(parents=True, exist_ok=True)
    for app in APPS:
        blocks = read_corpus(args.corpus / "sources" / f"{app}.csv")
        pick = random.Random(f"{args.seed}:{app}").sample(blocks, min(args.per_app, len(blocks)))
        lines = [f"{h},{f:g}\n" for h, f in sorted(pick, key=lambda b: -b[1])]
        (out / "sources" / f"{app}.csv").write_text("".join(lines))
        print(f"{app}: {len(pick)} of {len(blocks)} blocks")
    shutil.copyfile(args.corpus / "LICENSE.txt", out / "LICENSE.txt")
    (out / "README.md").write_text(
        "# BHive sample (vendored)\n\n"
        f"{args.per_app} blocks per application, drawn at random (seed {args.seed}) by "
        "`benchmarks/vendor_bhive_sample.py` from the sources of the BHive benchmark suite "
        "(Chen et al., IISWC 2019; MIT license, LICENSE.txt): real x86-64 basic blocks of "
        f"{', '.join(APPS)}.\n\n"
        "`sources/<application>.csv`: one block per line, `hex,frequency` (the block's "
        "machine code without its final branch; its static frequency in the application, a "
        "weight). The default pipeline evaluates these; `corpus.dir` points at a whole corpus "
        "directory of the same format.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
