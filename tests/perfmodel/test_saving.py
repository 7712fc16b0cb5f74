"""The save-or-recompute choice for backward diagrams (napkin.perfmodel.saving), and that the backward
diagrams it makes plan on the CPU.

The choice compares HBM time (write and read back, or only the read for a forward output) with the
compute time of recomputing; the checks are the textbook outcomes at model sizes (FlashAttention keeps
the log-sum-exp and O, not P; an MLP keeps its pre-activation; softmax keeps its output; norms keep
their per-row statistics), that the outcome follows the numbers (a head dimension past the crossover
saves P), and that the gradients with the chosen saves are still torch.autograd's.
"""

from __future__ import annotations

import pytest
import torch

from napkin.diagrams import Axis, Diagram, array, library
from napkin.diagrams.grad import saveable
from napkin.errors import DiagramError
from napkin.perfmodel.hardware import get_gpu
from napkin.perfmodel.saving import SavePlan, backward, box_seconds, choose_saved


def _bound(name: str, **override):
    return library.get(name).bind(**{**library.entry(name).default_sizes, **override})


def test_attention_keeps_the_log_sum_exp_and_O_not_P(h100):
    plan = choose_saved(_bound("attention_causal"), h100)
    assert plan.save == {"P_lse", "O"}
    p = next(c for c in plan.choices if c.name == "P")
    assert not p.saved and p.save_s > p.recompute_s  # 2 q x bytes·2 of HBM vs 2 q x d FLOPs of tensor cores
    b, again = backward(_bound("attention_causal"), h100)
    assert again == plan and b.input_names[-2:] == ("P_lse", "O")


def test_the_choice_follows_the_numbers(h100):
    """Recomputing P costs 2·d FLOPs per score, saving it 4 bytes: past d ≈ 2·rate/bandwidth, save P."""
    crossover = 2 * h100.tensor_rate("bf16") / h100.hbm_bandwidth
    small = choose_saved(_bound("attention", q=1024, x=1024, d=64), h100)
    large = choose_saved(_bound("attention", q=1024, x=1024, d=int(4 * crossover)), h100)
    assert "P" not in small.save and "P" in large.save
    assert large.saved_bytes > small.saved_bytes


def test_mlp_keeps_its_pre_activation_and_softmax_its_output(h100):
    assert choose_saved(_bound("mlp"), h100).save == {"add"}
    soft = choose_saved(_bound("softmax"), h100)
    assert soft.save == {"P"}
    p = soft.choices[0]
    assert p.save_s == pytest.approx(p.bytes / h100.hbm_bandwidth)  # an output: read back only
    add = choose_saved(_bound("mlp"), h100).choices[0]
    assert add.save_s == pytest.approx(2 * add.bytes / h100.hbm_bandwidth)  # an intermediate: written and read


@pytest.mark.parametrize("name,stats", [("rmsnorm", {"N_rstd"}), ("layernorm", {"N_mean", "N_rstd"})])
def test_norms_keep_their_row_statistics(h100, name, stats):
    plan = choose_saved(_bound(name), h100)
    assert stats <= plan.save
    tiny = choose_saved(_bound(name, x=2), h100)  # rows of 2: reducing again beats a write and a read
    assert not (stats & tiny.save)


def test_a_transformer_block_keeps_what_frameworks_keep(h100):
    plan = choose_saved(_bound("transformer_block"), h100)
    assert {"P_lse", "O", "N1_rstd", "N2_rstd"} <= plan.save and "P" not in plan.save
    assert {c.name for c in plan.choices} == {s.name for s in saveable(_bound("transformer_block"))}
    text = str(plan)
    assert "transformer_block" in text and "P_lse" in text and "MiB" in text
    assert plan.to_dict()["save"] == sorted(plan.save)


def test_the_picks_keep_what_the_backward_would_recompute_from_a_saved_statistic(h100):
    """One save decision: choose_saved applies save_set (the rule napkin.torch applies to every set
    it ranks), so the arrays rebuilt from the bf16 rstd are saved beside the arrays computed from
    the forward's own, and each says why."""
    from napkin.diagrams.grad import recomputed_from_statistics
    from napkin.perfmodel.saving import save_set

    d = _bound("transformer_block")
    plan = choose_saved(d, h100)
    assert recomputed_from_statistics(d, plan.save) == ()
    assert save_set(d, plan.save) == plan.save
    beside = {c.name for c in plan.choices if c.saved and "norm statistic" in c.reason}
    assert beside == {"N1", "Xn", "Xn2"}
    # the time alone would recompute them: elementwise passes over the row are cheaper than a write and a read
    assert all(c.recompute_s < c.save_s for c in plan.choices if c.name in beside)
    assert save_set(d, {"N1_rstd", "N2_rstd"}) == {"N1_rstd", "N2_rstd"}  # nothing saved was computed from them


def test_box_seconds_counts_tensor_and_cuda_cores(h100):
    mm = _bound("matmul", a=1024, b=1024, c=1024)
    t = box_seconds(mm.outputs[0], h100)
    assert t == pytest.approx(2 * 1024 ** 3 / h100.tensor_rate("bf16"))
    fp32 = mm.with_dtype("fp32")  # not a tensor-core dtype to the model (as napkin.perfmodel.cost counts it)
    assert box_seconds(fp32.outputs[0], h100) == pytest.approx(2 * 1024 ** 3 / h100.cuda_core_rate("fp32"))
    gelu = _bound("mlp", a=64, b=64, c=64).outputs[0]
    assert box_seconds(gelu, h100) > 0


def test_unbound_or_wrong_diagrams_are_refused():
    with pytest.raises(DiagramError, match="unbound axes"):
        choose_saved(library.get("attention"))
    with pytest.raises(DiagramError, match="expected a Diagram"):
        choose_saved("attention")


def test_a_backward_that_reads_nothing_saves_nothing(h100):
    plan = choose_saved(_bound("matmul"), h100)
    assert isinstance(plan, SavePlan) and plan.choices == () and plan.save == frozenset()
    assert "reads nothing" in str(plan)


def test_the_gpu_and_dtype_enter_the_choice():
    d = _bound("attention", q=2048, x=2048, d=128)
    a = choose_saved(d, "h100")
    b = choose_saved(d, get_gpu("h200"))
    c = choose_saved(d, "h100", dtype="fp32")
    assert a.gpu != b.gpu and c.dtype == "fp32"
    pa, pb = (next(x for x in p.choices if x.name == "P") for p in (a, b))
    assert pb.save_s < pa.save_s  # the H200's HBM is faster
    assert next(x for x in c.choices if x.name == "P").bytes == 2 * next(x for x in a.choices if x.name == "P").bytes


@pytest.mark.parametrize("name", library.names())
def test_the_chosen_saves_give_autograds_gradients(name):
    """At small sizes (where the choices differ from the large ones) the backward with the model's
    saves, fed by forward_with_saves, is still torch.autograd of the forward reference."""
    from napkin.diagrams.grad import forward_with_saves

    e = library.entry(name)
    d = library.get(name).bind(**{k: 3 + i % 2 for i, k in enumerate(e.default_sizes)})
    b, plan = backward(d, "h100")
    gen = torch.Generator().manual_seed(0)
    xs = {v.name: torch.randn([a.bound_size for a in v.axes], generator=gen, dtype=torch.float64,
                              requires_grad=True) for v in d.inputs}
    outs = d.reference(xs, dtype=torch.float64)
    cots = {"d" + n: torch.randn(outs[n].shape, generator=gen, dtype=torch.float64) for n in d.output_names}
    want = torch.autograd.grad(sum((outs[n] * cots["d" + n]).sum() for n in d.output_names), list(xs.values()),
                               allow_unused=True)
    feed = {n: t.detach() for n, t in xs.items()} | cots
    fwd = forward_with_saves(d, plan.save).reference({n: t.detach() for n, t in xs.items()}, dtype=torch.float64)
    feed |= {n: fwd[n] for n in plan.save}
    got = b.reference(feed, dtype=torch.float64)
    for n, w in zip(xs, want):
        w = torch.zeros_like(xs[n]) if w is None else w
        torch.testing.assert_close(got["d" + n], w, rtol=1e-9, atol=1e-9 * max(1.0, float(w.abs().max())))


# ----------------------------------------------------------------------------- planning (CPU)

#: Backward diagrams and the families their kernels take at model sizes (no kernel on the fallback).
PLANNED = {
    "matmul": {"contraction"},
    "mlp": {"contraction", "pointwise"},
    "softmax": {"pointwise", "rowwise"},
    "rmsnorm": {"pointwise", "rowwise"},
    "layernorm": {"pointwise", "rowwise"},
    "attention_causal": {"attention_bwd", "contraction", "pointwise"},  # one fused kernel, or six
    "swiglu": {"contraction", "pointwise"},
}


@pytest.mark.parametrize("name", sorted(PLANNED))
def test_backward_diagrams_plan_without_the_fallback(name):
    from napkin.codegen.planner import derive

    sizes = {"mlp": dict(a=1024, b=1024, c=4096), "swiglu": dict(a=1024, b=1024, f=2048),
             "attention_causal": dict(h=4, q=1024, x=1024, d=128)}.get(name, {})
    b, plan = backward(_bound(name, **sizes), "h100")
    der = derive(b, gpu="h100", explain=False)
    boxes = [x for k in der.plan.kernels for x in k.boxes]
    assert sorted(boxes) == sorted(b.name_of(v) for v in b.nodes)  # every box in one kernel
    families = {k.family for k in der.plan.kernels}
    assert "fallback" not in families, [(k.family, k.boxes) for k in der.plan.kernels]
    assert families <= PLANNED[name], families


def test_a_transposed_gradient_is_copied_off_the_fallback():
    """X[b,a] read against Z[a,b]: its gradient comes out in Z's layout and needs a transpose, which
    the pointwise family runs (a product over no axis into dX's order; it was the one fallback kernel)."""
    from napkin.codegen.planner import derive

    a, b = Axis("a", 512), Axis("b", 256)
    d = Diagram("t", (array("Y", a, b) * array("X", b, a)).named("Z"))
    der = derive(d.grad(), gpu="h100", explain=False)
    on_fallback = [k.boxes for k in der.plan.kernels if k.family == "fallback"]
    assert on_fallback == [], der.plan
    assert [k.family for k in der.plan.kernels if "dX" in k.boxes] == ["pointwise"], der.plan
