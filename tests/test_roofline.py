"""Roofline: flops per instruction, theoretical peaks, plateau detection, the sweep program,
Callgrind parsing, kernel points and plots -- exact results on fixtures."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cpumap.evaluate import suite
from cpumap.isa.x86 import FormSpec, Operand
from cpumap.roofline import build, flops, peak, plots, points, sweep

ZEN4_CACHES = [{"level": 1, "bytes": 32768, "shared_cpus": 1},
               {"level": 2, "bytes": 1 << 20, "shared_cpus": 1},
               {"level": 3, "bytes": 32 << 20, "shared_cpus": 2}]


# ----------------------------------------------------------------------------- flops


@pytest.mark.parametrize("code, expected", [
    ("EVEX_VFMADD231PD_ZMM_K1Z_ZMM_ZMMM512B64_ER", (16, "fma", "dp", 8, 512)),
    ("VEX_VFMADD231PD_YMM_YMM_YMMM256", (8, "fma", "dp", 4, 256)),
    ("VEX_VFMADD231SD_XMM_XMM_XMMM64", (2, "fma", "dp", 1, 64)),
    ("VEX_VFNMSUB213SS_XMM_XMM_XMMM32", (2, "fma", "sp", 1, 32)),
    ("VEX_VFMADDSUB231PS_YMM_YMM_YMMM256", (16, "fma", "sp", 8, 256)),
    ("ADDSD_XMM_XMMM64", (1, "add", "dp", 1, 64)),
    ("ADDPS_XMM_XMMM128", (4, "add", "sp", 4, 128)),
    ("MULPD_XMM_XMMM128", (2, "mul", "dp", 2, 128)),
    ("VEX_VADDPS_XMM_XMM_XMMM128", (4, "add", "sp", 4, 128)),
    ("VEX_VHADDPD_YMM_YMM_YMMM256", (4, "add", "dp", 4, 256)),
    ("VEX_VSQRTPD_YMM_YMMM256", (4, "sqrt", "dp", 4, 256)),
    ("EVEX_VMINPD_ZMM_K1Z_ZMM_ZMMM512B64_SAE", (8, "minmax", "dp", 8, 512)),
    ("EVEX_VADDPH_ZMM_K1Z_ZMM_ZMMM512B16_ER", (32, "add", "hp", 32, 512)),
])
def test_flops_of_known_codes(code, expected):
    f = flops.flops_of_code(code)
    assert (f.flops, f.kind, f.precision, f.elements, f.vector_bits) == expected
    assert not f.masked


@pytest.mark.parametrize("code", ["VEX_VCVTDQ2PD_YMM_XMMM128", "VEX_VDPPS_XMM_XMM_XMMM128_IMM8",
                                  "MOVSD_XMM_XMMM64", "VEX_VCMPPD_YMM_YMM_YMMM256_IMM8",
                                  "ADD_RM64_R64"])
def test_not_flops(code):
    assert flops.flops_of_code(code) == flops.NONE


@pytest.mark.parametrize("hexes, nflops, rd, wr, masked", [
    ("c4e2f5b810", 8, 32, 0, False),    # vfmadd231pd (%rax), %ymm1, %ymm2
    ("f20f5801", 1, 8, 0, False),       # addsd (%rcx), %xmm0
    ("c5fd1101", 0, 0, 32, False),      # vmovupd %ymm0, (%rcx)
    ("50", 0, 0, 8, False),             # push %rax
    ("c3", 0, 8, 0, False),             # ret
    ("62f1fd4958c1", 8, 0, 0, True),    # vaddpd %zmm1, %zmm0, %zmm0{%k1}
])
def test_work_of_encoded_instruction(hexes, nflops, rd, wr, masked):
    w = flops.work_of_hex(hexes)
    assert (w.flops.flops, w.read_bytes, w.write_bytes, w.flops.masked) == (nflops, rd, wr,
                                                                            masked)


def _spec(code: str, mem: bool = False, operands=()) -> FormSpec:
    return FormSpec(code=code, mem=mem, operands=tuple(operands))


def test_masked_form_is_flagged():
    k = Operand("reg", "K", 64, "r", "K")
    assert flops.flops_of_form(_spec("EVEX_VADDPD_ZMM_K1Z_ZMM_ZMMM512B64_ER", operands=[k])).masked


# ----------------------------------------------------------------------------- peaks


FORMS = {
    "VFMADD231PD_ZMM_ZMM_ZMM": "EVEX_VFMADD231PD_ZMM_K1Z_ZMM_ZMMM512B64_ER",
    "VFMADD231PD_YMM_YMM_YMM": "VEX_VFMADD231PD_YMM_YMM_YMMM256",
    "VFMADD231PS_ZMM_ZMM_ZMM": "EVEX_VFMADD231PS_ZMM_K1Z_ZMM_ZMMM512B32_ER",
    "VADDPD_ZMM_ZMM_ZMM": "EVEX_VADDPD_ZMM_K1Z_ZMM_ZMMM512B64_ER",
    "VADDPD_YMM_YMM_YMM": "VEX_VADDPD_YMM_YMM_YMMM256",
    "VADDPS_ZMM_ZMM_ZMM": "EVEX_VADDPS_ZMM_K1Z_ZMM_ZMMM512B32_ER",
    "ADDSD_XMM_XMM": "ADDSD_XMM_XMMM64",
    "VFMADD231PD_ZMM_ZMM_M512": "EVEX_VFMADD231PD_ZMM_K1Z_ZMM_ZMMM512B64_ER",
}


def _forms():
    return [(n, _spec(c, mem=n.endswith("M512"))) for n, c in FORMS.items()]


def test_zen4_peaks_derived_from_forms_and_table():
    p = peak.theoretical_peaks("zen4", _forms())
    dp = p["dp"]["fma"]
    # 512-bit FMA: 16 flops x 2 pipes / (512 / 256) cycles = 16 flops/cycle (ymm ties; widest)
    assert (dp.flops_per_cycle, dp.form, dp.flops_per_insn, dp.insns_per_cycle) == \
        (16.0, "VFMADD231PD_ZMM_ZMM_ZMM", 16, 1.0)
    assert dp.table_row["uarch"] == "zen4" and "AMD-Z4" in dp.table_row["source"]
    # FMA pipes full + the separate adders: 16 + 8
    assert p["dp"]["fma+add"].flops_per_cycle == 24.0
    assert p["sp"]["fma"].flops_per_cycle == 32.0
    assert p["sp"]["fma+add"].flops_per_cycle == 48.0


def test_zen5_and_intel_rows():
    assert peak.theoretical_peaks("zen5", _forms())["dp"]["fma"].flops_per_cycle == 32.0
    sk = peak.theoretical_peaks("skylake-x", _forms())
    assert sk["dp"]["fma"].flops_per_cycle == 32.0
    assert "fma+add" not in sk["dp"]  # adds share the FMA ports
    with pytest.raises(KeyError):
        peak.theoretical_peaks("pentium4", _forms())


def test_peak_table_fraction():
    theo = peak.theoretical_peaks("zen4", _forms())
    summary = [{"status": "ok", "variant": "avx512-dp-fma", "precision": "dp",
                "operation": "fma", "one_core": {"flops_per_cycle": 15.2}},
               {"status": "ok", "variant": "avx512-dp-fma+add", "precision": "dp",
                "operation": "fma+add", "one_core": {"flops_per_cycle": 21.6}}]
    t = build.ceilings.peak_table(summary, theo)["dp"]
    assert t["fma"]["fraction"] == pytest.approx(0.95)
    assert t["fma+add"]["variant"] == "avx512-dp-fma+add"
    assert t["fma+add"]["fraction"] == pytest.approx(0.9)


# ----------------------------------------------------------------------------- sweep sizes


def test_sweep_sizes_default_and_campaign():
    sizes = sweep.sweep_sizes(ZEN4_CACHES, per_level=3, threads=2)
    assert sizes == [4096, 8192, 16384, 65536, 185344, 524288, 2097152, 4194304, 8388608,
                     134217728, 189812736, 268435456]
    assert max(sizes) >= 8 * (32 << 20)
    big = sweep.sweep_sizes(ZEN4_CACHES, per_octave=4, max_factor=16)
    # 17 octaves from 4 KiB to 512 MiB, 4 points each, both ends included
    assert big[0] == 4096 and big[-1] == 16 * (32 << 20) and len(big) == 69
    assert big[1] == 4871 // 1024 * 1024 + 1024  # 4096 x 2^(1/4) = 4871 -> 5120


def test_sweep_sizes_capped_for_a_huge_llc():
    """A guest reporting a 480 MiB L3: the 1 GiB cap keeps the DRAM points at 2x the LLC."""
    huge = [{"level": 1, "bytes": 48 << 10, "shared_cpus": 1},
            {"level": 2, "bytes": 2 << 20, "shared_cpus": 1},
            {"level": 3, "bytes": 480 << 20, "shared_cpus": 2}]
    free = sweep.sweep_sizes(huge, per_level=3, threads=2)
    capped = sweep.sweep_sizes(huge, per_level=3, threads=2, max_bytes=1 << 30)
    assert max(free) == 8 * (480 << 20) and max(capped) == 1 << 30
    assert capped[:-3] == free[:-3]  # the cache levels are swept as before
    assert all(2 * (480 << 20) <= s <= 1 << 30 for s in capped[-3:])
    # a cap below 2x the LLC is raised to it; a cap above max_factor x the LLC changes nothing
    assert max(sweep.sweep_sizes(huge, max_bytes=1 << 20)) == 2 * (480 << 20)
    assert sweep.sweep_sizes(ZEN4_CACHES, threads=2, max_bytes=1 << 30) == \
        sweep.sweep_sizes(ZEN4_CACHES, threads=2)


# ----------------------------------------------------------------------------- plateaus


def _synthetic(levels: dict[str, float], sizes, noise: float = 0.02, threads: int = 1):
    rng = np.random.default_rng(7)
    vals = []
    for s in sizes:
        lab = sweep.level_of(s, ZEN4_CACHES, threads)
        vals.append(levels[lab] * (1 + noise * rng.standard_normal()))
    return vals


def test_segment_is_exact_least_squares():
    assert sweep.segment([1, 1, 1, 5, 5, 9, 9, 9], 3) == [(0, 3), (3, 5), (5, 8)]
    assert sweep.segment([2.0], 1) == [(0, 1)]
    with pytest.raises(ValueError):
        sweep.segment([1, 2], 3)


def test_plateaus_found_and_labelled():
    sizes = sweep.sweep_sizes(ZEN4_CACHES, per_octave=2, max_factor=8)
    truth = {"L1": 60.0, "L2": 31.0, "L3": 26.0, "DRAM": 9.0}
    pl, check = sweep.find_plateaus(sizes, _synthetic(truth, sizes), ZEN4_CACHES)
    assert [p.label for p in pl] == ["L1", "L2", "L3", "DRAM"]
    for p in pl:
        assert p.bytes_per_cycle == pytest.approx(truth[p.label], rel=0.03)
        assert p.agreement == 1.0
    assert check["consistent"] and check["problems"] == [] and check["missing_levels"] == []
    # boundaries between the last point inside a level and the first beyond it
    assert 32768 <= pl[0].boundary_bytes <= 65536
    assert (1 << 20) <= pl[1].boundary_bytes <= (2 << 20)


def test_equal_levels_give_a_range_label_and_transition_points_do_not():
    sizes = sweep.sweep_sizes(ZEN4_CACHES, per_level=3)
    truth = {"L1": 28.0, "L2": 28.0, "L3": 27.0, "DRAM": 7.5}
    pl, check = sweep.find_plateaus(sizes, _synthetic(truth, sizes, 0.01), ZEN4_CACHES)
    assert [p.label for p in pl] == ["L1-L3", "DRAM"]
    assert check["consistent"], check


def test_split_level_is_merged_and_inversion_reported():
    sizes = [4096, 8192, 16384, 65536, 262144, 524288, 134217728, 268435456]
    vals = [60, 60, 60, 30, 30, 30, 12, 6]  # DRAM split in two pieces by "noise"
    pl, check = sweep.find_plateaus(sizes, vals, ZEN4_CACHES[:2] + ZEN4_CACHES[2:])
    assert [p.label for p in pl] == ["L1", "L2", "DRAM"]
    assert pl[-1].sizes == [134217728, 268435456] and pl[-1].bytes_per_cycle == 9.0
    assert check["missing_levels"] == ["L3"]
    pl, check = sweep.find_plateaus([4096, 8192, 262144, 524288], [20, 20, 40, 40],
                                    ZEN4_CACHES)
    assert not check["consistent"]
    assert any("not faster" in p for p in check["problems"])


def test_best_per_size_prefers_undisturbed_repetitions():
    df = pd.DataFrame({"scope": "one_core", "kind": "read", "bytes": 4096, "threads": 1,
                       "rep": [0, 1, 2], "bytes_per_cycle": [50.0, 70.0, 40.0],
                       "gbs": [180.0, 250.0, 150.0], "switches": [0, 3, 0]})
    b = sweep.best_per_size(df)
    assert b.bytes_per_cycle.tolist() == [50.0] and b.quiet.tolist() == [2]
    df["switches"] = 1
    assert sweep.best_per_size(df).bytes_per_cycle.tolist() == [70.0]


# ----------------------------------------------------------------------------- the C program


@pytest.fixture(scope="module")
def bw_bin(tmp_path_factory) -> Path:
    return sweep.build_sweep(tmp_path_factory.mktemp("bw"))


def test_sweep_program_tiny(bw_bin):
    res = sweep.run_sweep(bw_bin, sweep.KINDS, [4096, 8192], [0], reps=2, min_ms=0.2)
    pts = {(p["kind"], p["bytes"]): p for p in res["points"]}
    assert len(pts) == 10
    # bytes named per pass: arrays of S / arrays bytes rounded down to 256-byte chunks
    assert pts[("read", 4096)]["pass_bytes"] == 4096
    assert pts[("copy", 4096)]["pass_bytes"] == 4096
    assert pts[("triad", 4096)]["pass_bytes"] == 3 * 1280
    assert pts[("ntwrite", 8192)]["pass_bytes"] == 8192
    for p in res["points"]:
        assert p["threads"] == 1 and p["passes"] >= 1
        assert len(p["ticks"]) == len(p["switches"]) >= 2
        assert all(t > 0 for t in p["ticks"])
    meta = res["meta"]
    assert meta["clock"] == "tsc-calibrated" and meta["cpus"] == [0]
    assert 0.2 < meta["calib_before"] < 5
    df = sweep.to_frame(res, "one_core")
    row = df.iloc[0]
    assert row.bytes_moved == row.passes * 4096
    assert row.cycles == pytest.approx(row.ticks * row.calib_ratio)


def test_sweep_point_time_cap_stops_repetitions(bw_bin):
    """point_ms asks for 1 s of repetitions a point; max_point_ms (1 us, less than any one
    repetition takes) stops each point at reps; without it the 1 s asks for max_reps."""
    kw = {"reps": 2, "min_ms": 0.2, "quiet_reps": 64, "max_reps": 8, "point_ms": 1000.0}
    capped = sweep.run_sweep(bw_bin, ["read"], [4096], [0], max_point_ms=0.001, **kw)
    free = sweep.run_sweep(bw_bin, ["read"], [4096], [0], **kw)
    assert [len(p["ticks"]) for p in capped["points"]] == [2]
    assert [len(p["ticks"]) for p in free["points"]] == [8]


def test_sweep_program_rejects_bad_arguments(bw_bin):
    with pytest.raises(sweep.SweepError):
        sweep.run_sweep(bw_bin, ["read"], [100], [0])


# ----------------------------------------------------------------------------- callgrind


CALLGRIND_FIXTURE = """# callgrind format
version: 1
positions: instr line
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw ILdmr DLdmr DLdmw
fn=(10) main
cfn=(12) kernel_x
calls=1 0x1a80 0
0x13db 0 100 20 10
fn=(12)
0x1a80 0 1
+3 0 1 0 0 1
+2 0 1000 1000 0 0 10 0 0 10 0 0 4
* 0 5
-5 0 7
fn=(13) other
0x2000 0 9
"""


def test_parse_callgrind_self_costs():
    costs = points.parse_callgrind(CALLGRIND_FIXTURE, "kernel_x")
    assert sorted(costs) == [0x1a80, 0x1a83, 0x1a85]
    assert costs[0x1a80]["Ir"] == 1 + 7
    assert costs[0x1a83]["I1mr"] == 1
    assert costs[0x1a85]["Ir"] == 1005 and costs[0x1a85]["DLmr"] == 10
    mem = points.memory_bytes(costs)
    assert mem["ll_misses"] == 10 and mem["ll_dirty_evictions"] == 4
    assert mem["mem_bytes"] == 64 * 14


@pytest.mark.parametrize(("size", "ways", "line", "want_ways"), [
    (48 << 10, 12, 64, 12),             # 64 sets already
    (480 << 20, 16, 64, 30),            # 491,520 sets (a KVM guest's L3) -> 2^18 of 30 ways
    (32 << 20, 12, 64, 16),             # 43,690.7 sets -> 2^15 of 16 ways
    (3 << 20, 12, 64, 12),              # 4,096 sets
    (1 << 20, 1 << 20, 64, 1 << 14),    # more ways than lines: fully associative
])
def test_cache_geometry_valgrind_can_simulate(size, ways, line, want_ways):
    geo = points.simulable_geometry(size, ways, line)
    sets = geo["bytes"] // (geo["ways"] * geo["line"])
    assert geo["bytes"] == size and geo["line"] == line
    assert sets & (sets - 1) == 0  # a power of two, as Valgrind requires
    assert geo["ways"] == want_ways


def test_work_totals_exact():
    code = {0x10: "c4e2f5b810", 0x15: "c5fd1101", 0x19: "f20f5801"}
    w = points.work_totals(code, {0x10: 100, 0x15: 100, 0x19: 3})
    assert w["flops"] == 803 and w["flops_by_precision"] == {"dp": 803}
    assert w["flops_by_kind"] == {"fma": 800, "add": 3}
    assert (w["core_read_bytes"], w["core_write_bytes"]) == (3224, 3200)
    with pytest.raises(points.PointError):
        points.work_totals(code, {0x11: 1})


# ----------------------------------------------------------------------------- kernel points


@pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("gdb") is None,
                    reason="needs valgrind and gdb")
def test_daxpy_point_counts_agree(tmp_path, host):
    """daxpy: 2n flops exactly; Callgrind counts = gdb block counts; DRAM view 24n bytes."""
    binary = suite.build_benchmark("daxpy", "O2", tmp_path / "daxpy.O2")
    n = 1000
    code = points.function_code(binary, "kernel_daxpy")
    cg = points.callgrind_run(binary, "kernel_daxpy", suite.driver_args(n, 2),
                              points.callgrind_caches(host))
    by_cg = points.work_totals(code, {a: c["Ir"] for a, c in cg.items()})
    from cpumap.evaluate.blocks import extract_blocks
    from cpumap.evaluate.counting import count_blocks
    blocks = extract_blocks(binary, "kernel_daxpy")
    occ = count_blocks(binary, "kernel_daxpy", blocks, suite.driver_args(n, 1))
    counts = {a: occ.get(b.address, 0) for b in blocks for a in points._insn_addresses(b)}
    by_gdb = points.work_totals(code, counts)
    assert by_cg == by_gdb
    assert by_cg["flops"] == 2 * n and by_cg["core_bytes"] == 24 * n + 8  # + the ret
    # the DRAM view needs arrays larger than the simulated LL: 64 MiB against an 8 MiB LL (the
    # host's own may be larger: a KVM guest here reports a 480 MiB L3)
    caches = points.callgrind_caches(host) | {"LL": points.simulable_geometry(8 << 20, 16, 64)}
    big = points.callgrind_run(binary, "kernel_daxpy", suite.driver_args(1 << 22, 2), caches)
    mem = points.memory_bytes(big)["mem_bytes"]
    assert mem / (24 * (1 << 22)) == pytest.approx(1.0, rel=0.01)


def test_measure_point_keeps_the_fastest_process(tmp_path, host):
    """A daxpy point end to end: exact work, and the fastest of 2 driver processes kept."""
    binary = suite.build_benchmark("daxpy", "O2", tmp_path / "daxpy.O2")
    df = points.measure_points({"daxpy.O2": binary}, {"daxpy": [1000]}, ["warm"], host,
                               reps=3, processes=2)
    (rec,) = points.from_frame(df).to_dict("records")
    assert rec["status"] == "ok", rec["reason"]
    assert rec["flops"] == 2000 and rec["count_source"] == "callgrind"
    assert rec["processes"] == 2 and len(rec["process_cycles_min"]) == 2
    assert min(rec["cycles"]) == min(rec["process_cycles_min"]) and len(rec["cycles"]) == 3
    assert rec["perf_q"]["max"] == pytest.approx(2000 / min(rec["cycles"]))


def test_points_keep_a_count_failure_untimed(tmp_path, host):
    """The counts come from their own job: a point whose count failed or was skipped keeps
    that status and reason and is not timed (the binary here does not exist: a timing would
    fail with another reason), a point with no count row fails naming the counting job."""
    counts = points.to_frame([
        {"benchmark": "daxpy.O2", "kernel": "daxpy", "flagset": "O2", "n": 1000,
         "state": "warm", "status": "failed", "reason": "callgrind ran past 900 s"},
        {"benchmark": "daxpy.O2", "kernel": "daxpy", "flagset": "O2", "n": 1000,
         "state": "cold", "status": "skipped", "reason": "footprint too big"}])
    df = points.measure_points({"daxpy.O2": tmp_path / "absent"}, {"daxpy": [1000, 2000]},
                               ["warm", "cold"], host, counts=counts)
    got = {(r["n"], r["state"]): (r["status"], r["reason"]) for r in df.to_dict("records")}
    assert got[(1000, "warm")] == ("failed", "callgrind ran past 900 s")
    assert got[(1000, "cold")] == ("skipped", "footprint too big")
    assert got[(2000, "warm")][0] == got[(2000, "cold")][0] == "failed"
    assert "roofline_counts" in got[(2000, "warm")][1]


# ----------------------------------------------------------------------------- plots


def _ceilings() -> dict:
    sw = [{"bytes": b, "bytes_per_cycle": v, "gbs": v * 3.7, "threads": 1}
          for b, v in ((4096, 60.0), (1 << 19, 31.0), (8 << 20, 26.0), (1 << 28, 9.0))]
    levels = [{"label": lab, "bytes_per_cycle": v["bytes_per_cycle"], "gbs": v["gbs"],
               "sizes": [v["bytes"]], "values": [v["bytes_per_cycle"]], "capacity": None,
               "agreement": 1.0, "boundary_bytes": None}
              for lab, v in zip(("L1", "L2", "L3", "DRAM"), sw, strict=True)]
    bw = {"threads": 1, "levels": levels, "check": {"problems": []}, "sweep": sw}
    variant = {"variant": "avx512-dp-fma", "status": "ok", "precision": "dp",
               "operation": "fma", "one_core": {"flops_per_cycle": 16.0},
               "all_cores": {"flops_per_cycle": 32.0, "cores": 2}}
    theo = {"precision": "dp", "flops_per_cycle": 16.0, "form": "VFMADD231PD_ZMM_ZMM_ZMM",
            "flops_per_insn": 16, "insns_per_cycle": 1.0, "uarch": "zen4",
            "table_row": {"source": "[AMD-Z4]"}, "mix": ""}
    return {"clock": {"kind": "tsc-calibrated", "cycles": "ticks x ratio", "tsc_mhz": 2596.0,
                      "core_ghz_estimate": 3.69, "core_ghz_estimate_sweep": 3.69},
            "compute": {"variants": [variant], "theoretical": {"dp": {"fma": theo}},
                        "peaks": {"dp": {"fma": {"variant": "avx512-dp-fma",
                                                 "measured_flops_per_cycle": 16.0,
                                                 "theoretical": theo, "fraction": 1.0}}}},
            "bandwidth": {"one_core": {"read": bw}},
            "bandwidth_order": {"one_core": {"order": ["L1", "L2", "L3", "DRAM"],
                                             "values": [60.0, 31.0, 26.0, 9.0],
                                             "strictly_decreasing": True}},
            "bytes_convention": "core-side", "caches": ZEN4_CACHES}


def _points() -> pd.DataFrame:
    rows = []
    for fs, speed in (("O2", 1.0), ("O3-v3", 2.0)):
        for n in (1024, 65536, 4194304):
            perf = [0.2 * speed * (1 + 0.1 * k) for k in range(5)]
            rows.append({"benchmark": f"daxpy.{fs}", "kernel": "daxpy", "flagset": fs,
                         "n": n, "state": "warm", "status": "ok", "count_source": "callgrind",
                         "flops": 2 * n, "core_bytes": 24 * n, "mem_bytes": 24 * n,
                         "intensity_core": 1 / 12, "intensity_mem": 1 / 12 * (1 + n / 1e7),
                         "bytes_footprint": 16 * n, "perf_q": points.quantiles(perf)})
    return pd.DataFrame(rows)


def test_plots_written(tmp_path):
    paths = plots.all_plots(_ceilings(), _points(), tmp_path)
    names = {p.name for p in paths}
    for stem in ("bandwidth_sweep", "compute_ceilings", "roofline_mem", "roofline_core",
                 "roofline_daxpy_mem", "intensity_vs_size", "performance_vs_size"):
        assert f"{stem}.png" in names and f"{stem}.svg" in names
    for p in paths:
        assert p.stat().st_size > 1000
    assert (tmp_path / "roofline_mem.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_checks_and_section(tmp_path):
    ceil, pts = _ceilings(), _points()
    checks = build.checks(ceil, pts)
    by = {c["name"]: c for c in checks}
    assert by["dp_peak"]["ok"] and by["order_one_core"]["ok"]
    # the largest daxpy point: intensity 1/12 x 1.42 is outside 10 %
    assert not by["daxpy_O2"]["ok"]
    plots.all_plots(ceil, pts, tmp_path)
    html = build_section(ceil, pts, tmp_path, checks)
    assert html.startswith("<h2>Roofline</h2>") and "data:image/png;base64," in html
    assert json.dumps(checks)  # serialisable


def build_section(ceil, pts, d, checks):
    from cpumap.roofline import report
    return report.section_html(ceil, pts, d, checks)


def test_level_order_check():
    bw = {"one_core": {"read": {"levels": [{"label": x, "bytes_per_cycle": v} for x, v in
                                           (("L1", 60), ("L2", 31), ("L3", 32), ("DRAM", 9))]}}}
    rec = build.level_order_check(bw)["one_core"]
    assert rec["order"] == ["L1", "L2", "L3", "DRAM"] and not rec["strictly_decreasing"]
    assert math.isclose(rec["values"][0], 60)


def test_cli_compute_only(tmp_path):
    """cpumap roofline --no-sweep: measured compute ceilings, ceilings.json, plots, checks."""
    from cpumap import cli

    out = tmp_path / "roof"
    rc = cli.main(["--results", str(tmp_path / "results"), "roofline", "--no-sweep", "--quick",
                   "--out", str(out), "--json"])
    assert rc == 0
    ceil = json.loads((out / "ceilings.json").read_text())
    assert ceil["bandwidth"] == {} and ceil["clock"]["calib_ratio_sweep"] is None
    ok = [v for v in ceil["compute"]["variants"] if v["status"] == "ok"]
    assert {v["operation"] for v in ok} == {"add", "mul", "fma", "add+mul", "fma+add"}
    assert all(v["one_core"]["flops_per_cycle"] > 0 for v in ok)
    assert (out / "plots" / "compute_ceilings.png").exists()
    assert (out / "section.html").read_text().startswith("<h2>Roofline</h2>")


def test_best_of_k_when_every_short_call_was_slowed():
    """All short calls of a run disturbed: f2 - f1 alone would undercut the true cycles; the
    long calls' own speed is taken instead (cpumap.measure.robust.per_instance)."""
    from cpumap.roofline import ceilings

    specs = {"ADDSD_XMM_XMM": _spec("ADDSD_XMM_XMMM64")}
    plan = [{"variant": "scalar-dp-add", "level": "scalar", "precision": "dp",
             "operation": "add", "kernel": "ADDSD_XMM_XMM", "status": "planned", "reason": ""}]

    def rows(c1, c2, cpu, conc):
        params = json.dumps({"roofline": {"cpu": cpu, "concurrent": conc}})
        # f1 runs 40,000 instances, f2 80,000 (calls of ~20,000 and ~40,000 cycles, as the
        # harness aims for): the difference is 40,000 instances
        return [{"machine_id": "m", "kernel_id": "k", "params_id": params, "params": params,
                 "kernel": "ADDSD_XMM_XMM", "n_insns": 1, "clock": "tsc-calibrated",
                 "status": "ok", "rep": i, "ticks1": 20 * a, "ticks2": 20 * b, "cycles1": 0,
                 "cycles2": 0, "calib_ratio": 1.0, "instances": 40_000,
                 "cycles_per_instance": (b - a) / 2000}
                for i, (a, b) in enumerate(zip(c1, c2, strict=True))]

    # one core: clean, 0.5 cycles; other run: every short call slowed by 30 %, so the
    # fastest long call minus the fastest short call would be 0.35
    df = pd.DataFrame(rows([1000, 1002, 1001], [2001, 2004, 2002], 0, 1)
                      + rows([1300, 1310, 1320], [2000, 2010, 2400], 1, 2))
    rec = ceilings.summarize(df, plan, specs)[0]
    assert rec["one_core"]["flops_per_cycle"] == pytest.approx(2.0, rel=2e-3)
    other = rec["all_cores"]["per_core"][0]
    assert other["cycles_per_instance"] == pytest.approx(0.5, rel=2e-3)
    assert other["flops_per_cycle"] == pytest.approx(2.0, rel=2e-3)


def test_median_calls_without_a_positive_time(monkeypatch):
    """A busy host can leave the median calls no positive difference (the default run on
    Zen 4 stopped on it with a ZeroDivisionError): that run's median rate is None, its
    undisturbed estimate stands; a run whose estimate is not positive counts as failed."""
    from cpumap.roofline import ceilings

    specs = {"ADDSD_XMM_XMM": _spec("ADDSD_XMM_XMMM64")}
    plan = [{"variant": "scalar-dp-add", "level": "scalar", "precision": "dp",
             "operation": "add", "kernel": "ADDSD_XMM_XMM", "status": "planned", "reason": ""}]
    params = json.dumps({"roofline": {"cpu": 0, "concurrent": 1}})
    df = pd.DataFrame([{"kernel": "ADDSD_XMM_XMM", "params": params, "status": "ok"}])
    agg = {"cycles_per_instance_est": 0.5, "cycles_per_instance_median": 0.0,
           "calib_ratio": 1.0, "rel_uncertainty": 0.01, "reps": 3}
    monkeypatch.setattr(ceilings.estimate, "batch_ratios", lambda rows: {})
    monkeypatch.setattr(ceilings.estimate, "aggregate",
                        lambda grp, ratios=None: pd.DataFrame([agg]))
    rec = ceilings.summarize(df, plan, specs)[0]
    assert rec["status"] == "ok" and rec["one_core"]["flops_per_cycle"] == pytest.approx(2.0)
    assert rec["one_core"]["flops_per_cycle_median"] is None
    agg["cycles_per_instance_est"] = 0.0
    rec = ceilings.summarize(df, plan, specs)[0]
    assert rec["status"] == "failed" and "positive" in rec["reason"]


def test_l1_read_limit_and_check():
    """The L1 read ceiling the CPU implies for the sweep's 256-bit loads, and the check."""
    assert peak.l1_read_limit("zen4")["bytes_per_cycle"] == 64
    assert peak.l1_read_limit("zen3")["bytes_per_cycle"] == 64
    assert peak.l1_read_limit("zen5", 512)["bytes_per_cycle"] == 128
    assert peak.l1_read_limit("unknown-core") is None
    ceil = {"compute": {}, "l1_read_limit": peak.l1_read_limit("zen4"),
            "bandwidth": {"one_core": {"read": {"levels": [
                {"label": "L1", "bytes_per_cycle": 60.0}]}}}}
    (check,) = build.checks(ceil, None)
    assert check["name"] == "l1_read" and not check["ok"]
    assert check["value"] == pytest.approx(60 / 64)
    ceil["bandwidth"]["one_core"]["read"]["levels"][0]["bytes_per_cycle"] = 63.9
    assert build.checks(ceil, None)[0]["ok"]
