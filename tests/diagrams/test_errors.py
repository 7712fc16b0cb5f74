"""Bad input: every case raises one NapkinError whose message names the operation and the axis."""

from __future__ import annotations

import textwrap

import pytest

from napkin.diagrams import (Axis, Diagram, array, axes, causal, contract, exp, layernorm, library, load_diagram,
                             map_fn, softmax, sum_over)
from napkin.errors import DiagramError, NapkinError, UserFileError


def one_line(e: BaseException) -> str:
    msg = str(e)
    assert msg and "\n" not in msg, f"error message is not one line: {msg!r}"
    return msg


# ----------------------------------------------------------------------------- axes

def test_mismatched_axis_sizes_in_a_contraction():
    a, c = axes("a c")
    A = array("A", a, Axis("d", 64))
    B = array("B", Axis("d", 128), c)
    with pytest.raises(DiagramError) as e:
        contract(A, B, over="d")
    msg = one_line(e.value)
    assert "contract" in msg and "'d'" in msg and "64" in msg and "128" in msg
    assert "A[a,d]" in msg and "B[d,c]" in msg


def test_mismatched_axis_sizes_in_an_elementwise_map():
    X = array("X", Axis("r", 4), Axis("x", 8))
    g = array("g", Axis("x", 9))
    with pytest.raises(DiagramError) as e:
        X * g
    msg = one_line(e.value)
    assert "map mul" in msg and "'x'" in msg and "8" in msg and "9" in msg


def test_contracting_an_axis_an_input_lacks():
    a, b, c, d = axes("a b c d")
    A, B = array("A", a, b), array("B", c, d)
    with pytest.raises(DiagramError) as e:
        contract(A, B, over=b)
    msg = one_line(e.value)
    assert "contract over b" in msg and "lacks axis 'b'" in msg and "B[c,d]" in msg


def test_contracting_an_axis_no_input_carries():
    a, b = axes("a b")
    with pytest.raises(DiagramError) as e:
        contract(array("A", a), array("B", b), over="z")
    msg = one_line(e.value)
    assert "contract over z" in msg and "'z'" in msg


@pytest.mark.parametrize("build, op", [
    (lambda X: softmax(X, over="z"), "softmax over z"),
    (lambda X: sum_over(X, over="z"), "sum over z"),
    (lambda X: layernorm(X, over="z"), "layernorm over z"),
    (lambda X: causal(X, "r", "z"), "map causal"),
])
def test_box_over_an_axis_its_input_lacks(build, op):
    X = array("X", *axes("r x"))
    with pytest.raises(DiagramError) as e:
        build(X)
    msg = one_line(e.value)
    assert op in msg and "'z'" in msg


def test_unknown_axis_in_bind():
    with pytest.raises(DiagramError) as e:
        library.get("attention").bind(q=4, zz=3)
    msg = one_line(e.value)
    assert "'zz'" in msg and "attention" in msg and "'q'" in msg  # names the axis, the diagram, the known axes


def test_zero_and_negative_axis_sizes():
    for bad in (0, -1):
        with pytest.raises(DiagramError) as e:
            Axis("d", bad)
        msg = one_line(e.value)
        assert "'d'" in msg and str(bad) in msg
    with pytest.raises(DiagramError, match="axis 'q'"):
        library.get("attention").bind(q=0)
    with pytest.raises(DiagramError, match="'d'"):
        axes("q d=0")
    with pytest.raises(DiagramError, match="'abc'"):
        axes("q d=abc")


def test_unbound_size_where_a_number_is_needed():
    with pytest.raises(DiagramError) as e:
        Axis("q").bound_size
    assert "'q'" in one_line(e.value) and "-s q=" in str(e.value)


# ----------------------------------------------------------------------------- names

@pytest.mark.parametrize("bad", ["x; system(\"rm -rf /\")", "", "1x", "a b", "a-b", "ü", "x" * 33, "__init__;"])
def test_bad_names_are_refused_everywhere(bad):
    with pytest.raises(DiagramError, match="axis name .* is not allowed"):
        Axis(bad)
    with pytest.raises(DiagramError, match="array name .* is not allowed"):
        array(bad, Axis("a"))
    with pytest.raises(DiagramError, match="diagram name .* is not allowed"):
        Diagram(bad, array("A", Axis("a")) * 2.0)


def test_bad_name_in_a_box_name():
    with pytest.raises(DiagramError, match="not allowed"):
        softmax(array("X", *axes("r x")), over="x", name="P; drop")


def test_unknown_elementwise_function():
    with pytest.raises(DiagramError) as e:
        map_fn("system", array("X", Axis("a")))
    assert "'system'" in one_line(e.value)


def test_same_axis_twice_in_an_array():
    a = Axis("a")
    with pytest.raises(DiagramError, match="array 'A': axis 'a' appears twice"):
        array("A", a, a)


def test_two_inputs_with_one_name():
    a = Axis("a")
    with pytest.raises(DiagramError, match="two different inputs are both called 'A'"):
        Diagram("d", array("A", a) + array("A", Axis("b")))


def test_an_output_is_not_renamed_without_a_word():
    """A box named like an input (softmax(A, name="A")) became the output 'softmax' in silence."""
    a, b = axes("a b")
    A = array("A", a, b)
    with pytest.raises(DiagramError, match="output A\\[a,b\\] is named 'A', the name of an input"):
        Diagram("d", softmax(A, b, name="A"))
    with pytest.raises(DiagramError, match="two different outputs are both named 'Y'"):
        Diagram("d", (exp(A).named("Y"), softmax(A, b, name="Y")))
    d = Diagram("d", exp(softmax(A, b, name="A"), name="E"))  # an inner box's name may repeat one
    assert d.output_names == ("E",) and d.input_names == ("A",)


# ----------------------------------------------------------------------------- dtypes

def test_dtype_mismatch():
    q, x, d = axes("q x d")
    Q = array("Q", q, d, dtype="bf16")
    K = array("K", x, d, dtype="fp32")
    with pytest.raises(DiagramError) as e:
        contract(Q, K, over=d)
    msg = one_line(e.value)
    assert "contract over d" in msg and "bf16" in msg and "fp32" in msg and "Q[q,d]" in msg


def test_dtype_mismatch_in_a_map():
    a = Axis("a")
    with pytest.raises(DiagramError, match="map add: inputs have different dtypes"):
        array("A", a, dtype="fp16") + array("B", a, dtype="fp32")


def test_unknown_dtype():
    with pytest.raises(DiagramError) as e:
        array("A", Axis("a"), dtype="int7")
    assert "'A'" in one_line(e.value) and "int7" in str(e.value)
    with pytest.raises(NapkinError, match="unknown dtype"):
        library.get("softmax").with_dtype("int7")


# ----------------------------------------------------------------------------- names of diagrams

def test_unknown_diagram_name():
    with pytest.raises(DiagramError) as e:
        load_diagram("atention")
    msg = one_line(e.value)
    assert "'atention'" in msg and "attention" in msg and "path/to/file.py" in msg
    with pytest.raises(DiagramError):
        library.get("nope")


# ----------------------------------------------------------------------------- reference inputs

def test_reference_input_errors():
    torch = pytest.importorskip("torch")
    d = library.get("attention").bind(q=4, x=5, d=3)
    with pytest.raises(DiagramError, match="no input \\['Z'\\]"):
        d.reference({"Z": torch.zeros(1)})
    with pytest.raises(DiagramError, match="axis 'd' has size 3 but the tensor has 2"):
        d.reference({"Q": torch.randn(4, 2)})
    with pytest.raises(DiagramError, match="expected 2 dimensions"):
        d.reference({"Q": torch.randn(4)})
    sym = library.get("attention")
    with pytest.raises(DiagramError, match="axis 'd'"):
        sym.reference({"Q": torch.randn(4, 3), "K": torch.randn(5, 2)})


# ----------------------------------------------------------------------------- user files

def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


def test_user_file_missing(tmp_path):
    with pytest.raises(UserFileError) as e:
        load_diagram(str(tmp_path / "nope.py") + ":d")
    assert "does not exist" in one_line(e.value) and "nope.py" in str(e.value)


def test_user_file_that_fails_to_import(tmp_path):
    p = write(tmp_path, "broken.py", """\
        from napkin.diagrams import axes
        a, b = axes("a b")
        raise RuntimeError("boom")
        """)
    with pytest.raises(UserFileError) as e:
        load_diagram(p + ":d")
    msg = one_line(e.value)
    assert "failed to import" in msg and "line 3" in msg and "RuntimeError: boom" in msg


def test_user_file_with_a_syntax_error(tmp_path):
    p = write(tmp_path, "syntax.py", "def (:\n")
    with pytest.raises(UserFileError, match="failed to import.*SyntaxError"):
        load_diagram(p)


def test_user_file_whose_diagram_is_malformed(tmp_path):
    p = write(tmp_path, "bad_axes.py", """\
        from napkin.diagrams import Axis, array, contract, Diagram
        A = array("A", Axis("a"), Axis("d", 64))
        B = array("B", Axis("d", 128), Axis("c"))
        d = Diagram("d", contract(A, B, over="d"))
        """)
    with pytest.raises(UserFileError) as e:
        load_diagram(p + ":d")
    msg = one_line(e.value)
    assert "DiagramError" in msg and "contract over d" in msg and "'d'" in msg


def test_user_file_holding_no_diagram(tmp_path):
    p = write(tmp_path, "empty.py", "x = 1\n")
    with pytest.raises(UserFileError) as e:
        load_diagram(p)
    assert "holds no napkin Diagram" in one_line(e.value)


def test_user_file_unknown_name(tmp_path):
    p = write(tmp_path, "one.py", """\
        from napkin.diagrams import library
        mine = library.get("softmax").renamed("mine")
        """)
    assert load_diagram(p).name == "mine"
    assert load_diagram(p + ":mine").name == "mine"
    with pytest.raises(UserFileError) as e:
        load_diagram(p + ":other")
    msg = one_line(e.value)
    assert "'other'" in msg and "mine" in msg


def test_user_file_name_that_is_not_a_diagram(tmp_path):
    p = write(tmp_path, "notd.py", """\
        x = 3
        def f(a, b):
            return a
        """)
    for name in ("x", "f"):
        with pytest.raises(UserFileError, match="is not a napkin Diagram"):
            load_diagram(f"{p}:{name}")


def test_user_file_with_several_diagrams_needs_a_name(tmp_path):
    p = write(tmp_path, "two.py", """\
        from napkin.diagrams import library
        a = library.get("softmax")
        b = library.get("matmul")
        """)
    with pytest.raises(UserFileError, match="several diagrams"):
        load_diagram(p)
    assert load_diagram(p + ":b").name == "matmul"


def test_user_file_function_that_raises(tmp_path):
    p = write(tmp_path, "fn.py", """\
        def build():
            raise ValueError("bad build")
        """)
    with pytest.raises(UserFileError, match="build\\(\\) failed: ValueError: bad build"):
        load_diagram(p + ":build")


def test_every_error_is_a_napkin_error():
    for cls in (DiagramError, UserFileError):
        assert issubclass(cls, NapkinError)
