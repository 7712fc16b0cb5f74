"""Rendering CUDA from Jinja templates, with a whitelist on everything that reaches the source.

The templates live in ``napkin/codegen/templates/`` (package data). The environment uses
``StrictUndefined`` (a missing variable is an error, never an empty string) and a *finalize*
hook that every ``{{ ... }}`` passes through. It lets through only:

- :class:`Code`: text napkin built itself from whitelisted pieces (identifiers checked by
  :func:`napkin.diagrams.axes.is_name`, the one name check, numbers formatted here, CUDA type names from
  :data:`napkin.dtypes.DTYPES`, and the expressions of
  :data:`napkin.diagrams.functions.FUNCTIONS`);
- ``int`` (written in decimal) and ``float`` (written by :func:`c_float`);
- a plain ``str`` only if it is an identifier that ``is_name`` accepts (or only spaces).

Anything else (a name with ``;``, quotes, spaces, unicode, a free-text description) raises a
:class:`~napkin.errors.CodegenError` before a line of CUDA exists. Comments carrying names go
through :func:`comment`, which keeps a small ASCII set and never lets a line break out (nor
closes a block comment).

>>> ident("q", "i_")
'i_q'
>>> c_float(0.125), c_float(float("-inf"))
('0.125f', '(-INFINITY)')
>>> render_string("{{ a }} + {{ b }}", a=ident("x", "a_"), b=2)
'a_x + 2'
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Iterable, Sequence

from ..diagrams.axes import NAME_RE, is_name
from ..diagrams.functions import FUNCTIONS, half_form
from ..dtypes import DTYPES
from ..dtypes import dtype as lookup_dtype
from ..errors import CodegenError

__all__ = [
    "Code", "ident", "c_float", "c_int", "c_i64", "cuda_type", "map_expr", "half_math", "comment", "comment_lines",
    "environment", "render", "render_string", "template_names",
]


class Code(str):
    """CUDA text built by napkin from whitelisted pieces (only this module's helpers make it)."""

    __slots__ = ()


def ident(name: str, prefix: str = "") -> Code:
    """``prefix + name`` as a CUDA identifier; ``name`` must pass ``is_name`` (else CodegenError).

    Prefixes keep diagram names apart from CUDA keywords and from each other
    (an axis called ``int`` becomes ``i_int``).
    """
    if not isinstance(name, str):
        raise CodegenError(f"name {name!r} is not a string")
    if not is_name(name):
        raise CodegenError(f"name {name!r} cannot reach CUDA: names must match {NAME_RE.pattern}")
    if prefix and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", prefix):
        raise CodegenError(f"identifier prefix {prefix!r} is not a C identifier prefix")
    return Code(prefix + name)


def c_int(value) -> Code:
    """An integer literal (``long long`` suffix beyond 32 bits)."""
    if isinstance(value, bool) or not isinstance(value, int):
        if hasattr(value, "__index__"):
            value = int(value)
        else:
            raise CodegenError(f"{value!r} is not an integer")
    if -(2 ** 31) <= value < 2 ** 31:
        return Code(str(value))
    return Code(f"{value}LL")


def c_i64(value) -> Code:
    """A ``long long`` literal (``4096LL``)."""
    v = c_int(value)
    return v if v.endswith("LL") else Code(f"{v}LL")


def c_float(value) -> Code:
    """A float literal (``0.125f``), or ``INFINITY``/``NAN`` forms for non-finite values."""
    if isinstance(value, bool):
        raise CodegenError(f"{value!r} is not a number")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise CodegenError(f"{value!r} is not a number") from None
    if math.isnan(v):
        return Code("NAN")
    if math.isinf(v):
        return Code("INFINITY" if v > 0 else "(-INFINITY)")
    text = repr(v)  # shortest round-trip form: '0.125', '1e-05', '3.0'
    if "e" not in text and "." not in text:
        text += ".0"
    lit = text + "f"
    return Code(f"({lit})" if v < 0 else lit)


def cuda_type(dtype: str) -> Code:
    """The CUDA C++ type of a napkin dtype (``bf16`` → ``__nv_bfloat16``)."""
    dt = lookup_dtype(dtype)
    if dt.name not in ("fp32", "fp16", "bf16"):
        raise CodegenError(f"dtype {dt.name} is not supported by generated kernels (use bf16, fp16 or fp32)")
    return Code(DTYPES[dt.name].cuda_type)


def map_expr(fn: str, xs: Sequence[str], params: Sequence[float] = (), idx: Sequence[str] = (),
             sizes: Sequence[int] = (), half: bool = False) -> Code:
    """The fp32 CUDA expression of the whitelisted function ``fn`` applied to ``xs``.

    ``half``: the kernel stores its values in 16-bit floats (:func:`half_math`), so the function's
    faster form for them is taken where it has one (:meth:`ElementwiseFn.form`).

    ``xs`` and ``idx`` must be :class:`Code` (built by napkin) or ``is_name`` identifiers;
    an integer parameter of ``fn`` (a mask's offset or window) is written as a ``long long``
    literal by :func:`c_i64` (it must be an integral value in the function's range: no float
    round-trip, no truncation), any other parameter by :func:`c_float`; ``sizes`` by
    :func:`c_int`. An unknown function, or a wrong number of arguments, is refused.

    >>> map_expr("causal", [Code("s")], [-2], [Code("i_q"), Code("i_x")])
    '((i_x <= i_q + (-2LL)) ? s : -INFINITY)'
    >>> map_expr("log", [Code("a")]), map_expr("log", [Code("a")], half=True)
    ('logf(a)', 'napkin::hm_log(a)')
    """
    f = FUNCTIONS.get(fn) if isinstance(fn, str) else None
    if f is None:
        raise CodegenError(f"function {fn!r} is not in the whitelist of elementwise functions")
    if len(xs) != f.arity or len(params) != f.n_params or len(idx) != f.index_arity:
        raise CodegenError(f"function {fn}: expects {f.arity} input(s), {f.n_params} parameter(s) "
                           f"and {f.index_arity} index axes; got {len(xs)}, {len(params)}, {len(idx)}")
    subs = {}
    for i, x in enumerate(xs):
        subs[f"x{i}"] = _checked_code(x)
    for i, p in enumerate(params):
        subs[f"p{i}"] = _int_param(fn, i, p) if f.int_param(i) else c_float(p)
    for i, t in enumerate(idx):
        subs[f"i{i}"] = _checked_code(t)
    for i, n in enumerate(sizes):
        subs[f"n{i}"] = c_int(n)
    try:
        return Code(f.form(half).format(**subs))
    except (KeyError, IndexError) as e:
        raise CodegenError(f"function {fn}: its CUDA form needs {e} that was not given") from None


def half_math(dtype: str) -> bool:
    """Whether a kernel whose values are ``dtype`` computes its maps in the 16-bit forms
    (:func:`napkin.diagrams.functions.half_form`, the rule the cost model prices them by).

    >>> half_math("bf16"), half_math("fp32")
    (True, False)
    """
    return half_form(dtype)


def _int_param(fn: str, i: int, value) -> Code:
    """Integer parameter ``i`` of ``fn`` as a parenthesised ``long long`` literal (``(-2LL)``)."""
    from ..diagrams.functions import check_int_param
    from ..errors import NapkinError

    try:
        v = check_int_param(fn, i, value)
    except NapkinError as e:
        raise CodegenError(str(e)) from None
    lit = c_i64(v)
    return Code(f"({lit})" if v < 0 else lit)


def _checked_code(x) -> Code:
    if isinstance(x, Code):
        return x
    if is_name(x):
        return Code(x)
    raise CodegenError(f"{x!r} cannot reach CUDA: not a checked identifier or napkin-built expression")


_COMMENT_MAP = {"√": "sqrt", "→": "->", "Σ": "sum ", "⊙": "prod", "·": "*", "≤": "<=", "≥": ">=",
                "−": "-", "×": "x", "…": "..."}
_COMMENT_OK = re.compile(r"[A-Za-z0-9 _.,:;=+\-*/()\[\]<>{}|&%#!?'\"^~@$]")


def comment(text) -> Code:
    """One comment line's text: ASCII letters, digits and punctuation only.

    Line breaks (``\\n``, ``\\r`` and every other one), backslashes (line continuation) and
    anything outside the small set become ``?``, and ``*/`` and ``/*`` become ``* /`` and
    ``/ *``, so nothing in a comment can end it early (a ``//`` line or a ``/* */`` block) or
    become code.

    >>> comment("1/sqrt(d) */ x")
    '1/sqrt(d) * / x'
    """
    out = []
    for ch in str(text):
        if ch in _COMMENT_MAP:
            out.append(_COMMENT_MAP[ch])
        elif _COMMENT_OK.fullmatch(ch):
            out.append(ch)
        else:
            out.append("?")
    text = "".join(out)
    while "*/" in text or "/*" in text:
        text = text.replace("*/", "* /").replace("/*", "/ *")
    if "\n" in text or "\r" in text:  # unreachable by construction; kept as the last guard
        raise CodegenError("a comment would hold a line break")
    return Code(text)


def comment_lines(lines: Iterable[str], prefix: str = "// ") -> Code:
    """Several comment lines, each sanitised by :func:`comment` and prefixed with ``//``."""
    return Code("\n".join((prefix + comment(line)).rstrip() for line in lines))


def _finalize(value):
    if isinstance(value, Code):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return c_int(value)
    if isinstance(value, float):
        return c_float(value)
    if isinstance(value, str) and (is_name(value) or value.strip(" ") == ""):
        return value  # an identifier, or indentation
    raise CodegenError(f"template value {value!r} cannot reach CUDA: only checked identifiers, numbers "
                       "and napkin-built expressions are allowed")


def code_join(items, sep: str = "") -> Code:
    """Join napkin-built pieces (the template's own separator between them) into Code; every
    piece passes the same whitelist as a ``{{ }}`` value."""
    return Code(str(sep).join(_finalize(i) for i in items))


def _rendered(text) -> Code:
    """Text a template's own macro rendered: every value in it already passed :func:`_finalize`
    (the row-wise template renders its row loop twice, once a grid)."""
    return Code(str(text))


@lru_cache(maxsize=None)
def environment():
    """The Jinja environment over the package templates (StrictUndefined, whitelist finalize)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("napkin.codegen", "templates"),
        undefined=jinja2.StrictUndefined,
        finalize=_finalize,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["join"] = code_join  # the built-in join would turn checked pieces into plain text
    env.filters["ident"] = ident
    env.filters["c_float"] = c_float
    env.filters["c_int"] = c_int
    env.filters["c_i64"] = c_i64
    env.filters["cuda_type"] = cuda_type
    env.filters["comment"] = comment
    env.filters["rendered"] = _rendered
    env.globals["map_expr"] = map_expr
    return env


def render(template: str, **context) -> str:
    """Render the package template ``template`` with ``context`` (whitelisted values only)."""
    import jinja2

    try:
        return environment().get_template(template).render(**context)
    except jinja2.TemplateNotFound:
        raise CodegenError(f"no code template {template!r}; have {', '.join(template_names())}") from None
    except jinja2.UndefinedError as e:
        raise CodegenError(f"template {template}: {e}") from None


def render_string(source: str, **context) -> str:
    """Render a template given as text, through the same whitelist (for tests and tools)."""
    import jinja2

    try:
        return environment().from_string(source).render(**context)
    except jinja2.UndefinedError as e:
        raise CodegenError(f"template: {e}") from None


def template_names() -> list[str]:
    """Every template file in the package."""
    return sorted(environment().list_templates(extensions=["jinja"]))
