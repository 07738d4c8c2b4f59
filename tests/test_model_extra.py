"""model.extra_forms: forms added to the modelled set, unknown or unmeasurable ones reported."""

from __future__ import annotations

import pandas as pd

from cpumap.model.jobs import listed_forms as extra_forms


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
