"""The baselines a user would otherwise pick, each built from the same inputs as napkin's kernel.

Every baseline is a callable taking the diagram's input tensors positionally, in
``diagram.inputs`` order and layout (the layout napkin's compiled kernel takes), and returning the
first output in napkin's layout — so the suite can time them on the same rotated argument sets and
compare their results with napkin's.

| family    | baselines |
|-----------|-----------|
| matmul    | ``cublas``: ``torch.matmul`` |
| mlp       | ``eager``: ``F.gelu(F.linear(X, W, bias))`` (unfused); ``compile``: ``torch.compile`` of it |
| rowwise   | ``eager``: ``torch.softmax`` / ``F.layer_norm`` / ``F.rms_norm``; ``compile``: ``torch.compile`` of it |
| composed  | ``eager``: napkin's PyTorch reference of the diagram, run eagerly in the diagram's dtype (the
              PyTorch a user would write box by box); ``compile``: ``torch.compile`` of it |
| attention | ``sdpa_flash``, ``sdpa_cudnn``, ``sdpa_efficient``: ``F.scaled_dot_product_attention`` under
              ``torch.nn.attention.sdpa_kernel`` with one backend each (a backend that refuses the case
              is skipped with its reason); ``flex``: ``torch.compile(flex_attention)`` with the mask as a
              block mask and the other modifiers as a score_mod; ``reference_compiled``: ``torch.compile``
              of napkin's PyTorch reference |

Building a baseline never runs it; :meth:`Baseline.probe` runs it once and turns a refusal into a
reason. torch is imported only inside the functions.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

__all__ = [
    "Baseline",
    "AttentionSpec",
    "attention_spec",
    "family_of",
    "baselines_for",
    "matmul_baselines",
    "mlp_baselines",
    "rowwise_baselines",
    "composed_baselines",
    "attention_baselines",
    "reference_compiled",
    "traceable_reference",
    "sdpa_reference",
    "SDPA_BACKENDS",
]

#: SDPA backends timed separately: baseline name -> torch.nn.attention.SDPBackend member.
SDPA_BACKENDS = {
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
}

_LIBRARY_FAMILY = {
    "matmul": "matmul", "batched_matmul": "matmul", "matmul_t": "matmul",
    "mlp": "mlp",
    "softmax": "rowwise", "layernorm": "rowwise", "rmsnorm": "rowwise",
    "attention": "attention", "mha": "attention", "attention_causal": "attention", "gqa": "attention",
    "attention_window": "attention", "attention_alibi": "attention", "attention_softcap": "attention",
}


@dataclass
class Baseline:
    """One baseline: a callable on napkin's inputs, or the reason it cannot run."""

    name: str
    fn: Callable | None
    skipped: str | None = None
    note: str = ""
    refusal_errors: tuple = field(default=(), repr=False)  # exception types that mean "refused", not "failed"

    @property
    def available(self) -> bool:
        return self.fn is not None and self.skipped is None

    def __call__(self, *args):
        if self.fn is None:
            raise RuntimeError(f"baseline {self.name} is skipped: {self.skipped}")
        return self.fn(*args)

    def probe(self, *args) -> tuple[str | None, Any]:
        """Run once (this also compiles). Returns ``(None, output)``, or ``(reason, None)`` when
        the baseline refused the case (then :attr:`skipped` is set); other errors propagate."""
        if not self.available:
            return self.skipped, None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out = self.fn(*args)
            except self.refusal_errors as e:  # type: ignore[misc]
                notes = "; ".join(dict.fromkeys(_short(str(w.message)) for w in caught))
                self.skipped = _short(f"{type(e).__name__}: {e}") + (f" [{notes}]" if notes else "")
                return self.skipped, None
        return None, out


def _short(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def family_of(diagram) -> str:
    """The benchmark family of a diagram: matmul, mlp, rowwise or attention when the diagram is
    exactly that one template shape (their baselines are cuBLAS, F.linear, F.layer_norm, SDPA),
    else ``composed`` (baselines: its own PyTorch reference, eager and compiled)."""
    from ..diagrams import library

    name = getattr(diagram, "name", str(diagram))
    if name in _LIBRARY_FAMILY:
        return _LIBRARY_FAMILY[name]
    if name in library.names() and library.entry(name).family in ("composed", "block"):
        return "composed"
    kinds = [v.op.kind for v in diagram.nodes]
    fns = sorted(getattr(v.op, "fn", "") for v in diagram.nodes if v.op.kind == "map")
    n_in = len(diagram.inputs)
    if kinds.count("contract") == 2 and kinds.count("softmax") == 1 and n_in == 3 \
            and set(kinds) <= {"contract", "softmax", "map"}:
        return "attention"
    if kinds == ["contract"] and n_in == 2:
        return "matmul"
    if sorted(kinds) == ["contract", "map", "map"] and fns == ["add", "gelu"] and n_in == 3:
        return "mlp"
    if "contract" not in kinds and kinds.count("softmax") + kinds.count("norm") == 1 \
            and set(kinds) <= {"softmax", "norm", "map"}:
        return "rowwise"
    return "composed"


def _compile(fn: Callable, backend: str | None, **kw) -> Callable:
    import torch

    if backend is None:
        return torch.compile(fn, **kw)
    return torch.compile(fn, backend=backend, **kw)


# ----------------------------------------------------------------------------- matmul


def matmul_baselines(diagram, **_) -> list[Baseline]:
    """cuBLAS through ``torch.matmul`` (transposed operands as views, no copies)."""
    import torch

    name = diagram.name
    ins = diagram.inputs
    if name in ("matmul", "batched_matmul"):
        fn = torch.matmul
    elif name == "matmul_t":
        def fn(A, B):
            return torch.matmul(A, B.mT)
    else:
        contract = [v for v in diagram.nodes if v.op.kind == "contract"]
        if len(contract) != 1 or len(ins) != 2:
            return [Baseline("cublas", None, skipped=f"no cuBLAS mapping for diagram {name!r}")]
        spec = _einsum_spec(diagram, contract[0])

        def fn(A, B):
            return torch.einsum(spec, A, B)
    return [Baseline("cublas", fn, note="torch.matmul (cuBLAS)")]


def _einsum_spec(diagram, v) -> str:
    letters: dict[str, str] = {}
    pool = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    for x in v.args:
        for n in x.axis_names:
            letters.setdefault(n, next(pool))
    ins = ",".join("".join(letters[n] for n in x.axis_names) for x in v.args)
    return ins + "->" + "".join(letters[n] for n in v.axis_names)


# ----------------------------------------------------------------------------- mlp


def mlp_baselines(diagram, *, compile: bool = True, compile_backend: str | None = None, **_) -> list[Baseline]:
    """Y = gelu(X·Wᵀ + bias): eager (F.linear, whose bias is cuBLAS's epilogue, then F.gelu) and
    torch.compile of the same function."""
    import torch.nn.functional as F

    names = [v.name for v in diagram.inputs]
    if names != ["X", "W", "bias"] or [v.axis_names for v in diagram.inputs] != [("a", "b"), ("c", "b"), ("c",)]:
        return [Baseline("eager", None, skipped=f"no F.linear mapping for inputs {names}")]

    def mlp(X, W, bias):
        return F.gelu(F.linear(X, W, bias))

    out = [Baseline("eager", mlp, note="F.linear + F.gelu (unfused)")]
    if compile:
        out.append(Baseline("compile", _compile(mlp, compile_backend), note="torch.compile(F.linear + F.gelu)"))
    return out


# ----------------------------------------------------------------------------- row-wise


def _norm_op(diagram):
    for v in diagram.nodes:
        if v.op.kind in ("norm", "softmax"):
            return v
    return None


def rowwise_baselines(diagram, *, compile: bool = True, compile_backend: str | None = None, **_) -> list[Baseline]:
    """torch.softmax / F.layer_norm / F.rms_norm eager, and torch.compile of the same."""
    import torch
    import torch.nn.functional as F

    v = _norm_op(diagram)
    if v is None:
        return [Baseline("eager", None, skipped=f"no row-wise op in {diagram.name!r}")]
    X = diagram.inputs[0]
    over = v.op.over
    n = int(diagram.sizes[over])
    kind = diagram.name if diagram.name in ("softmax", "layernorm", "rmsnorm") else getattr(v.op, "how", v.op.kind)

    if kind == "softmax":
        dim = X.axis_names.index(over)

        def fn(X):
            return torch.softmax(X, dim=dim)
        note = "torch.softmax"
    else:
        if X.axis_names[-1] != over:
            return [Baseline("eager", None, skipped=f"{kind} over a non-last axis {over!r}")]
        eps = float(v.op.eps)
        if kind == "layernorm":
            def fn(X, gamma, beta):
                return F.layer_norm(X, (n,), gamma, beta, eps=eps)
            note = "F.layer_norm"
        elif kind == "rmsnorm":
            if not hasattr(F, "rms_norm"):
                return [Baseline("eager", None, skipped=f"F.rms_norm is not in torch {torch.__version__}")]

            def fn(X, gamma):
                return F.rms_norm(X, (n,), gamma, eps=eps)
            note = "F.rms_norm"
        else:
            return [Baseline("eager", None, skipped=f"no torch op for {kind!r}")]
    out = [Baseline("eager", fn, note=note)]
    if compile:
        out.append(Baseline("compile", _compile(fn, compile_backend), note=f"torch.compile({note})"))
    return out


# ----------------------------------------------------------------------------- attention


@dataclass(frozen=True)
class AttentionSpec:
    """What SDPA/FlexAttention need to know about an attention diagram."""

    heads: tuple[int, ...]          # K/V head axes' sizes
    extra: tuple[int, ...]          # query-only head axes (GQA's j)
    q: int
    x: int
    d: int
    dv: int
    scale: float
    mods: tuple[tuple[str, tuple[float, ...]], ...]  # score modifiers in diagram order: (fn, params)
    head_axis_sizes: dict = field(default_factory=dict)

    @property
    def hq(self) -> int:
        return math.prod(self.heads) * math.prod(self.extra)

    @property
    def hkv(self) -> int:
        return math.prod(self.heads)

    @property
    def gqa(self) -> bool:
        return self.hq != self.hkv

    def mod(self, fn: str) -> tuple[float, ...] | None:
        for f, p in self.mods:
            if f == fn:
                return p
        return None

    @property
    def is_causal(self) -> bool:
        c = self.mod("causal")
        return c is not None and c[0] == 0

    @property
    def window(self) -> int | None:
        w = self.mod("sliding_window")
        return None if w is None else int(w[0])


def attention_spec(diagram) -> AttentionSpec:
    """Read Q[*heads, *extra, q, d], K/V[*heads, x, d], the scale and the score modifiers off a
    (bound) attention diagram; DiagramError-free ValueError if it is not one."""
    ins = {v.name: v for v in diagram.inputs}
    if not {"Q", "K", "V"} <= set(ins) or len(ins) != 3:
        raise ValueError(f"{diagram.name!r} is not an attention diagram with inputs Q, K, V")
    Q, K, V = ins["Q"], ins["K"], ins["V"]
    qn, kn, vn = Q.axis_names, K.axis_names, V.axis_names
    if qn[-2:] != ("q", "d") or kn[-2:] != ("x", "d") or vn[-2] != "x" or kn[:-2] != vn[:-2]:
        raise ValueError(f"{diagram.name!r}: expected Q[..,q,d], K[..,x,d], V[..,x,dv]; got {qn}, {kn}, {vn}")
    heads = kn[:-2]
    if qn[: len(heads)] != heads:
        raise ValueError(f"{diagram.name!r}: Q's leading axes {qn[:-2]} do not start with K's {heads}")
    extra = qn[len(heads):-2]
    sizes = diagram.sizes
    for n, s in sizes.items():
        if not isinstance(s, int):
            raise ValueError(f"{diagram.name!r}: axis {n!r} is unbound; bind sizes first")
    scale = None
    mods = []
    for v in diagram.nodes:
        if v.op.kind != "map":
            continue
        fn = v.op.fn
        if fn == "scale" and scale is None:
            scale = float(v.op.param_values(sizes)[0])
        elif fn in ("causal", "sliding_window", "alibi", "softcap"):
            mods.append((fn, tuple(v.op.param_values(sizes))))
            if fn == "alibi" and v.op.index_axes[0] != heads[0]:
                raise ValueError(f"{diagram.name!r}: ALiBi over axis {v.op.index_axes[0]!r}, not the first head axis")
        else:
            raise ValueError(f"{diagram.name!r}: score modifier {fn!r} has no SDPA/Flex equivalent here")
    d = sizes["d"]
    return AttentionSpec(
        heads=tuple(sizes[n] for n in heads), extra=tuple(sizes[n] for n in extra), q=sizes["q"], x=sizes["x"],
        d=d, dv=sizes[vn[-1]], scale=scale if scale is not None else 1.0, mods=tuple(mods),
        head_axis_sizes={n: sizes[n] for n in (*heads, *extra)},
    )


def _alibi_slopes(spec: AttentionSpec, device):
    """Per flattened query head: 2^(−8(h+1)/H) for its index h on the first head axis."""
    import torch

    H = spec.heads[0]
    per = spec.hq // H
    h = torch.arange(spec.hq, device=device) // per
    return torch.exp2(-8.0 * (h.to(torch.float32) + 1) / H)


def _to4(spec: AttentionSpec, Q, K, V):
    return (Q.reshape(1, spec.hq, spec.q, spec.d), K.reshape(1, spec.hkv, spec.x, spec.d),
            V.reshape(1, spec.hkv, spec.x, spec.dv))


def _out_shape(spec: AttentionSpec) -> tuple[int, ...]:
    return (*spec.heads, *spec.extra, spec.q, spec.dv)


def _sdpa_mask(spec: AttentionSpec, device, dtype, max_mask_bytes: int):
    """(attn_mask, is_causal, reason): a dense mask where SDPA has no flag for the modifiers."""
    import torch

    if spec.mod("softcap") is not None:
        return None, False, "SDPA cannot soft-cap the logits"
    c = spec.mod("causal")
    if c is not None and c[0] != 0:
        return None, False, f"causal offset {c[0]} is not SDPA's top-left is_causal"
    if spec.mod("alibi") is None and spec.window is None:
        return None, spec.is_causal, None
    per_head = spec.mod("alibi") is not None
    nbytes = (spec.hq if per_head else 1) * spec.q * spec.x * (torch.finfo(dtype).bits // 8 if per_head else 1)
    if nbytes > max_mask_bytes:
        return None, False, (f"SDPA needs a dense {nbytes / 2**30:.1f} GiB mask for "
                             f"{'ALiBi' if per_head else 'the sliding window'} (limit {max_mask_bytes / 2**30:.1f} GiB)")
    qi = torch.arange(spec.q, device=device)[:, None]
    xi = torch.arange(spec.x, device=device)[None, :]
    keep = torch.ones(spec.q, spec.x, dtype=torch.bool, device=device)
    if spec.is_causal:
        keep &= xi <= qi
    if spec.window is not None:
        keep &= (xi <= qi) & (xi > qi - spec.window)
    if not per_head:
        return keep, False, None
    slopes = _alibi_slopes(spec, device).view(1, spec.hq, 1, 1)
    bias = -(slopes * (qi - xi).abs().to(torch.float32))
    bias = bias.masked_fill(~keep, float("-inf")).to(dtype)
    return bias, False, None


def _sdpa_fn(spec: AttentionSpec, backend_name: str | None, mask, is_causal: bool):
    import torch.nn.functional as F

    kw: dict[str, Any] = {"scale": spec.scale}
    if spec.gqa:
        kw["enable_gqa"] = True
    shape = _out_shape(spec)
    if backend_name is None:
        def run(Q, K, V):
            q4, k4, v4 = _to4(spec, Q, K, V)
            return F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, is_causal=is_causal, **kw).reshape(shape)
        return run
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)

    def run(Q, K, V):
        q4, k4, v4 = _to4(spec, Q, K, V)
        with sdpa_kernel([backend]):
            o = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, is_causal=is_causal, **kw)
        return o.reshape(shape)
    return run


def sdpa_reference(diagram) -> Callable:
    """SDPA with no backend forced (runs on a CPU too): the cross-check used in tests."""
    spec = attention_spec(diagram)
    import torch

    mask, causal, reason = _sdpa_mask(spec, "cpu", torch.float32, 1 << 40)
    if reason:
        raise ValueError(reason)

    def run(Q, K, V):
        m = mask.to(Q.device) if mask is not None else None
        if m is not None and m.dtype != torch.bool:
            m = m.to(Q.dtype)
        return _sdpa_fn(spec, None, m, causal)(Q, K, V)
    return run


def _flex_mods(spec: AttentionSpec, device):
    """(score_mod or None, mask_mod or None) for FlexAttention, modifiers applied in diagram order
    (FlexAttention's ``score`` is already scaled, as napkin's S_scaled)."""
    import torch

    steps = []
    masks = []
    for fn, p in spec.mods:
        if fn == "softcap":
            cap = float(p[0])
            steps.append(lambda s, b, h, qi, ki, cap=cap: cap * torch.tanh(s / cap))
        elif fn == "alibi":
            slopes = _alibi_slopes(spec, device)
            steps.append(lambda s, b, h, qi, ki, sl=slopes: s - sl[h] * (qi - ki).abs())
        elif fn == "causal":
            off = int(p[0])
            masks.append(lambda b, h, qi, ki, off=off: ki <= qi + off)
        elif fn == "sliding_window":
            w = int(p[0])
            masks.append(lambda b, h, qi, ki, w=w: (ki <= qi) & (ki > qi - w))
    score_mod = None
    if steps:
        def score_mod(score, b, h, q_idx, kv_idx):
            for f in steps:
                score = f(score, b, h, q_idx, kv_idx)
            return score
    mask_mod = None
    if masks:
        def mask_mod(b, h, q_idx, kv_idx):
            keep = masks[0](b, h, q_idx, kv_idx)
            for m in masks[1:]:
                keep = keep & m(b, h, q_idx, kv_idx)
            return keep
    return score_mod, mask_mod


def flex_baseline(diagram, *, device="cuda", compile_backend: str | None = None) -> Baseline:
    """``torch.compile(flex_attention)`` with the masks as a block mask (so masked-out blocks are
    skipped) and softcap/ALiBi as a score_mod."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as e:
        return Baseline("flex", None, skipped=f"FlexAttention is not available: {e}")
    spec = attention_spec(diagram)
    score_mod, mask_mod = _flex_mods(spec, device)
    block_mask = None
    if mask_mod is not None:
        block_mask = create_block_mask(mask_mod, 1, None, spec.q, spec.x, device=device)
    flex = _compile(flex_attention, compile_backend, dynamic=False)
    kw: dict[str, Any] = {"scale": spec.scale}
    if spec.gqa:
        kw["enable_gqa"] = True
    shape = _out_shape(spec)

    def run(Q, K, V):
        q4, k4, v4 = _to4(spec, Q, K, V)
        return flex(q4, k4, v4, score_mod=score_mod, block_mask=block_mask, **kw).reshape(shape)

    return Baseline("flex", run, note="torch.compile(flex_attention)" + (" + block mask" if block_mask is not None else ""))


def attention_baselines(diagram, *, compile: bool = True, compile_backend: str | None = None,
                        device: str = "cuda", max_mask_bytes: int = 1 << 30,
                        backends: Sequence[str] = tuple(SDPA_BACKENDS), **_) -> list[Baseline]:
    """SDPA with each backend forced separately, FlexAttention compiled, the compiled reference."""
    import torch

    try:
        spec = attention_spec(diagram)
    except ValueError as e:
        return [Baseline(n, None, skipped=str(e)) for n in backends]
    dtype = _torch_dtype(next(iter(diagram.dtypes)))
    out: list[Baseline] = []
    mask, causal, reason = _sdpa_mask(spec, device, dtype, max_mask_bytes)
    for name in backends:
        if reason:
            out.append(Baseline(name, None, skipped=reason))
            continue
        if not hasattr(torch.nn.attention, "SDPBackend") or not hasattr(torch.nn.attention.SDPBackend,
                                                                          SDPA_BACKENDS[name]):
            out.append(Baseline(name, None, skipped=f"torch {torch.__version__} has no SDPBackend.{SDPA_BACKENDS[name]}"))
            continue
        if spec.gqa and "enable_gqa" not in _sdpa_params():
            out.append(Baseline(name, None, skipped=f"torch {torch.__version__} SDPA has no enable_gqa"))
            continue
        out.append(Baseline(name, _sdpa_fn(spec, SDPA_BACKENDS[name], mask, causal),
                            note=f"F.scaled_dot_product_attention, sdpa_kernel([{SDPA_BACKENDS[name]}])",
                            refusal_errors=(RuntimeError,)))
    if compile:
        try:
            out.append(flex_baseline(diagram, device=device, compile_backend=compile_backend))
        except Exception as e:  # building the block mask can fail on exotic cases
            out.append(Baseline("flex", None, skipped=_short(f"{type(e).__name__}: {e}")))
        out.append(reference_compiled(diagram, compile_backend=compile_backend))
    return out


def _sdpa_params() -> set[str]:
    import inspect

    import torch.nn.functional as F

    try:
        return set(inspect.signature(F.scaled_dot_product_attention).parameters)
    except (TypeError, ValueError):  # a builtin without a signature: assume a recent torch
        return {"enable_gqa", "scale"}


def _torch_dtype(name: str):
    from ..dtypes import torch_dtype

    return torch_dtype(name)


# ----------------------------------------------------------------------------- the reference


def traceable_reference(diagram) -> Callable:
    """napkin's PyTorch reference of a bound diagram as a function of its input tensors (in
    ``diagram.inputs`` order) returning the first output, with everything that is not tensor work
    (the box order, sympy parameters, index sizes) worked out once, outside the function, so that
    torch.compile traces it as one graph. Each box runs by the reference's own rules
    (:mod:`napkin.diagrams.reference`)."""
    from ..diagrams.functions import ArrayOps, get_function
    from ..diagrams.ops import Map
    from ..diagrams.reference import _run_box, align, index_grids

    sizes = diagram.sizes
    for n, sz in sizes.items():
        if not isinstance(sz, int):
            raise ValueError(f"{diagram.name!r}: axis {n!r} is unbound; bind sizes first")
    ops = ArrayOps("torch")
    pos = {id(v): i for i, v in enumerate(diagram.inputs)}
    for k, v in enumerate(diagram.nodes):
        pos[id(v)] = len(diagram.inputs) + k
    steps: list[Callable] = []
    for v in diagram.nodes:
        idx = tuple(pos[id(a)] for a in v.args)
        if isinstance(v.op, Map):
            f = get_function(v.op.fn)
            params = tuple(v.op.param_values(sizes))
            arg_axes = tuple(a.axis_names for a in v.args)
            names = v.axis_names
            n_idx = [v.axis(a).bound_size for a in v.op.index_axes]
            shape = tuple(a.bound_size for a in v.axes)

            def step(env, v=v, f=f, idx=idx, params=params, arg_axes=arg_axes, names=names, n_idx=n_idx,
                     shape=shape):
                args = [env[i] for i in idx]
                xs = [align(t, have, names) for t, have in zip(args, arg_axes)]
                grids = index_grids(v, v.op.index_axes, xs[0])
                return f.impl(ops, xs, params, grids, n_idx).expand(shape).to(args[0].dtype)  # a tuple: also 0 axes
        else:
            def step(env, v=v, idx=idx):
                return _run_box(v, [env[i] for i in idx], ops, sizes)
        steps.append(step)
    out_i = pos[id(diagram.outputs[0])]

    def reference(*inputs):
        env = list(inputs)
        for step in steps:
            env.append(step(env))
        return env[out_i]

    return reference


def reference_compiled(diagram, *, compile_backend: str | None = None) -> Baseline:
    """``torch.compile`` of napkin's PyTorch reference of the diagram (first output)."""
    try:
        ref = traceable_reference(diagram)
    except Exception as e:
        return Baseline("reference_compiled", None, skipped=_short(f"{type(e).__name__}: {e}"))
    return Baseline("reference_compiled", _compile(ref, compile_backend), note="torch.compile(diagram.reference)")


def composed_baselines(diagram, *, compile: bool = True, compile_backend: str | None = None, **_) -> list[Baseline]:
    """Any diagram (a composed library entry, a user's file): its PyTorch reference run eagerly
    (``eager``) and under ``torch.compile`` (``compile``), first output, in the diagram's dtype."""
    try:
        ref = traceable_reference(diagram)
    except Exception as e:
        reason = _short(f"{type(e).__name__}: {e}")
        return [Baseline("eager", None, skipped=reason), Baseline("compile", None, skipped=reason)]
    out = [Baseline("eager", ref, note="the diagram's PyTorch reference, eager, box by box")]
    if compile:
        out.append(Baseline("compile", _compile(ref, compile_backend),
                            note="torch.compile of the diagram's PyTorch reference"))
    return out


# ----------------------------------------------------------------------------- dispatch


_BUILDERS = {
    "matmul": matmul_baselines,
    "mlp": mlp_baselines,
    "rowwise": rowwise_baselines,
    "attention": attention_baselines,
    "composed": composed_baselines,
}


def baselines_for(diagram, *, family: str | None = None, compile: bool = True, compile_backend: str | None = None,
                  device: str = "cuda", **kw) -> list[Baseline]:
    """The baselines of a bound diagram's family (see the module table).

    ``compile=False`` leaves out every torch.compile baseline (fast, for smoke runs);
    ``compile_backend`` passes a backend to torch.compile (``"eager"`` in CPU tests).
    """
    fam = family or family_of(diagram)
    builder = _BUILDERS.get(fam)
    if builder is None:
        return [reference_compiled(diagram, compile_backend=compile_backend)] if compile else []
    return builder(diagram, compile=compile, compile_backend=compile_backend, device=device, **kw)
