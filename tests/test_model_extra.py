"""model.extra_forms: forms added to the modelled set, unknown or unmeasurable ones reported."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))

from model_common import extra_forms  # noqa: E402


def test_extra_forms(tmp_path) -> None:
    forms = pd.DataFrame({"name": ["A", "B", "C"], "status": ["ok", "excluded", "ok"]})
    path = tmp_path / "suite_forms.txt"
    path.write_text("C  # from a kernel\nB\nZ\n\n")
    kept, left = extra_forms({"extra_forms": str(path)}, forms)
    assert kept == ["C"]
    assert left == {"B": f"listed in {path} but not measurable here (excluded)",
                    "Z": f"listed in {path} but not in the catalogue"}
    assert extra_forms({"extra_forms": None}, forms) == ([], {})
    assert extra_forms({}, forms) == ([], {})
