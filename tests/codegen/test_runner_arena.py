"""The buffers between a program's kernels share one allocation a call (``_Runner``'s arena).

``arena_layout`` is checked on any machine: every buffer starts on a 256-byte boundary, none
overlaps the next, and the arena holds them all; so is the runner's choice of buffers (a fake
torch): an arena of at most ``KEPT_ARENA_BYTES`` kept per stream, a larger one made per call, a
call being captured into a CUDA graph given fresh buffers that are not kept. The ``gpu`` tests run multi-kernel programs
(a transformer block at sizes that are no tile multiples, so its intermediates have odd byte
counts, in bf16 and fp32) through the checked path (NaN-poisoned ``out`` tensors, against the
float64 reference rounded at the kernels' boundaries) and through the fast path (positional
inputs, and every input by name), and hold that the two give the same bits, call after call.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from napkin.codegen.api import ARENA_ALIGN, arena_layout
from napkin.errors import LaunchError


@given(st.lists(st.integers(min_value=0, max_value=10_000_000), max_size=40))
def test_arena_layout_aligns_and_never_overlaps(sizes):
    offsets, total = arena_layout(sizes)
    assert len(offsets) == len(sizes)
    for i, (off, n) in enumerate(zip(offsets, sizes)):
        assert off % ARENA_ALIGN == 0
        end = offsets[i + 1] if i + 1 < len(offsets) else total
        assert off + n <= end  # this buffer ends before the next begins
    assert total == sum(-(-n // ARENA_ALIGN) * ARENA_ALIGN for n in sizes)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_gpu_programs_with_buffers_in_one_arena(dtype):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from napkin.codegen import compile as napkin_compile
    from napkin.codegen.verify import verify_compiled
    from napkin.diagrams import library
    from napkin.diagrams.reference import random_inputs

    d = library.get("transformer_block").with_dtype(dtype).bind(q=77, e=72, h=2, d=64, f=136)
    k = napkin_compile(d)
    assert len(k.program.launches) > 2 and [b for b in k.program.buffers if not b.zeroed]
    rows = verify_compiled(k)
    assert all(r.ok for r in rows), rows
    for seed in (1, 2):
        ins = random_inputs(d, device="cuda", seed=seed)
        args = [ins[n] for n in d.input_names]
        checked = k.empty_outputs("cuda", float("nan"))
        k(*args, out=checked)  # out given: the checked path
        for _ in range(3):
            fast = k(*args)  # positional, no out: the fast path after the first call
            fast = fast if isinstance(fast, tuple) else (fast,)
            for n, f in zip(k.output_names, fast):
                c = checked[n]
                assert torch.equal(f.view(torch.uint8), c.view(torch.uint8)), (dtype, seed, n)
        # every input by name, no out: the fast path too (the checked path would raise here)
        k._call_checked = _refuse
        try:
            named = k(**{n: ins[n] for n in reversed(d.input_names)})
        finally:
            del k._call_checked
        named = named if isinstance(named, tuple) else (named,)
        for n, f in zip(k.output_names, named):
            assert torch.equal(f.view(torch.uint8), checked[n].view(torch.uint8)), (dtype, seed, n)
    # a name that is not an input still gets the checked path's message
    with pytest.raises(LaunchError, match="has no input 'nope'"):
        k(**{**{n: ins[n] for n in d.input_names[1:]}, "nope": ins[d.input_names[0]]})


def _refuse(*args, **kwargs):
    raise AssertionError("the checked path ran for inputs the fast path takes")


def test_inputs_given_by_name_are_put_in_order_only_when_every_one_is():
    from napkin.codegen.api import CompiledDiagram

    cd = object.__new__(CompiledDiagram)
    cd._input_order = ("A", "B")
    assert cd._by_position((), {"B": 2, "A": 1}) == (1, 2)
    assert cd._by_position((1,), {"B": 2}) is None      # some by position: the checked path binds
    assert cd._by_position((), {"A": 1}) is None         # one missing: the checked path names it
    assert cd._by_position((), {"A": 1, "C": 3}) is None  # one unknown: the same


@pytest.mark.gpu
def test_gpu_kept_buffers_are_per_stream_and_a_captured_graph_gets_its_own():
    """The arena (a transformer block's intermediates) and the arrival counters (a column sum's
    split) are kept per stream; calls on a side stream get their own; a call captured into a
    CUDA graph gets fresh ones, so the graph's replays and eager calls between them, on the
    stream whose buffers were kept, never share a buffer."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from napkin.codegen import compile as napkin_compile
    from napkin.diagrams import library
    from napkin.diagrams.reference import random_inputs

    block = library.get("transformer_block").with_dtype("fp32").bind(q=77, e=72, h=2, d=64, f=136)
    colsum = library.get("column_sum").with_dtype("fp32").bind(r=3000, x=520)
    for d, kept in ((block, "_arenas"), (colsum, "_zeroed")):
        k = napkin_compile(d)
        ins = [random_inputs(d, device="cuda", seed=s) for s in (1, 2, 3)]
        args = [[i[n] for n in d.input_names] for i in ins]

        def first(out):
            return out[0] if isinstance(out, tuple) else out

        expect = [first(k(*a)).clone() for a in args]  # the default stream's kept buffers
        runner = k._runners[torch.cuda.current_device()]
        assert (runner.arena_bytes if kept == "_arenas" else runner.zero_specs), d.name
        assert len(getattr(runner, kept)) == 1, d.name
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            got = first(k(*args[1]))  # warm-up on the side stream, as graph capture asks
        torch.cuda.current_stream().wait_stream(side)
        assert torch.equal(got, expect[1]) and len(getattr(runner, kept)) == 2, d.name
        static = [t.clone() for t in args[0]]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = first(k(*static))
        assert len(getattr(runner, kept)) == 2, d.name  # the capture's buffers are not kept
        for i in (2, 1, 0):
            for s, t in zip(static, args[i]):
                s.copy_(t)
            graph.replay()
            between = first(k(*args[(i + 1) % 3]))  # an eager call right after, on the default stream
            assert torch.equal(static_out, expect[i]), (d.name, i)
            assert torch.equal(between, expect[(i + 1) % 3]), (d.name, i)
        assert len(getattr(runner, kept)) == 2, d.name


class _FakeTensor:
    _next = 0x1000

    def __init__(self, nbytes):
        self.ptr = _FakeTensor._next
        _FakeTensor._next += -(-max(1, nbytes) // 256) * 256

    def data_ptr(self):
        return self.ptr


class _FakeTorch:
    """torch.empty / torch.zeros / uint8, enough for the runner's buffers on a CPU."""

    uint8 = "uint8"

    def __init__(self):
        self.made = 0

    def empty(self, n, dtype=None, device=None):
        self.made += 1
        return _FakeTensor(n)

    def zeros(self, shape, dtype=None, device=None):
        self.made += 1
        return _FakeTensor(4)


def _runner(arena_bytes, zero_specs=(), capturing=False):
    from napkin.codegen.api import _Runner

    r = object.__new__(_Runner)
    r._torch, r._tdevice, r.device = _FakeTorch(), "cuda:0", 0
    r.arena_bytes, r.buf_offsets, r.zero_specs = arena_bytes, (0, 256), tuple(zero_specs)
    r._arenas, r._zeroed = {}, {}
    current = [7]  # the current stream's handle, as the test sets it
    r._stream = lambda device: current[0]
    r._capturing = lambda: capturing
    seen = []
    r.launches = (lambda ptrs, stream: seen.append((list(ptrs), stream)),)
    return r, seen, current


def test_a_small_arena_is_kept_per_stream_and_a_large_one_made_per_call():
    from napkin.codegen.api import KEPT_ARENA_BYTES

    r, seen, current = _runner(512)
    r._launch([1, 2])
    r._launch([1, 2])
    assert seen[0][0] == seen[1][0] and seen[0][0][:2] == [1, 2] and r._torch.made == 1
    assert seen[0][0][3] - seen[0][0][2] == 256  # the second buffer at its offset
    current[0] = 8  # another stream: an arena of its own
    r._launch([1, 2])
    assert seen[2][0][2] != seen[0][0][2] and r._torch.made == 2 and set(r._arenas) == {7, 8}
    big, seen, _ = _runner(KEPT_ARENA_BYTES + 1)
    big._launch([1])
    big._launch([1])
    assert big._torch.made == 2 and not big._arenas and seen[0][0][1] != seen[1][0][1]


def test_a_captured_call_gets_fresh_buffers_that_are_not_kept():
    r, seen, _ = _runner(512, zero_specs=[((4,), "int32")], capturing=True)
    r._launch([1])
    r._launch([1])
    assert not r._arenas and not r._zeroed and r._torch.made == 4  # an arena and a counter, twice
    assert seen[0][0][1:] != seen[1][0][1:] and len(seen[0][0]) == 1 + 2 + 1
