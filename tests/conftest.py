"""Shared fixtures: the host's catalogue (built once per session, without the smoke run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpumap.host import machine
from cpumap.isa import catalogue as isa


@pytest.fixture(scope="session")
def host() -> dict:
    return machine.describe()


@pytest.fixture(scope="session")
def catalogue_df(host, tmp_path_factory):
    work = tmp_path_factory.mktemp("isa")
    return isa.build_catalogue(host, Path(work), smoke_run=False)


@pytest.fixture(scope="session")
def catalogue(catalogue_df) -> isa.Catalogue:
    return isa.Catalogue(catalogue_df)
