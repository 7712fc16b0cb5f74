"""The wgmma template's tensor maps of operands whose tiles' rows are not the axis next to the
innermost (attention's output projection O[h, s, d]·Wo[e, h, d] summed over h and d; a batch axis
behind the rows; an operand stored K by rows with its batch axis in the middle): the map takes
the array's axes as dimensions of their own, and the copy gives each batch or outer-sum index as
a coordinate. CPU: which view each operand gets, the launch's arguments, the map's sizes and
strides, and the source built by nvcc for sm_90a. The GPU runs are in test_wgmma_views_gpu.py."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from napkin.codegen.families.contraction import FAMILY, analyze, operand_view
from napkin.codegen.planner import derive
from napkin.diagrams import Diagram, array, axes, contract
from napkin.kernels.tma import TensorMapSlot, view_dims

S, H, D, E, B, I, J, K = axes("s h d e b i j k")


def merge_heads() -> Diagram:
    """Y[s, e] = Σ_{h,d} O[h, s, d]·W[e, h, d]: W's tiles' rows (e) are two axes from d."""
    return Diagram("merge_heads", contract(array("O", H, S, D), array("W", E, H, D), over=(H, D), out=(S, E), name="Y"))


def batch_behind_rows() -> Diagram:
    """C[b, i, j] = Σ_k A[b, i, k]·B[j, b, k]: B's batch axis lies between its rows (j) and k."""
    return Diagram("batch_behind_rows", contract(array("A", B, I, K), array("B", J, B, K), over=K, out=(B, I, J),
                                                 name="C"))


def mn_major_middle_batch() -> Diagram:
    """C[b, i, j] = Σ_k A[k, b, i]·B[b, k, j]: A stored K by rows with its batch axis between."""
    return Diagram("mn_major_middle_batch", contract(array("A", K, B, I), array("B", B, K, J), over=K, out=(B, I, J),
                                                     name="C"))


CASES = [(merge_heads, dict(s=300, h=3, d=40, e=200)), (batch_behind_rows, dict(b=3, i=200, j=136, k=96)),
         (mn_major_middle_batch, dict(b=2, i=192, j=128, k=100))]


def random_layout(seed: int) -> tuple[Diagram, dict]:
    """C[(n,) a, c] = Σ_{b(, h)} A·B with each operand's axes in a random order: an optional outer
    sum axis h and an optional batch n (which B may not carry), sizes that are mostly not tile
    multiples."""
    import random

    rng = random.Random(seed)
    has_h, has_n = rng.random() < 0.6, rng.random() < 0.6
    sizes = {"a": rng.choice([64, 77, 128, 200, 256]), "c": rng.choice([64, 72, 136, 256]),
             "b": rng.choice([32, 40, 64, 72, 96, 128]), "h": rng.choice([2, 3, 4]), "n": rng.choice([1, 2, 3])}
    a_axes = ["a", "b"] + ["h"] * has_h + ["n"] * has_n
    b_axes = ["c", "b"] + ["h"] * has_h + ["n"] * (has_n and rng.random() < 0.8)
    rng.shuffle(a_axes)
    rng.shuffle(b_axes)
    ax = {k: axes(k)[0] for k in "abchn"}
    d = Diagram(f"layout_{seed}", contract(array("A", *[ax[k] for k in a_axes]), array("B", *[ax[k] for k in b_axes]),
                                            over=("b", *["h"] * has_h), out=(*["n"] * has_n, "a", "c"), name="C"))
    return d, {k: v for k, v in sizes.items() if k in set(a_axes) | set(b_axes)}


#: Seeds of random_layout whose plans copy an operand through a map of its own axes (h200, bf16;
#: test_random_layouts_take_own_axes_maps holds it).
RANDOM_SEEDS = [18, 22, 26, 30, 31, 42, 46, 47, 48, 50]


def test_each_operand_gets_the_view_its_layout_needs():
    d = merge_heads().bind(s=300, h=3, d=40, e=200)
    p = analyze(d)
    assert operand_view(d, p, p.A) == ()  # O[h][s][d]: s is next to d, h moves tiles down by s rows
    assert operand_view(d, p, p.B) == (2, 0, 1)  # W read as [h][e][d]
    d = batch_behind_rows().bind(b=3, i=200, j=136, k=96)
    p = analyze(d)
    assert operand_view(d, p, p.A) == () and operand_view(d, p, p.B) == (2, 0, 1)
    d = mn_major_middle_batch().bind(b=2, i=192, j=128, k=100)
    p = analyze(d)
    assert not p.a_kmajor and operand_view(d, p, p.A) == (2, 0, 1)  # [b][k][i]: rows are k
    # B[b][k][j] is stored K by rows with a batch axis: K = 100 is no multiple of 64, so a 2-D map's
    # chunk would read the next element's rows; its own axes read zeros past k instead
    assert operand_view(d, p, p.B) == (2, 1, 0)


def test_too_many_axes_for_a_tensor_map_are_refused_with_the_reason():
    a, b, c, e, f, g, k = axes("a b c e f g k")
    d = Diagram("wide", contract(array("A", a, k), array("B", c, b, e, f, g, k), over=k, out=(a, b, e, f, g, c),
                                 name="C")).bind(a=64, b=2, c=64, e=2, f=2, g=2, k=64)
    why = FAMILY.wgmma_reason(d, "h100")
    assert why is not None and "at most 5" in why


@pytest.mark.parametrize("build, sizes", CASES, ids=lambda x: getattr(x, "__name__", ""))
def test_the_planner_takes_wgmma_and_the_launch_carries_the_views(build, sizes):
    plan = derive(build(), "h200", "bf16", sizes=sizes).plan
    (k,) = plan.kernels
    assert k.kernel.options.engine == "wgmma", plan.summary()
    launch = FAMILY.lower(plan.diagram, plan.schedule, "sm_90a").launches[0]
    maps = {a.name: a for a in launch.args if a.kind == "tmap"}
    p = analyze(plan.diagram)
    for v in (p.A, p.B):
        view = operand_view(plan.diagram, p, v)
        assert maps[v.name].view == view and len(maps[v.name].value) == (len(view) or 2)
        if view:
            assert f"tma_load_{len(view)}d" in launch.source
            assert f"{v.label()} copied through a {len(view)}-D tensor map of its own axes" in launch.source


def test_a_view_describes_the_arrays_axes_in_its_order():
    # W[e][h][d] as [h][e][d]: sizes innermost first, byte strides of e and h
    assert view_dims((200, 3, 40), (2, 0, 1), 2) == ((40, 200, 3), (240, 80))
    slot = TensorMapSlot("bf16", (200, 3, 40), (64, 64, 1), view=(2, 0, 1))
    assert slot.dims == (40, 200, 3) and slot.strides == (240, 80)
    from napkin.errors import LaunchError
    with pytest.raises(LaunchError, match="innermost first"):
        view_dims((200, 3, 40), (0, 2, 1), 2)
    with pytest.raises(LaunchError, match="every axis once"):
        view_dims((200, 3, 40), (2, 0), 2)  # an axis left out would leave its data out
    with pytest.raises(LaunchError, match="multiple of 16"):
        view_dims((200, 3, 12), (2, 0, 1), 2)  # a 24-byte stride


NVCC = shutil.which("nvcc") or (os.path.exists("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc") or None


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
@pytest.mark.parametrize("build, sizes", CASES, ids=lambda x: getattr(x, "__name__", ""))
def test_the_kernels_build_for_sm_90a(build, sizes, tmp_path):
    from napkin.codegen import compile as napkin_compile

    cd = napkin_compile(build(), sizes=sizes, dtype="bf16", gpu="h200")
    src = tmp_path / "k.cu"
    src.write_text(cd.source)
    r = subprocess.run([NVCC, "-cubin", "-std=c++17", "-arch=sm_90a", "-O3", "-o", str(tmp_path / "k.cubin"), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


def test_random_layouts_take_own_axes_maps():
    from napkin.codegen import compile as napkin_compile

    for seed in RANDOM_SEEDS:
        d, sizes = random_layout(seed)
        cd = napkin_compile(d, sizes=sizes, dtype="bf16", gpu="h200")
        assert any(a.view for k in cd.launches for a in k.args if a.kind == "tmap"), (seed, cd.plan.summary())


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_random_layouts_build_for_sm_90a(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from napkin.codegen import compile as napkin_compile

    def build(seed):
        d, sizes = random_layout(seed)
        src = tmp_path / f"k{seed}.cu"
        src.write_text(napkin_compile(d, sizes=sizes, dtype="bf16", gpu="h200").source)
        r = subprocess.run([NVCC, "-cubin", "-std=c++17", "-arch=sm_90a", "-O3", "-o", str(src) + ".cubin", str(src)],
                           capture_output=True, text=True, timeout=600)
        return seed, r.returncode, r.stderr[-2000:]

    with ThreadPoolExecutor(max_workers=4) as pool:
        bad = [(seed, err) for seed, rc, err in pool.map(build, RANDOM_SEEDS) if rc]
    assert not bad, bad
