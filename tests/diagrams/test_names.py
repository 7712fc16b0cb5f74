"""One name check, matched against the whole name (issue #16, item 1).

``napkin.diagrams.axes.check_name`` (through ``is_name``) is the one check every axis, array,
diagram, kernel and size-symbol name passes. It must match the *whole* string: ``$`` in a
``re.match`` pattern also matches before a trailing newline, which let ``Axis("q\\n")`` through
to CUDA source and file names.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from napkin.codegen.render import ident, render_string
from napkin.diagrams import Axis, Diagram, array, axes, contract, rename, softmax
from napkin.diagrams.axes import check_name, is_name
from napkin.errors import CodegenError, DiagramError

PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")

BAD = ["q\n", "q\r", "q\r\n", "q\n\n", "\nq", "q\t", "q ", " q", "q\x00", "q\x0b", "q\x0c", "q\u2028",
       "é", "qé", "ẋ", "\u212a", "\u017f", "q٣", "x" * 33, "a" + "1" * 32, "", "1q", "_q", "q-x", "q.x", "q;"]


@pytest.mark.parametrize("name", BAD)
def test_bad_names_are_refused_by_the_one_check(name):
    assert not is_name(name)
    with pytest.raises(DiagramError, match="not allowed"):
        check_name(name, "axis")
    with pytest.raises(DiagramError):
        Axis(name)
    with pytest.raises(DiagramError):
        array(name, Axis("q"))
    with pytest.raises(DiagramError):
        softmax(array("X", Axis("q")), over="q", name=name)
    with pytest.raises(DiagramError):
        Diagram(name, softmax(array("X", Axis("q")), over="q"))
    with pytest.raises(DiagramError):
        rename(array("X", Axis("q")), **{"q": name})


@pytest.mark.parametrize("name", ["q\n", "q\r", "x" * 33, "é"])
def test_bad_names_never_reach_cuda_identifiers(name):
    with pytest.raises(CodegenError):
        ident(name, "i_")
    with pytest.raises(CodegenError):
        render_string("{{ a }}", a=name)


def test_trailing_newline_in_an_axis_spec_or_a_size_symbol_is_refused():
    import sympy

    assert [a.name for a in axes("q\n x")] == ["q", "x"]  # whitespace separates names in a spec
    with pytest.raises(DiagramError):
        Axis("q", sympy.Symbol("n\n"))
    with pytest.raises(DiagramError):
        contract(array("A", Axis("q"), Axis("d")), array("B", Axis("d")), over="d\n")


@pytest.mark.parametrize("name", ["q", "Q", "x1", "S_masked", "a" * 32, "A_" + "9" * 30])
def test_plain_names_are_accepted(name):
    assert is_name(name)
    assert check_name(name, "axis") == name
    assert Axis(name).name == name


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=40), st.from_regex(PLAIN, fullmatch=True),
                 st.from_regex(PLAIN, fullmatch=True).map(lambda s: s + "\n"),
                 st.from_regex(PLAIN, fullmatch=True).flatmap(
                     lambda s: st.text(min_size=1, max_size=3).map(lambda t: s + t))))
def test_every_accepted_name_fully_matches_the_plain_identifier_pattern(name):
    accepted = is_name(name)
    assert accepted == (PLAIN.fullmatch(name) is not None)
    if accepted:
        assert check_name(name, "axis") == name and name.isascii() and "\n" not in name
    else:
        with pytest.raises(DiagramError):
            check_name(name, "array")


@pytest.mark.parametrize("text", ["1q=4", "é=4", "q" + "x" * 32 + "=4"])
def test_size_option_names_pass_the_one_check(text):
    from napkin.cli_common import UsageError, parse_size

    with pytest.raises(UsageError, match="not an axis name"):
        parse_size(text)


@pytest.mark.parametrize("arch", ["sm_90\n", "sm_80\n", "\nsm_80"])
def test_an_arch_with_a_line_break_never_reaches_the_compiler(arch):
    from napkin.kernels.compile import check_arch

    with pytest.raises(CodegenError, match="unknown GPU architecture"):
        check_arch(arch)


def test_a_buffer_whose_name_ends_in_a_line_break_is_refused():
    import dataclasses

    from napkin.codegen.lower import build, check_program
    from napkin.codegen.planner import derive
    from napkin.diagrams import library
    from napkin.perfmodel import get_gpu

    plan = derive(library.get("transformer_block").bind({"q": 64, "e": 64, "h": 2, "d": 32, "f": 128}),
                  get_gpu("h100"), "bf16", explain=False).plan
    program = build(plan)
    assert program.buffers
    bad = dataclasses.replace(program.buffers[0], name=program.buffers[0].name + "\n")
    with pytest.raises(CodegenError, match="not a checked identifier"):
        check_program(dataclasses.replace(program, buffers=(bad, *program.buffers[1:])))
