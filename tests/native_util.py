"""A native measurement against what physics says it is: within a tolerance and the
estimate's own uncertainty. The host's clock may move between two calibration samples
unseen; the rounds then disagree and the estimate's uncertainty says so (docs/measurement.md,
"The clock")."""

from __future__ import annotations

import pytest

#: An estimate less certain than this says nothing worth testing.
MAX_UNCERTAINTY = 0.5


def assert_near(value: float, unc: float, expected: float, rel: float, what: object = "") -> None:
    """``value`` (its relative uncertainty ``unc``) within ``rel`` + ``unc`` of ``expected``."""
    assert 0.0 <= unc < MAX_UNCERTAINTY, (what, unc)
    assert value == pytest.approx(expected, rel=rel + unc), (what, value, unc)
