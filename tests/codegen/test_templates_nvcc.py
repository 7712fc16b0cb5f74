"""Every template of the row-wise and fallback families, rendered over a grid of dtypes, tunables
and diagrams, compiles with nvcc for sm_80 and sm_90a without register spills, and keeps to the
registers and shared memory the performance model assumed for its launch.

Tolerance (stated): registers: ptxas may use at most ``model_regs_per_thread`` (the kernel asks
for that budget with ``__maxnreg__``, so the model's occupancy is the kernel's), and the budget
may exceed what ptxas uses by at most max(32, 60 %) (the model is not wildly pessimistic);
shared memory: static plus dynamic within ``SMEM_TOLERANCE`` (256 B) of ``model_smem_bytes``.

The grid is kept small enough for two cores in well under three minutes: kernels are batched into
one source per (family, arch) and the builds run in a thread pool.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from napkin.codegen.families import rowwise
from napkin.codegen.generate import generate_source
from napkin.codegen.lower import SMEM_TOLERANCE, lower, prepare
from napkin.diagrams import Axis, Diagram, array, layernorm, library, reduce
from napkin_test_support import masked_softmax

pytestmark = pytest.mark.nvcc

ARCHS = ("sm_80", "sm_90a")
DTYPES = ("bf16", "fp16", "fp32")


def _residual_layernorm() -> Diagram:
    r, x = Axis("r"), Axis("x")
    X, R, g, b, s = array("X", r, x), array("R", r, x), array("g", x), array("b", x), array("s", r)
    U = (X + R).named("U")
    return Diagram("resid_ln", (((layernorm(U, over=x, name="N") * g + b) * s).named("Z"), U))


ROWWISE_CASES = [
    ("softmax", lambda: library.get("softmax"), dict(r=64, x=4095)),
    ("layernorm", lambda: library.get("layernorm"), dict(r=16, x=32768)),
    ("rmsnorm", lambda: library.get("rmsnorm"), dict(r=100, x=1000)),
    ("rmsnorm_long", lambda: library.get("rmsnorm"), dict(r=8, x=32768)),
    ("masked", masked_softmax, dict(h=3, q=37, x=37)),
    ("resid", _residual_layernorm, dict(r=5, x=300)),
    # chains of maps and reductions: several passes from registers, a row of two axes with gathered
    # gamma/beta (per element: s = 999 is not a multiple of VEC), a streamed row (65536 values)
    ("log_softmax", lambda: library.get("log_softmax"), dict(r=64, x=4095)),
    ("group_norm", lambda: library.get("group_norm"), dict(n=2, g=4, c=5, s=999)),
    ("group_norm_long", lambda: library.get("group_norm"), dict(n=2, g=2, c=16, s=4096)),
    ("logsumexp", lambda: library.get("logsumexp_rows"), dict(r=100, x=4096)),
]

FALLBACK_CASES = [
    ("transformer_block", dict(q=5, e=12, h=2, d=4, f=7)),
    ("gqa", dict(h=2, j=3, q=5, x=7, d=4)),
    ("attention_alibi", dict(h=2, q=5, x=7, d=4)),
    ("attention_softcap", dict(h=2, q=5, x=7, d=4)),
    ("mlp", dict(a=5, b=7, c=3)),
    ("batched_matmul", dict(n=2, a=5, b=7, c=3)),
]


def _rename(launch, new: str):
    src = re.sub(rf"\b{re.escape(launch.name)}\b", new, launch.source)
    return dataclasses.replace(launch, name=new, source=src)


def _rowwise_launches() -> list:
    out = []
    for tag, build, sizes in ROWWISE_CASES:
        for dt in DTYPES:
            d = prepare(build(), sizes=sizes, dtype=dt)
            cands = rowwise.FAMILY.candidates(d, "h100", dt) if rowwise.FAMILY.matches(d) else []
            if not cands:  # fp32 layernorm over 32k: more than 64 registers a thread; fallback's
                assert (tag, dt) == ("layernorm", "fp32")
                continue
            picks = {0, len(cands) // 2, len(cands) - 1} if tag != "rmsnorm_long" else {0}
            for i in sorted(picks):
                p = lower(d, cands[i], family="rowwise", arch="sm_90a")
                out.append(_rename(p.launches[0], f"rw_{tag}_{dt}_{i}"))
    return out


def _fallback_launches() -> list:
    out = []
    X = array("X", Axis("r"), Axis("x"))
    red = Diagram("red", (reduce(X, "x", "min", name="Rmin"), reduce(X, "x", "mean", name="Rmean")))
    for dt in DTYPES:
        cases = [(library.get(n), s) for n, s in FALLBACK_CASES] + [(red, dict(r=3, x=70))]
        for d, sizes in cases:
            p = lower(d, sizes=sizes, dtype=dt, family="fallback", arch="sm_90a")
            for k in p.launches:
                out.append(_rename(k, f"{k.name}_{dt}"))
    return out


def _build(job):
    from napkin.kernels import nvcc_compile

    arch, launches = job
    return arch, launches, nvcc_compile("\n".join(k.source for k in launches), arch)


@pytest.fixture(scope="module")
def builds():
    launches = {"rowwise": _rowwise_launches(), "fallback": _fallback_launches()}
    # a row shared by a cluster of blocks is a Hopper plan (lowering it for sm_80 is refused)
    jobs = [(arch, [k for k in ls if arch != "sm_80" or "CLUSTER" not in dict(k.tunables)])
            for ls in launches.values() for arch in ARCHS]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(_build, jobs))


def _check(arch, launches, usage) -> list[str]:
    problems = []
    for k in launches:
        r = usage[k.name]
        where = f"{k.name} ({k.template}, {arch}, {dict(k.tunables)})"
        if r.spills:
            problems.append(f"{where}: spills {r.spill_stores} B stores / {r.spill_loads} B loads")
        model = k.model_regs_per_thread
        if r.registers > model:
            problems.append(f"{where}: {r.registers} registers, the model assumed {model}")
        if model - r.registers > max(32, 0.6 * model):
            problems.append(f"{where}: {r.registers} registers, far under the model's {model}")
        smem = r.shared_bytes + k.shared_bytes
        if abs(smem - (k.model_smem_bytes or 0)) > SMEM_TOLERANCE:
            problems.append(f"{where}: {smem} B shared memory, the model assumed {k.model_smem_bytes}")
    return problems


def test_rowwise_and_fallback_templates_compile_within_the_model(builds):
    problems = []
    templates = set()
    for arch, launches, usage in builds:
        assert len(usage.kernels) >= len(launches), arch
        problems += _check(arch, launches, usage)
        templates |= {k.template for k in launches}
    assert {"rowwise.cu.jinja", "fallback_map.cu.jinja", "fallback_contract.cu.jinja",
            "fallback_reduce.cu.jinja", "fallback_row.cu.jinja"} <= templates
    assert not problems, "\n".join(problems)


def test_the_grid_covers_warp_and_block_modes(builds):
    modes = set()
    for _, launches, _ in builds:
        for k in launches:
            t = dict(k.tunables)
            if "THREADS_PER_ROW" in t:
                modes.add("warp" if t["THREADS_PER_ROW"] <= 32 else "block")
                if "STREAM" in t:
                    modes.add("streamed chain" if t["STREAM"] else "chain in registers")
    assert modes == {"warp", "block", "streamed chain", "chain in registers"}


@pytest.mark.parametrize("name, sizes", [("layernorm", dict(r=100, x=768)),
                                         ("transformer_block", dict(q=5, e=12, h=2, d=4, f=7))])
def test_generated_file_compiles_as_it_stands(tmp_path: Path, name, sizes):
    nvcc = shutil.which("nvcc")
    src = generate_source(name, sizes=sizes, gpu="h100", dtype="bf16")
    f = tmp_path / f"{name}.cu"
    f.write_text(src)
    cmd = [nvcc, "-cubin", "-gencode=arch=compute_90a,code=sm_90a", str(f), "-o", str(tmp_path / "k.cubin")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (tmp_path / "k.cubin").stat().st_size > 0
