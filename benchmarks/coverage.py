"""Coverage of a resource model on real code (issue 13, item 4): the suite and a block corpus.

Usage: python benchmarks/coverage.py [--machine results/<id>] [--model M.json]
                                     [--corpus ../shared/corpora/bhive/sources] [--top 12]

Prints, from a results directory of a run with the suite evaluated (evaluate/blocks and
evaluate/counts) and its model:

- per suite benchmark, the share of executed instructions in blocks the model predicts, and
  all benchmarks together (target: at least 99 %);
- per application of the corpus (BHive's sources: ``hex,frequency`` per block), the
  frequency-weighted share of blocks whose every instruction is a modelled form (target: at
  least 99 % each);
- the missing forms that weigh most, each with why (not modelled / excluded by the
  catalogue, with its reason / not in the catalogue).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from cpumap.evaluate import coverage
from cpumap.isa.catalogue import Catalogue
from cpumap.model import resmodel

ROOT = Path(__file__).resolve().parents[1]


def pick_machine(results: Path) -> Path:
    dirs = [d for d in results.iterdir() if (d / "machine.json").exists()] \
        if results.is_dir() else []
    if len(dirs) != 1:
        raise SystemExit(f"give --machine: {results} holds {len(dirs)} machine directories")
    return dirs[0]


def table(items: list[coverage.Coverage], top: int) -> str:
    df = pd.DataFrame([c.row(top=2) for c in items])
    for col in ("share", "share_flagged"):
        df[col] = df[col].map(lambda v: f"{v:.2%}")
    return df.to_string(index=False, max_colwidth=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", type=Path, help="results/<machine_id> (default: the only one)")
    ap.add_argument("--model", type=Path, help="model.json (default: <machine>/model/)")
    ap.add_argument("--corpus", type=Path,
                    default=ROOT.parent / "shared" / "corpora" / "bhive" / "sources")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--all-ok", action="store_true",
                    help="no model: count every form the catalogue can measure as modelled "
                         "(the ceiling a model of every ok form reaches)")
    args = ap.parse_args()
    machine = args.machine or pick_machine(ROOT / "results")
    cat = Catalogue.load(machine / "isa" / "forms.parquet")
    if args.all_ok:
        forms = set(cat.df.name[cat.df.status == "ok"])
        print(f"every ok form of the catalogue: {len(forms)} forms (no model)")
    else:
        model = resmodel.load(args.model or machine / "model" / "model.json")
        forms = set(model.rho)
        print(f"model: {len(model.rho)} forms, {len(model.resources)} resources "
              f"({args.model or machine / 'model' / 'model.json'})")

    ev = machine / "evaluate"
    if (ev / "blocks").is_dir() and (ev / "counts").is_dir():
        blocks = pd.concat([pd.read_parquet(p) for p in sorted((ev / "blocks").glob("*.parquet"))])
        counts = pd.concat([pd.read_parquet(p) for p in sorted((ev / "counts").glob("*.parquet"))])
        suite = coverage.suite_coverage(blocks, counts, forms, cat)
        print(f"\n== suite: executed instructions in predicted blocks, {len(suite)} benchmarks")
        print(table(suite, args.top))
        total = coverage.summary(suite)
        print(f"all benchmarks: {total.share:.2%} of {total.total:.0f} executed instructions; "
              f"{sum(c.share >= 0.99 for c in suite)} of {len(suite)} benchmarks at >= 99 %; "
              f"predicted at all (flagged lower bounds included): {total.share_flagged:.2%}, "
              f"{sum(c.share_flagged >= 0.99 for c in suite)} of {len(suite)} at >= 99 %")
        print("missing (share of executed instructions): " + "; ".join(
            f"{k} {v / total.total:.2%}" for k, v in total.missing.most_common(args.top)))
        print(f"blocks mixing legacy SSE and 256-bit AVX: {total.mixing_blocks} of "
              f"{total.blocks} ({total.mixing_weight / total.total:.2%} of the executed "
              "instructions)")
    else:
        print(f"\n== suite: no evaluate/blocks and evaluate/counts under {machine}")

    if args.corpus.is_dir():
        sources = {p.stem.removesuffix(".goto"): p for p in sorted(args.corpus.glob("*.csv"))}
        apps = coverage.corpus_coverage(sources, cat, forms)
        print(f"\n== corpus {args.corpus}: frequency-weighted blocks predicted, "
              f"{len(apps)} applications")
        print(table(apps, args.top))
        total = coverage.summary(apps)
        print(f"applications at >= 99 %: {sum(c.share >= 0.99 for c in apps)} of {len(apps)}; "
              f"lowest {min(c.share for c in apps):.2%}; blocks predicted "
              f"{total.blocks_covered} of {total.blocks}")
        print(f"predicted at all (flagged lower bounds included): "
              f"{sum(c.share_flagged >= 0.99 for c in apps)} of {len(apps)} at >= 99 %; "
              f"lowest {min(c.share_flagged for c in apps):.2%}; blocks "
              f"{total.blocks_covered + total.blocks_flagged} of {total.blocks}")
        weight = sum(c.total for c in apps)
        print("missing (share of all applications' weight): " + "; ".join(
            f"{k} {v / weight:.2%}" for k, v in total.missing.most_common(args.top)))
        mixing = ", ".join(f"{c.name} {c.mixing_blocks}" for c in apps if c.mixing_blocks)
        print(f"blocks mixing legacy SSE and 256-bit AVX: {total.mixing_blocks} of "
              f"{total.blocks}" + (f" ({mixing})" if mixing else ""))
    else:
        print(f"\n== corpus: {args.corpus} not found (give --corpus)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
