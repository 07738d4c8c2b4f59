"""The shipped configs validate against the schema, and the schema rejects typos."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from cpumap.host import machine

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / "config" / name).read_text())


@pytest.mark.parametrize("name", ["config.yaml", "full.yaml"])
def test_shipped_configs_validate(name: str) -> None:
    config = load(name)
    validate(config, str(SCHEMA), set_default=True)
    assert config["results_dir"] == "results"
    assert config["machine"]["backend"] == "native"


def test_profiles_differ_in_selection() -> None:
    assert load("config.yaml")["selection"]["forms"] == "quick"
    assert load("full.yaml")["selection"]["forms"] == "all"


def test_defaults_fill_an_empty_config() -> None:
    config: dict = {}
    validate(config, str(SCHEMA), set_default=True)
    assert config["bench"]["unroll_size"] == 200
    assert config["bench"]["clock"] == "auto"
    assert config["bench"]["cpu"] is None
    assert config["catalogue"]["smoke_run"] is True
    assert config["selection"]["quick_list"] == "config/quick_forms.txt"


@pytest.mark.parametrize(
    "patch",
    [
        {"typo": 1},
        {"bench": {"unrol_size": 100}},
        {"bench": {"clock": "rdtsc"}},
        {"bench": {"arena_bytes": 5000}},
        {"bench": {"min_reps": 0}},
        {"machine": {"backend": "simulated"}},  # simulated needs a mapping
        {"selection": {"forms": "some"}},
    ],
)
def test_schema_rejects(patch: dict) -> None:
    config = copy.deepcopy(load("config.yaml"))
    for key, value in patch.items():
        if isinstance(value, dict):
            config.setdefault(key, {}).update(value)
        else:
            config[key] = value
    with pytest.raises(Exception, match="(?i)validat"):
        validate(config, str(SCHEMA), set_default=True)


def test_every_schema_key_is_documented() -> None:
    schema = yaml.safe_load(SCHEMA.read_text())

    def walk(node: dict, path: str) -> list[str]:
        missing = []
        for key, sub in (node.get("properties") or {}).items():
            if "description" not in sub:
                missing.append(path + key)
            missing += walk(sub, f"{path}{key}.")
        return missing

    assert walk(schema, "") == []
    assert schema["additionalProperties"] is False


def test_quick_list_exists_when_referenced() -> None:
    assert (ROOT / load("config.yaml")["selection"]["quick_list"]).is_file()


def test_machine_id_is_a_valid_wildcard() -> None:
    import re

    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", machine.machine_id())
