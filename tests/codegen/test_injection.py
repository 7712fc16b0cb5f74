"""Nothing a diagram carries reaches CUDA unless it is a checked identifier, a number napkin
formatted, or a whitelisted function's expression."""

from __future__ import annotations

import pytest

from napkin.codegen import families, render
from napkin.codegen.generate import generate_source
from napkin.codegen.lower import lower, prepare
from napkin.codegen.render import Code, c_float, comment, ident, map_expr, render_string
from napkin.diagrams import Axis, Diagram, array, library, softmax
from napkin.diagrams.ops import InputOp, Map, Value
from napkin.errors import CodegenError, DiagramError, NapkinError
from napkin.perfmodel.schedule import Schedule

HOSTILE = [
    'x; asm("trap;")',
    "__global__",
    "ẋ",                      # unicode letter
    "q\n#include <evil>",
    "a b",
    "x*/ asm(\"trap;\") /*",
    "",
    "1x",
    "x" * 40,
]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_axis_and_array_names_are_refused_by_the_diagram(name):
    with pytest.raises(DiagramError):
        Axis(name)
    with pytest.raises(DiagramError):
        array(name, Axis("r"))
    with pytest.raises(DiagramError):
        Diagram(name, softmax(array("X", Axis("r"), Axis("x")), over="x"))


@pytest.mark.parametrize("name", HOSTILE)
def test_ident_refuses_hostile_names(name):
    with pytest.raises(CodegenError):
        ident(name)
    with pytest.raises(CodegenError):
        ident(name, "in_")


@pytest.mark.parametrize("name", [h for h in HOSTILE if h])
def test_templates_refuse_plain_text(name):
    with pytest.raises(CodegenError):
        render_string("int {{ v }} = 0;", v=name)
    with pytest.raises(CodegenError):
        render_string("f({{ xs | join(', ') }})", xs=[Code("a"), name])


def test_templates_accept_only_whitelisted_kinds():
    assert render_string("{{ a }} {{ b }} {{ c }} {{ d }}", a=ident("q", "i_"), b=3, c=0.5, d="gamma") == \
        "i_q 3 0.5f gamma"
    for bad in (None, object(), [1], {"a": 1}, b"x", 1 + 2j):
        with pytest.raises(CodegenError):
            render_string("{{ v }}", v=bad)
    with pytest.raises(CodegenError):  # StrictUndefined: a missing value is an error, not ""
        render_string("{{ missing }}")


def test_numbers_are_formatted_by_napkin():
    assert c_float(float("inf")) == "INFINITY" and c_float(-1.5) == "(-1.5f)"
    assert c_float(1e-6) == "1e-06f" and c_float(3) == "3.0f"
    with pytest.raises(CodegenError):
        c_float("1; asm")
    with pytest.raises(CodegenError):
        c_float(True)


def test_only_whitelisted_functions_render():
    assert map_expr("exp", [Code("a_x")]) == "__expf(a_x)"
    assert "erff" in map_expr("gelu", ["a_x"])
    with pytest.raises(CodegenError, match="whitelist"):
        map_expr("system", [Code("a_x")])
    with pytest.raises(CodegenError):
        map_expr("exp", ['x); asm("trap;"); (x'])
    with pytest.raises(CodegenError):
        map_expr("exp", [Code("a"), Code("b")])  # wrong arity


def test_comments_cannot_break_out():
    c = comment('line\n#define x 1 \\')
    assert "\n" not in c and "\\" not in c
    assert comment("√d → Σ") == "sqrtd -> sum "
    assert comment("ẋ").isascii()


@pytest.mark.parametrize("text", ["a\nb", "a\r\nb", "a\rb", "a\u2028b", "a\x0bb", "a\x0cb", "a\x85b",
                                  "*/ asm(\"trap;\") /*", "x */", "/* x", "**/", "*/*/", "//*", "a\\\nb"])
def test_comment_never_holds_a_line_break_nor_closes_a_block_comment(text):
    c = comment(text)
    assert isinstance(c, Code) and c.isascii()
    assert "\n" not in c and "\r" not in c and "\\" not in c
    assert "*/" not in c and "/*" not in c
    assert len(c.splitlines()) <= 1


def test_comment_of_a_parameter_label():
    from napkin.diagrams import scale

    r, x = Axis("r", 4), Axis("x", 8)
    import sympy

    v = scale(array("X", r, x), 1 / sympy.sqrt(sympy.Symbol("x", integer=True, positive=True)))
    assert comment(v.op.label()) == "scale(1/sqrt(x))"


def _smuggled_input(name: str, *axes: Axis) -> Value:
    # Value() itself does not check names: this is how a tampered diagram would look
    return Value(InputOp(), (), axes, "bf16", name)


@pytest.mark.parametrize("name", ['x; asm("trap;")', "__global__", "ẋ"])
def test_smuggled_array_name_is_refused_before_cuda(name):
    r, x = Axis("r", 4), Axis("x", 64)
    X = _smuggled_input(name, r, x)
    P = Value(softmax(array("Y", r, x), over="x").op, (X,), (r, x), "bf16", "P")
    d = Diagram("tampered", P)
    # each family refuses it itself, given a schedule of its own ...
    for fam in ("rowwise", "fallback"):
        f = families.get(fam)
        with pytest.raises(CodegenError, match="cannot reach CUDA"):
            f.lower(d, f.candidates(d, "h100", "bf16")[0], "sm_90a")
    # ... and the planner refuses it before any family is asked to build it
    for fam in ("rowwise", "fallback", None):
        with pytest.raises(NapkinError, match="is not allowed"):
            lower(d, family=fam)


def test_smuggled_function_is_refused_before_cuda():
    r, x = Axis("r", 4), Axis("x", 64)
    X = array("X", r, x)
    evil = Value(Map("system", ()), (X,), (r, x), "bf16", "E")
    P = softmax(evil, over="x", name="P")
    d = Diagram("tampered_fn", P)
    for fam in ("rowwise", "fallback"):
        f = families.get(fam)
        with pytest.raises((CodegenError, DiagramError), match="system"):
            f.lower(d, Schedule.fused(d), "sm_90a")
    for fam in ("rowwise", "fallback", None):
        with pytest.raises(NapkinError, match="unknown elementwise function 'system'"):
            lower(d, family=fam)


def test_description_text_never_reaches_cuda():
    d = library.get("softmax")
    evil = Diagram(d.name, d.outputs, d.inputs, description='*/ asm("trap;") /*\n#error boom')
    src = generate_source(evil, sizes={"r": 4, "x": 64})
    assert "trap" not in src and "#error boom" not in src
    p = lower(evil, sizes={"r": 4, "x": 64}, family="fallback")
    assert all("asm(" not in k.source for k in p.launches)


def test_every_template_value_goes_through_the_whitelist(monkeypatch):
    """Render every template of this engineer's families with one context value swapped for
    hostile plain text: each swap is refused."""
    seen = {}
    real = render.render

    def spy(template, **ctx):
        seen.setdefault(template, ctx)
        return real(template, **ctx)

    import napkin.codegen.families.fallback as fb
    import napkin.codegen.families.rowwise as rw

    monkeypatch.setattr(rw, "render", spy)
    monkeypatch.setattr(fb, "render", spy)
    lower(prepare("layernorm", sizes={"r": 4, "x": 64}), family="rowwise")
    lower(prepare("transformer_block", sizes=dict(q=5, e=12, h=2, d=4, f=7)), family="fallback")
    lower(prepare(library.get("matmul").renamed("m"), sizes=dict(a=3, b=4, c=5)), family="fallback")
    from napkin.diagrams import reduce

    red = Diagram("red", reduce(array("X", Axis("r", 3), Axis("x", 5)), "x", "min", name="R"))
    lower(red, family="fallback")
    assert {"rowwise.cu.jinja", "fallback_map.cu.jinja", "fallback_contract.cu.jinja",
            "fallback_row.cu.jinja", "fallback_reduce.cu.jinja"} <= set(seen)
    for template, ctx in seen.items():
        swapped = 0
        text = real(template, **ctx)
        for key, value in ctx.items():
            if isinstance(value, Code) and value and str(value) in text:
                bad = dict(ctx)
                bad[key] = str(value) + '; asm("trap;")'
                with pytest.raises(CodegenError):
                    real(template, **bad)
                swapped += 1
        assert swapped >= 2, template
