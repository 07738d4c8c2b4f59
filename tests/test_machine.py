"""Tests of cpumap.host.machine: the host description and the machine id."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

from cpumap.host import machine

# A trimmed /proc/cpuinfo of the reference KVM guest (two processors).
CPUINFO = """\
processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
microcode\t: 0x1000065
cpu MHz\t\t: 2596.140
physical id\t: 0
core id\t\t: 0
cpu cores\t: 2
flags\t\t: fpu sse sse2 avx avx2 avx512f constant_tsc rep_good hypervisor tsc_known_freq
bogomips\t: 5192.28

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
physical id\t: 0
core id\t\t: 1
cpu cores\t: 2
flags\t\t: fpu sse sse2 avx avx2 avx512f constant_tsc rep_good hypervisor tsc_known_freq
bogomips\t: 5192.28
"""

ID_RE = re.compile(r"^[a-z0-9]+-[a-z0-9p.-]+-[0-9a-f]{8}$")


@pytest.fixture(scope="module")
def desc() -> dict:
    return machine.describe()


def test_parse_cpuinfo_fixture() -> None:
    info = machine.parse_cpuinfo(CPUINFO)
    assert info["n_processors"] == 2
    assert info["n_cores"] == 2
    assert info["n_sockets"] == 1
    ident = machine.identity(CPUINFO)
    assert ident["vendor"] == "amd"
    assert (ident["family"], ident["model"], ident["stepping"]) == (25, 17, 1)
    assert ident["isa_flags"] == sorted(ident["isa_flags"])


def test_machine_id_of_fixture_names_cpuid_signature() -> None:
    # What CPUID says (family 0x19 model 0x11 = Zen 4 signature), whatever the host chip.
    mid = machine.machine_id(machine.identity(CPUINFO))
    assert mid.startswith("amd-zen4-f19-m11-")
    assert ID_RE.match(mid)


def test_machine_id_ignores_flag_order_and_kernel_flags() -> None:
    base = machine.identity(CPUINFO)
    shuffled = dict(base, isa_flags=list(reversed(base["isa_flags"])) + ["nopl", "xtopology"])
    assert machine.machine_id(shuffled) == machine.machine_id(base)


def test_machine_id_changes_with_isa_flags() -> None:
    base = machine.identity(CPUINFO)
    more = dict(base, isa_flags=base["isa_flags"] + ["avx512_fp16"])
    assert machine.machine_id(more) != machine.machine_id(base)


def test_machine_id_stable_across_calls(desc: dict) -> None:
    first = machine.machine_id()
    assert first == machine.machine_id()
    assert first == desc["machine_id"]
    assert first == machine.machine_id(desc)
    assert ID_RE.match(first)


def test_machine_id_independent_of_hostname(desc: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "some-other-host")
    other = machine.describe()
    assert other["host"] == "some-other-host"
    assert other["machine_id"] == desc["machine_id"]
    assert machine.machine_id(dict(desc, host="x")) == desc["machine_id"]


def test_machine_json_has_all_keys(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "machine.json"
    written = machine.write_machine_json(out, {"backend": "native", "mapping": None})
    loaded = json.loads(out.read_text())
    missing = [k for k in machine.REQUIRED_KEYS if k not in loaded]
    assert not missing
    assert loaded["machine_id"] == written["machine_id"]
    assert loaded["isa_flags"] == sorted(loaded["isa_flags"])
    assert isinstance(loaded["caches"], list)
    for key in ("available", "evidence", "perf_event_paranoid"):
        assert key in loaded["counters"]
    assert loaded["tsc"]["method"] is None or isinstance(loaded["tsc"]["method"], str)
    assert set(loaded["toolchain"]) >= {"gcc", "as", "gdb", "python", "iced_x86", "papi"}
    assert loaded["backend"]["backend"] == "native"
    assert not list(out.parent.glob(".*tmp"))  # atomic write left no temporary file


def test_cpuid_agrees_with_proc_cpuinfo(desc: dict) -> None:
    snap = desc["cpuid"]
    if not snap["available"]:
        pytest.skip(f"cpuid not runnable here: {snap['error']}")
    assert (snap["family"], snap["model"], snap["stepping"]) == (
        desc["family"],
        desc["model"],
        desc["stepping"],
    )
    assert snap["vendor_id"] == desc["vendor_id"]
    assert desc["uarch"]["cpuinfo_cpuid_disagreement"] is None


def test_virtualised_guest_carries_caveat(desc: dict) -> None:
    if desc["virtualisation"]["virtualised"]:
        assert desc["uarch"]["caveat"]
        assert desc["virtualisation"]["evidence"]
    else:
        assert desc["uarch"]["caveat"] is None


@pytest.mark.parametrize(
    ("eax", "expected"),
    [
        (0x00A10F11, (0x19, 0x11, 1)),  # the reference KVM guest (Zen 4 signature)
        (0x00B00F21, (0x1A, 0x02, 1)),  # Zen 5 (Turin)
        (0x00830F10, (0x17, 0x31, 0)),  # Zen 2 (Rome)
        (0x000906EA, (0x6, 0x9E, 0xA)),  # Coffee Lake
        (0x000806F8, (0x6, 0x8F, 0x8)),  # Sapphire Rapids
    ],
)
def test_decode_signature(eax: int, expected: tuple[int, int, int]) -> None:
    assert machine.decode_signature(eax) == expected


@pytest.mark.parametrize(
    ("vendor", "family", "model", "stepping", "name"),
    [
        ("amd", 0x17, 0x01, 1, "zen"),
        ("amd", 0x17, 0x08, 2, "zen+"),
        ("amd", 0x17, 0x31, 0, "zen2"),
        ("amd", 0x19, 0x01, 1, "zen3"),
        ("amd", 0x19, 0x11, 1, "zen4"),
        ("amd", 0x19, 0x61, 2, "zen4"),
        ("amd", 0x1A, 0x02, 1, "zen5"),
        ("amd", 0x1A, 0x44, 0, "zen5"),
        ("intel", 6, 0x55, 4, "skylake-x"),
        ("intel", 6, 0x55, 7, "cascadelake"),
        ("intel", 6, 0x5E, 3, "skylake"),
        ("intel", 6, 0x8F, 8, "sapphirerapids"),
        ("amd", 0x15, 0x02, 0, None),
        ("intel", 0xF, 0x04, 0, None),
    ],
)
def test_uarch_table(vendor: str, family: int, model: int, stepping: int, name: str | None) -> None:
    assert machine.uarch_name(vendor, family, model, stepping) == name


@pytest.mark.parametrize(
    ("vendor", "family", "model", "flags", "name", "corrected"),
    [
        # a KVM guest seen here: Rocket Lake's signature with Sapphire Rapids' AMX/FP16 flags
        ("intel", 6, 0xA7, ["avx512f", "avx512_fp16", "amx_tile"], "sapphirerapids", True),
        ("intel", 6, 0xA7, ["avx512f", "avx512vl"], "rocketlake", False),
        ("intel", 6, 0x8F, ["avx512f", "amx_tile"], "sapphirerapids", False),
        ("intel", 6, 0x01, ["amx_tile"], "sapphirerapids", True),  # unknown signature
        ("amd", 0x19, 0x01, ["avx2", "avx512f"], "zen4", True),  # a Zen 3 signature cannot
        ("amd", 0x19, 0x11, ["avx2"], "zen4", False),  # hidden features prove nothing
    ],
)
def test_isa_flags_overrule_an_impossible_signature(vendor: str, family: int, model: int,
                                                    flags: list[str], name: str,
                                                    corrected: bool) -> None:
    got, basis = machine.resolve_uarch(vendor, family, model, 0, flags)
    assert got == name
    assert ("never had the ISA flag" in basis) is corrected
    ident = {"vendor": vendor, "family": family, "model": model, "isa_flags": flags}
    assert machine.machine_id(ident).startswith(f"{vendor}-{name}-f{family:x}-m{model:x}-")


def test_unknown_signature_falls_back_to_numbers() -> None:
    ident = {"vendor": "amd", "family": 21, "model": 2, "isa_flags": ["sse2"]}
    assert re.match(r"^amd-fam21-mod2-[0-9a-f]{8}$", machine.machine_id(ident))
    zen_plus = {"vendor": "amd", "family": 0x17, "model": 0x08, "isa_flags": ["sse2"]}
    assert machine.machine_id(zen_plus).startswith("amd-zenp-f17-m8-")


def test_simulated_machine_id(tmp_path: Path) -> None:
    mapping = tmp_path / "Toy Mapping.json"
    mapping.write_text('{"add": [["p0"]]}')
    a = machine.simulated_machine_id(mapping, 0.0, 0)
    assert a == machine.simulated_machine_id(mapping, 0.0, 0)
    assert a.startswith("sim-toy-mapping-")
    assert a != machine.simulated_machine_id(mapping, 0.01, 0)
    assert a != machine.simulated_machine_id(mapping, 0.0, 1)
    mapping.write_text('{"add": [["p1"]]}')
    assert a != machine.simulated_machine_id(mapping, 0.0, 0)


def test_cache_info_from_fake_sysfs(tmp_path: Path) -> None:
    for idx, (level, kind, size, shared) in enumerate(
        [(1, "Data", "48K", "0"), (2, "Unified", "1024K", "0"), (3, "Unified", "32768K", "0-7")]
    ):
        d = tmp_path / f"index{idx}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
        (d / "coherency_line_size").write_text("64\n")
        (d / "ways_of_associativity").write_text("8\n")
        (d / "shared_cpu_list").write_text(f"{shared}\n")
    caches = machine.cache_info(tmp_path)
    assert [c["level"] for c in caches] == [1, 2, 3]
    assert caches[0]["size_bytes"] == 48 * 1024
    assert caches[2]["size_bytes"] == 32 * 1024 * 1024
    assert caches[2]["shared_cpus"] == 8
    assert caches[1]["line_bytes"] == 64
