"""GPU profiles are checked when built (issue #16): every field by its kind, the levels, the arch.

A bad value — NaN, inf, zero, a negative, a bool, a string, 2.5 where an integer is needed, an
unknown or missing key, nested junk, a file that is no JSON — is one HardwareError naming the field
(and the file), through the JSON loader, the constructor, ``with_overrides`` and the CLI's
``--gpu FILE`` (one ``error:`` line, exit 2). The arch is checked in one place
(:func:`napkin.perfmodel.hardware.check_arch`), which code generation calls on its ``arch=``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from napkin.errors import HardwareError
from napkin.perfmodel.hardware import (CHECKS, EFFICIENCY_FRACTIONS, GPU, LEVEL_ORDER, SUPPORTED_ARCHS, Level,
                                       check_arch, get_gpu, list_gpus)

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "napkin" / "perfmodel" / "profiles"
NAN, INF = float("nan"), float("inf")

#: The bad values of each kind of field (kinds: hardware.CHECKS).
BAD = {
    "count": [NAN, INF, 0, -1, True, "x", 2.5, 132.0, None],
    "count0": [NAN, -1, True, "x", 2.5, None],
    "positive": [NAN, INF, -INF, 0, 0.0, -1, True, False, "x", "1e12", None, [1.0], 5e-324, 1e300],
    "non_negative": [NAN, INF, -1, -1e-9, True, "x", None, 5e-324, 1e300],
    "fraction": [NAN, INF, 0, -1, 1.5, True, "x", None],
    "flag": [0, 1, "true", None, NAN],
    "name": ["", "  ", 3, None, True],
    "text": [3, None, True, ["a"]],
    "arch": ["sm_75", "sm_100", "sm90a", "", None, 90, True],
}
#: Values of those kinds that are valid although they look odd (zero where zero is meaningful).
GOOD = {
    "count0": [0, 7],
    "non_negative": [0, 0.0, 1e-9, 5],
    "positive": [1, 2.5, 1e15, 1e-9],
    "fraction": [1, 1.0, 1e-6],
}


def h100_dict() -> dict:
    return json.loads(get_gpu("h100").to_json())


def scalar_fields() -> list[tuple[str, str]]:
    return [(f.name, f.metadata["check"]) for f in dataclasses.fields(GPU) if f.metadata["check"] in CHECKS]


def constructor_kwargs(gpu: GPU) -> dict:
    return {f.name: getattr(gpu, f.name) for f in dataclasses.fields(GPU)}


def load(d) -> GPU:
    return GPU.from_json(json.dumps(d), where="bad.json")


def test_every_field_says_what_it_must_be():
    for f in (*dataclasses.fields(GPU), *dataclasses.fields(Level)):
        assert "check" in f.metadata, f.name
    assert {k for _, k in scalar_fields()} <= set(BAD)
    assert EFFICIENCY_FRACTIONS == __import__("napkin.perfmodel.roofline", fromlist=["_FRACTIONS"])._FRACTIONS


@pytest.mark.parametrize("key", list_gpus())
def test_shipped_profiles_validate(key):
    g = get_gpu(key)
    assert check_arch(g.arch) == g.arch
    assert GPU.from_json(g.to_json()) == g
    assert GPU(**constructor_kwargs(g)) == g


def test_shipped_profile_files_are_all_registered_and_valid():
    for path in sorted(PROFILES.glob("*.json")):
        g = GPU.from_json(path.read_text(), where=str(path))
        assert g == get_gpu(str(path)) == get_gpu(g.key)


@pytest.mark.parametrize("name,kind", scalar_fields())
def test_each_scalar_field_refuses_bad_values_from_json_and_constructor(name, kind):
    base = get_gpu("h100")
    for bad in BAD[kind]:
        d = h100_dict()
        d[name] = bad
        with pytest.raises(HardwareError) as e:
            load(d)
        msg = str(e.value)
        assert msg.startswith("bad.json: "), msg
        assert (repr(name) in msg) or (kind == "arch" and "is not supported" in msg), msg
        assert "\n" not in msg
        with pytest.raises(HardwareError, match=r"GPU profile 'h100'" if name != "key" else "GPU profile"):
            GPU(**{**constructor_kwargs(base), name: bad})
        with pytest.raises(HardwareError):
            dataclasses.replace(base, **{name: bad})
    for good in GOOD.get(kind, []):
        d = h100_dict()
        d[name] = good
        assert getattr(load(d), name) == good


@pytest.mark.parametrize("field,kind", [("capacity_bytes", "positive"), ("per_block_bytes", "positive"),
                                        ("instances", "count"), ("bandwidth", "positive"),
                                        ("assumption", "text")])
def test_each_level_field_refuses_bad_values(field, kind):
    base = get_gpu("h100")
    for i, lname in enumerate(LEVEL_ORDER):
        for bad in BAD[kind]:
            if bad is None and field in ("capacity_bytes", "per_block_bytes") and (field == "per_block_bytes" or lname == "TC"):
                continue  # null: unbounded, or no per-block limit
            d = h100_dict()
            d["levels"][i][field] = bad
            with pytest.raises(HardwareError, match=rf"^bad\.json: level {i} \({lname}\): .*{field}"):
                load(d)
            with pytest.raises(HardwareError, match=rf"memory level '{lname}'"):
                dataclasses.replace(base.levels[i], **{field: bad})


def test_level_structure():
    d = h100_dict()
    cases = {
        "field .levels. must be a list": {**d, "levels": {"HBM": 1}},
        "HBM, L2, SMEM, RF, TC in this order": {**d, "levels": d["levels"][:4]},
        "in this order, got L2, HBM": {**d, "levels": [d["levels"][1], d["levels"][0], *d["levels"][2:]]},
        "level 2 \\(smem\\): field .name. must be one of HBM": {**d, "levels": [*d["levels"][:2], {**d["levels"][2], "name": "smem"},
                                                          *d["levels"][3:]]},
        "level 0 must be an object": {**d, "levels": [[1, 2], *d["levels"][1:]]},
        "level 0 \\(HBM\\) has unknown field\\(s\\) 'bandwith'": {
            **d, "levels": [{**d["levels"][0], "bandwith": 1e12}, *d["levels"][1:]]},
        "level 1 \\(L2\\) lacks field\\(s\\) bandwidth": {
            **d, "levels": [d["levels"][0], {k: v for k, v in d["levels"][1].items() if k != "bandwidth"},
                            *d["levels"][2:]]},
        "may be null \\(unbounded\\) only on TC, not on SMEM": {
            **d, "levels": [*d["levels"][:2], {**d["levels"][2], "capacity_bytes": None}, *d["levels"][3:]]},
        "'per_block_bytes' .* exceeds 'capacity_bytes'": {
            **d, "levels": [*d["levels"][:2], {**d["levels"][2], "per_block_bytes": 1e9}, *d["levels"][3:]]},
    }
    for pattern, bad in cases.items():
        with pytest.raises(HardwareError, match=rf"^bad\.json: .*{pattern}"):
            load(bad)
    with pytest.raises(HardwareError, match="must be a tuple of Level"):
        GPU(**{**constructor_kwargs(get_gpu("h100")), "levels": (1, 2)})
    with pytest.raises(HardwareError, match="in this order"):
        GPU(**{**constructor_kwargs(get_gpu("h100")), "levels": get_gpu("h100").levels[::-1]})


def test_dict_fields():
    d = h100_dict()
    for table in ("tensor_flops", "cuda_core_flops"):
        for bad in (NAN, INF, 0, -1, True, "x", None):
            with pytest.raises(HardwareError, match=rf"^bad\.json: field '{table}': the value for 'bf16' must be a "
                                                    rf"finite positive number"):
                load({**d, table: {**d[table], "bf16": bad}})
        with pytest.raises(HardwareError, match=r"key 'fp17', which is not a dtype's short name; known dtypes"):
            load({**d, table: {**d[table], "fp17": 1e12}})
        with pytest.raises(HardwareError, match=r"key 'float16', which is not a dtype's short name \(write 'fp16'\)"):
            load({**d, table: {**d[table], "float16": 1e12}})
        with pytest.raises(HardwareError, match=rf"field '{table}' must be an object"):
            load({**d, table: [1e12]})
    for bad in ([16, 8], [16, 8, 2.5], [16, 8, 0], [16, 8, True], "16x8x16", [16, 8, 16, 1], None):
        with pytest.raises(HardwareError, match=r"field 'mma_shapes': the shape for 'fp16' must be \[m, n, k\]"):
            load({**d, "mma_shapes": {**d["mma_shapes"], "fp16": bad}})
    for bad in (NAN, INF, 0, -1, True, "x"):
        with pytest.raises(HardwareError, match=r"field 'measured': the value for 'copy' must be"):
            load({**d, "measured": {"copy": bad}})
    for bad in (0, -0.5, 1.6, NAN, INF, True, "x"):
        with pytest.raises(HardwareError, match=r"efficiency': attention\.tensor must be a number in \(0, 1\.5\]"):
            load({**d, "efficiency": {"attention": {"tensor": bad}}})
    with pytest.raises(HardwareError, match=r"unknown fraction 'tensr'"):
        load({**d, "efficiency": {"attention": {"tensr": 0.9}}})
    with pytest.raises(HardwareError, match=r"fractions of 'attention' must be an object"):
        load({**d, "efficiency": {"attention": 0.9}})
    with pytest.raises(HardwareError, match=r"field 'sources' has key 'memory_latncy_s', which names no profile field"):
        load({**d, "sources": {"memory_latncy_s": "typo"}})
    with pytest.raises(HardwareError, match=r"field 'sources': the value for 'notes' must be a string"):
        load({**d, "sources": {"notes": 3}})
    ok = load({**d, "sources": {"measured.copy": "here", "clock_hz": "there"}, "measured": {"copy": 1.0},
               "efficiency": {"attention": {"tensor": 1.5}}})
    assert ok.source_of("clock_hz") == "there"


def test_arch_and_features_agree():
    d = h100_dict()
    with pytest.raises(HardwareError, match=r"^bad\.json: arch 'sm_75' is not supported; napkin generates code for "
                                            r"sm_80, sm_86, sm_87, sm_89, sm_90, sm_90a$"):
        load({**d, "arch": "sm_75", "has_wgmma": False, "has_tma": False})
    with pytest.raises(HardwareError, match=r"'has_wgmma' is true but wgmma needs arch sm_90a, not sm_90"):
        load({**d, "arch": "sm_90"})
    assert load({**d, "arch": "sm_90", "has_wgmma": False}).has_tma
    with pytest.raises(HardwareError, match=r"'has_tma' is true but TMA needs arch sm_90 or sm_90a, not sm_86"):
        load({**d, "arch": "sm_86", "has_wgmma": False})
    with pytest.raises(HardwareError, match="arch 'sm_75' is not supported"):
        dataclasses.replace(get_gpu("a100"), arch="sm_75")
    for arch in SUPPORTED_ARCHS:
        assert check_arch(arch) == arch


def test_keys_unknown_missing_and_comments():
    d = h100_dict()
    with pytest.raises(HardwareError, match=r"^bad\.json: unknown profile field\(s\) 'clock_mhz'; known fields: key, "):
        load({**d, "clock_mhz": 1830})
    with pytest.raises(HardwareError, match=r"^bad\.json: profile lacks field\(s\) sms, clock_hz$"):
        load({k: v for k, v in d.items() if k not in ("sms", "clock_hz")})
    assert load({**d, "_comment": "ignored"}) == get_gpu("h100")
    assert load({k: v for k, v in d.items() if k != "launch_overhead_s"}).launch_overhead_s == 3e-6
    with pytest.raises(HardwareError, match="unknown profile field"):
        GPU.from_dict({**d, 3: "x"})


@pytest.mark.parametrize("text,pattern", [
    ("{not json", "not valid JSON"),
    ("", "not valid JSON"),
    ("[1, 2]", "must be a JSON object, got list"),
    ("null", "must be a JSON object, got NoneType"),
    ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
    ('{"a": ' * 50_000 + "1" + "}" * 50_000, "not valid JSON"),
    ("1" * 5000, "not valid JSON"),
], ids=["broken", "empty", "list", "null", "deep-list", "deep-object", "5000-digits"])
def test_text_that_is_no_profile(text, pattern):
    with pytest.raises(HardwareError, match=rf"^bad\.json: .*{pattern}"):
        GPU.from_json(text, where="bad.json")


def test_nested_junk_inside_fields():
    d = h100_dict()
    deep: object = 1.0
    for _ in range(500):
        deep = [deep]
    for name in ("sms", "clock_hz", "tensor_flops", "levels", "notes", "efficiency", "sources", "measured"):
        with pytest.raises(HardwareError) as e:
            load({**d, name: deep})
        assert len(str(e.value)) < 300
    for name, pattern in (("clock_hz", "finite positive"), ("sms", r"positive integer \(below 2\^53\)")):
        for huge in ((10 ** 400,) if name == "clock_hz" else (10 ** 400, 2 ** 53)):
            with pytest.raises(HardwareError, match=pattern):
                load({**h100_dict(), name: huge})


def test_files(tmp_path):
    with pytest.raises(HardwareError, match="does not exist"):
        get_gpu(str(tmp_path / "nope.json"))
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(HardwareError, match="is not a file"):
        get_gpu(str(tmp_path / "dir.json"))
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b"\xff\xfe{")
    with pytest.raises(HardwareError, match="cannot read GPU profile"):
        get_gpu(str(bad))
    with pytest.raises(HardwareError, match="unknown GPU"):
        get_gpu("x" * 5000)
    with pytest.raises(HardwareError):
        get_gpu("x" * 5000 + ".json")
    p = tmp_path / "nan.json"
    p.write_text(json.dumps({**h100_dict(), "clock_hz": NAN}))
    with pytest.raises(HardwareError, match=rf"^{p}: field 'clock_hz' must be a finite positive number \(between 1e-12 and 1e18\), got nan$"):
        get_gpu(str(p))


def test_with_overrides_refuses_what_the_constructor_refuses():
    h = get_gpu("h100")
    for kw in ({"hbm_bandwidth": NAN}, {"hbm_bandwidth": 0}, {"hbm_bandwidth": "x"}, {"hbm_bandwidth": True},
               {"tensor_bf16": 0}, {"tensor_bf16": -1}, {"tensor_flops": {"bf16": NAN}}, {"tensor_flops": [1]},
               {"sfu_rate": 0}, {"sfu_rate": "fast"}, {"sms": 2.5}, {"sms": True}, {"clock_hz": INF},
               {"mma_shapes": {"fp16": [16, 8, 2.5]}}, {"measured": {"x": NAN}}, {"efficiency": {"rowwise": 0.9}},
               {"step_overhead_clk": -1}, {"smem_capacity_bytes": None}, {"tc_capacity_bytes": -1},
               {"levels": "HBM"}, {"arch": "sm_75"}, {"sources": {"bogus": "x"}}):
        with pytest.raises(HardwareError):
            h.with_overrides(**kw)
    assert h.with_overrides(tc_capacity_bytes=None).level("TC").capacity_bytes is None
    assert h.with_overrides(step_overhead_clk=0, launch_overhead_s=0).launch_overhead_s == 0


# ----------------------------------------------------------------------------- property


def _paths(d: dict) -> list[tuple]:
    """Every place in a profile's JSON a single value can be changed (or removed)."""
    out = [(k,) for k in d]
    for i, lv in enumerate(d["levels"]):
        out += [("levels", i, k) for k in lv]
    for table in ("tensor_flops", "cuda_core_flops", "mma_shapes"):
        out += [(table, k) for k in d[table]]
    out += [("mma_shapes", "fp16", 2), ("efficiency",), ("measured",), ("sources", "memory_latency_s")]
    return out


VALID = h100_dict()
PATHS = _paths(VALID)
JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                      st.sampled_from(list(SUPPORTED_ARCHS) + list(LEVEL_ORDER) + ["sm_75", "fp16", "tensor"]))
JSON_VALUE = st.recursive(JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                             st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                          max_leaves=12)
_DELETE = object()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), value=st.one_of(JSON_VALUE, st.just(_DELETE)))
def test_mutating_one_field_gives_a_profile_or_a_hardware_error(path, value):
    d = copy.deepcopy(VALID)
    target = d
    for step in path[:-1]:
        target = target[step]
    if value is _DELETE:
        if isinstance(target, list):
            del target[path[-1]]
        else:
            target.pop(path[-1], None)
    else:
        target[path[-1]] = value
    text = json.dumps(d)  # NaN and Infinity are written as JSON's extensions, which json.loads reads
    try:
        g = GPU.from_json(text, where="mutated.json")
    except HardwareError as e:
        assert str(e).startswith("mutated.json: ") and "\n" not in str(e)
        return
    # a profile that loads is one the model can use: finite positive rates, a supported arch
    assert check_arch(g.arch) == g.arch
    assert g.level_names() == LEVEL_ORDER
    assert g.sfu_rate() > 0
    assert all(g.compute_bound_threshold(dt) > 0 for dt in g.tensor_flops)
    assert all(math.isfinite(lv.bandwidth) and lv.bandwidth > 0 for lv in g.levels)
    assert GPU.from_json(g.to_json()) == g


# ----------------------------------------------------------------------------- the CLI


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "napkin", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


CLI_CASES = {
    "nan_clock": lambda d: {**d, "clock_hz": NAN},
    "fractional_sms": lambda d: {**d, "sms": 2.5},
    "bool_sms": lambda d: {**d, "sms": True},
    "zero_sfu": lambda d: {**d, "sfu_ops_per_clk_per_sm": 0},
    "zero_reg_unit": lambda d: {**d, "reg_alloc_unit": 0},
    "sm_75": lambda d: {**d, "arch": "sm_75", "has_wgmma": False, "has_tma": False},
    "typo_key": lambda d: {**d, "clokc_hz": 1.0},
    "missing_levels": lambda d: {k: v for k, v in d.items() if k != "levels"},
    "negative_bandwidth": lambda d: {**d, "levels": [{**d["levels"][0], "bandwidth": -1}, *d["levels"][1:]]},
}


@pytest.mark.parametrize("case", [*CLI_CASES, "not_json", "deep"])
def test_cli_gpu_file_is_one_error_line(case, tmp_path):
    p = tmp_path / f"{case}.json"
    if case == "not_json":
        p.write_text("{oops")
    elif case == "deep":
        p.write_text("[" * 100_000 + "]" * 100_000)
    else:
        p.write_text(json.dumps(CLI_CASES[case](h100_dict())))
    r = _run_cli("cost", "attention", "--gpu", str(p))
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert str(p) in " ".join(r.stderr.split()) or p.name in r.stderr
    assert "Traceback" not in r.stderr


# ----------------------------------------------------------------------------- code generation's arch=


def test_codegen_checks_its_arch_argument():
    from napkin.codegen.api import compile as compile_diagram
    from napkin.codegen.generate import generate_program
    from napkin.codegen.planner import derive, plan_schedule
    from napkin.diagrams import library

    sizes = {"a": 64, "b": 64, "c": 64}
    msg = r"^arch 'sm_75' is not supported; napkin generates code for sm_80, sm_86, sm_87, sm_89, sm_90, sm_90a$"
    with pytest.raises(HardwareError, match=msg):
        derive("matmul", "a100", "bf16", sizes, arch="sm_75")
    plan = derive("matmul", "a100", "bf16", sizes, arch="sm_86", explain=False).plan
    assert plan.arch == "sm_86"
    from napkin.codegen.lower import build
    from napkin.perfmodel.schedule import Schedule
    d = plan.diagram
    sched = Schedule(d, tuple(k.kernel for k in plan.kernels), "a100", "bf16")
    with pytest.raises(HardwareError, match=msg):
        plan_schedule(d, sched, "a100", arch="sm_75")
    bad_plan = dataclasses.replace(plan, arch="sm_75")
    with pytest.raises(HardwareError, match=msg):
        generate_program(None, plan=bad_plan, gpu="a100")
    with pytest.raises(HardwareError, match=msg):
        compile_diagram(None, gpu="a100", plan=bad_plan)
    assert build(plan).launches  # the good plan still builds
    assert "code=sm_86" in generate_program(None, plan=plan, gpu="a100")[0]


def test_derive_on_a_profile_of_sm_75_is_refused_before_planning():
    d = h100_dict()
    bad = {**d, "arch": "sm_75", "has_wgmma": False, "has_tma": False}
    with pytest.raises(HardwareError, match="arch 'sm_75' is not supported"):
        GPU.from_dict(bad)
    with pytest.raises(HardwareError, match="arch 'sm_75' is not supported"):
        GPU(**{**constructor_kwargs(get_gpu("a100")), "arch": "sm_75"})


# ----------------------------------------------------------------------------- calibration


def test_what_calibration_writes_validates(tmp_path):
    from napkin.bench.calibration import base_profile, with_factors
    from napkin.perfmodel.calibrate import calibrated_profile

    g = calibrated_profile("h100", {"copy_bandwidth": 3.1e12, "gemm_bf16": 700e12, "gemm_fp16": 690e12,
                                    "sfu_rate": 3e12, "sms": 132, "l2_bytes": 50 * 2 ** 20,
                                    "hbm_bytes": 80 * 2 ** 30}, date="2025-01-01", device_name="NVIDIA H100")
    assert GPU.from_json(g.to_json()) == g
    fitted = with_factors(base_profile("h200", {"copy_bandwidth": 4.2e12, "gemm_bf16_flops": 7.9e14}),
                          {"attention": {"tensor": 0.8}, "rowwise": {"hbm": 1.2}})
    assert GPU.from_json(fitted.to_json()) == fitted
    for bad in ({"copy_bandwidth": NAN}, {"sfu_rate": INF}, {"sms": 0}):
        with pytest.raises(HardwareError):
            calibrated_profile("h100", bad)
