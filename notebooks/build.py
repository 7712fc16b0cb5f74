#!/usr/bin/env python3
"""The notebooks' source of truth: every notebook is a list of cells written here.

    python3 notebooks/build.py             # write notebooks/*.ipynb (no outputs)
    python3 notebooks/build.py --execute   # write them and run them top to bottom, saving the outputs
    python3 notebooks/build.py --check     # exit 1 if a committed notebook's cells differ from this file
    python3 notebooks/build.py --execute 03 04   # only the notebooks whose names start so

Edit the cells here, never the .ipynb files: reviewing a Python list of cells is easier than
reviewing notebook JSON, and ``--check`` (run by ``tests/test_notebooks.py``) keeps the two in step.
Every number a notebook shows is computed by napkin in the notebook; the ``assert`` statements pin
the paper's values (docs/architecture.md §4), so a notebook fails when the model drifts.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent


def md(text: str):
    return new_markdown_cell(textwrap.dedent(text).strip("\n"))


def code(text: str):
    return new_code_cell(textwrap.dedent(text).strip("\n"))


# ----------------------------------------------------------------------------- shared set-up

SETUP = code('''
    # Set-up shared by the notebooks: import napkin from this checkout, and three display helpers.
    import sys, math, pathlib
    for _p in (pathlib.Path.cwd().resolve(), *pathlib.Path.cwd().resolve().parents):
        if (_p / "napkin" / "__init__.py").is_file():        # the repository root
            sys.path.insert(0, str(_p)) if str(_p) not in sys.path else None
            break
    import sympy
    import matplotlib.pyplot as plt
    from IPython.display import SVG, Markdown, display
    from napkin.diagrams import library
    from napkin.diagrams.render import render_svg
    from napkin.perfmodel.view import level_colors, relabel_labels, pseudocode
    %matplotlib inline
    %config InlineBackend.figure_formats = ["png"]
    plt.rcParams.update({"figure.figsize": (7.5, 4.2), "figure.dpi": 90, "axes.grid": True, "grid.alpha": 0.3})


    def show(schedule_or_diagram, title=None, relabels=None):
        """Draw a diagram, or a schedule's diagram with wires coloured by memory level (napkin's
        level_colors: HBM between kernels, SMEM tiles, RF intermediates) and relabelled axes (g_q, s_x)."""
        if hasattr(schedule_or_diagram, "kernels"):
            s = schedule_or_diagram
            svg = render_svg(s.diagram, wire_colors=level_colors(s), relabels={**relabel_labels(s), **(relabels or {})},
                             title=title)
        else:
            svg = render_svg(schedule_or_diagram, title=title)
        display(SVG(svg))


    def table(header, rows):
        """A Markdown table (rendered by Jupyter and by code hosts)."""
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
        display(Markdown("\\n".join(lines)))


    def tex(expr):
        return f"${sympy.latex(expr)}$"
''')


# ----------------------------------------------------------------------------- 01 matmul

def nb_matmul():
    return [
        md('''
            # 01 · Matrix multiplication on a napkin

            The method of *FlashAttention on a Napkin* (Abbott & Zardini, TMLR 2025) in four moves, on
            the smallest example that shows all of them:

            1. **draw** the operation as a neural circuit diagram;
            2. **relabel** its axes: *group* (tile) the axes the operation is woven over, *stream* the
               axis it contracts;
            3. **colour** every array by the memory level it lives in;
            4. **count**: the transfer cost H is the size of everything that changes colour, the memory
               M the most that is resident at once; minimise H under the capacity M.

            napkin does every step by program; this notebook shows each result and checks it against
            the closed forms of the paper (docs/architecture.md §4.3).
        '''),
        SETUP,
        md('''
            ## 1. Draw

            `C[a,c] = Σ_b A[a,b]·B[b,c]`: a dot product over `b` (the box's own axis, which ends at
            the box) woven over `a` and `c` (which pass along it). Sizes stay symbolic.
        '''),
        code('''
            mm = library.get("matmul")
            print(mm)
            show(mm)
            a, b, c = (library.symbol(n) for n in "abc")
        '''),
        md('''
            ## 2. One block holds everything

            With no relabelling the whole problem is one block: every input is read once and the
            output written once, `H = ab + bc + ac`, but the block must hold all of it,
            `M = ab + bc + ac`. That is the floor no schedule can beat, at a memory no SM has.
        '''),
        code('''
            from napkin.perfmodel.schedule import Schedule
            from napkin.perfmodel.cost import cost

            whole = cost(Schedule.fused(mm, gpu=None))
            display(Markdown(f"H = {tex(whole.H('L2'))}, M = {tex(whole.M('SMEM'))}"))
            assert sympy.expand(whole.H("L2") - (a*b + b*c + a*c)) == 0
        '''),
        md('''
            ## 3. Group `a` and `c`, stream `b`, colour the levels

            Grouping `a` into groups of `g_a` and `c` into `g_c` gives `ac/(g_a g_c)` blocks, one per
            `g_a × g_c` tile of C. Streaming `b` in chunks of `s_b` walks the contraction with an
            accumulator (a running sum), so a block holds only one chunk of A and of B. Grouping `b`
            is refused: the box contracts it.

            Colours: the tiles a block loads and the C tile it accumulates live in **SMEM** (blue);
            intermediates kept in registers would be **RF** (green, notebook 02). Each input wire
            changes colour from HBM to SMEM once per block that loads it.
        '''),
        code('''
            tiled = Schedule.fused(mm, groups={"a": None, "c": None}, streams={"b": None}, gpu=None)
            print(tiled)
            show(tiled, title="matmul: a, c grouped, b streamed")
        '''),
        md('''
            ## 4. H and M, symbolically

            Per block, the loads are `g_a·b` of A, `b·g_c` of B, and the store `g_a·g_c` of C; times the
            `ac/(g_a g_c)` blocks:
            `H = abc(1/g_a + 1/g_c) + ac`. A block holds its C tile and one chunk of A and B:
            `M = g_a g_c + s_b(g_a + g_c)`.
        '''),
        code('''
            ct = cost(tiled)
            g_a, g_c, s_b = (sympy.Symbol(n, integer=True, positive=True) for n in ("g_a", "g_c", "s_b"))
            H, M = ct.H("L2"), ct.M("SMEM")
            table(["", "napkin's cost model"], [
                ["blocks", tex(ct.groups)],
                ["H per block", tex(ct.levels["L2"].H_per_group_elements)],
                ["H (all blocks)", tex(H)],
                ["M per block", tex(M)],
                ["FLOPs", tex(ct.total_flops)],
            ])
            assert sympy.simplify(H - (a*b*c*(1/g_a + 1/g_c) + a*c)) == 0
            assert sympy.expand(M - (g_a*g_c + s_b*(g_a + g_c))) == 0
        '''),
        md('''
            ## 5. The optimum: `H* = 2abc/√M + ac`

            Minimise H under the memory budget `M`. The stream chunk only costs memory, so at the
            optimum `s_b → 0`; H and M are symmetric in `g_a, g_c`, so the tiles are square,
            `g_a = g_c = √M`. napkin writes the result in the paper's canonical form
            `H* = Σ_t α_t M^(−β_t)`: a term with β = ½ that memory reduces and a compulsory term
            (β = 0) it cannot.
        '''),
        code('''
            from napkin.perfmodel.canonical import canonical_form_of, MEMORY

            form = canonical_form_of(ct)
            print(form)
            print("optimal tiles:", form.tiles)
            assert sympy.simplify(form.expr - (2*a*b*c/sympy.sqrt(MEMORY) + a*c)) == 0
            assert form.betas == (0, sympy.Rational(1, 2))
            assert all(sympy.simplify(t - sympy.sqrt(MEMORY)) == 0 for t in form.tiles.values())
        '''),
        md('''
            ### What it means on an H100

            Take a 4096³ matmul in bf16 and let one block use all the shared memory a block may have.
            FLOPs per value moved from HBM is `2abc / H* ≈ √M`; the tensor cores need about 590.7
            (notebook 03) to stay busy, so a matmul fed from SMEM alone is memory-bound on H100. That
            is why M must reach the `681 KB` of notebook 03, which only L2 reuse provides.
        '''),
        code('''
            from napkin.perfmodel.hardware import get_gpu
            from napkin.perfmodel.occupancy import compute_bound_thresholds
            from napkin.dtypes import dtype

            h100 = get_gpu("h100")
            sizes = library.entry("matmul").default_sizes
            at_sizes = {library.symbol(k): v for k, v in sizes.items()}
            q = dtype("bf16").bytes
            M_smem = h100.level("SMEM").per_block_bytes / q              # values per block
            H_star = float(form(M_smem).subs(at_sizes))
            H_floor = float(whole.H("L2").subs(at_sizes))
            flops = 2 * sizes["a"] * sizes["b"] * sizes["c"]
            thr = compute_bound_thresholds(h100, "bf16")
            table(["quantity", "value"], [
                ["sizes", ", ".join(f"{k} = {v}" for k, v in sizes.items())],
                ["SMEM per block", f"{M_smem:,.0f} values ({h100.level('SMEM').per_block_bytes / 1024:.0f} KiB)"],
                ["optimal square tile √M", f"{math.sqrt(M_smem):.1f}"],
                ["H* at that M", f"{H_star:.4g} values = {H_star * q / 1e9:.3f} GB"],
                ["floor ab + bc + ac", f"{H_floor:.4g} values ({H_star / H_floor:.1f}× less than H*)"],
                ["FLOP per value moved", f"{flops / H_star:.1f} (compute-bound above {thr.flops_per_value:.1f})"],
                ["M needed to be compute-bound", f"{thr.matmul_min_memory_kib:.0f} KiB"],
            ])
            assert flops / H_star < thr.flops_per_value        # SMEM alone cannot feed H100's tensor cores
        '''),
        md('''
            ## 6. H against M and against the tile size

            napkin's numeric cost of square tiles `g × g` (stream `s_b = 32`) at 4096³, next to the
            optimum curve `H*(M)`. Larger tiles cut traffic as `1/g` until the tile reaches the axis
            (`g = 4096`: the floor `ab + bc + ac`); the hardware check refuses tiles over the SMEM a
            block may use (red).
        '''),
        code('''
            from napkin.perfmodel.legality import check_schedule
            from napkin.errors import ScheduleError

            s_b_val = 32
            rows = []
            for g in [16, 32, 64, 128, 192, 256, 384, 512, 1024, 2048, 4096]:
                s = Schedule.fused(mm, groups={"a": g, "c": g}, streams={"b": s_b_val})
                cn = cost(s, False, sizes=sizes, l2_caching=False)
                try:
                    check_schedule(s, h100, sizes=sizes)
                    fits = True
                except ScheduleError:
                    fits = False
                rows.append((g, cn.M("SMEM"), cn.H("L2"), fits))

            Ms = [r[1] for r in rows]
            curve_M = [10 ** (2 + 0.05 * i) for i in range(121) if 10 ** (2 + 0.05 * i) <= max(Ms)]
            curve_H = [float(form(m).subs(at_sizes)) for m in curve_M]
            fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
            ax1.loglog(curve_M, curve_H, "-", color="0.6", label="H*(M) = 2abc/√M + ac")
            for g, m, h_, fits in rows:
                ax1.loglog(m, h_, "o", color="tab:green" if fits else "tab:red")
            ax1.axhline(H_floor, ls=":", color="k", label="floor ab + bc + ac")
            ax1.axvline(M_smem, ls="--", color="tab:blue", label="H100 SMEM per block (bf16)")
            ax1.axvline(thr.matmul_min_memory_values, ls="--", color="tab:purple", label="compute-bound from here")
            ax1.set_xlabel("M: values resident per block"); ax1.set_ylabel("H: values moved"); ax1.legend(fontsize=8)
            ax1.set_title("transfers against memory (4096³)")
            ax2.loglog([r[0] for r in rows], [r[2] for r in rows], "-", color="0.6")
            for g, m, h_, fits in rows:
                ax2.loglog(g, h_, "o", color="tab:green" if fits else "tab:red")
            ax2.axhline(H_floor, ls=":", color="k")
            ax2.set_xlabel("square tile g = g_a = g_c"); ax2.set_ylabel("H: values moved")
            ax2.set_title("green: fits an H100 block, red: refused")
            plt.tight_layout(); plt.show()
            assert rows[-1][2] == H_floor                     # g = a = c: every input read once
            assert all(r1[2] > r2[2] for r1, r2 in zip(rows, rows[1:]))
        '''),
        md('''
            ## 7. Run it: the interpreter counts what moves

            The CPU interpreter runs a schedule the way a kernel would (a loop over blocks, an inner
            loop over stream chunks with a real accumulator), on random numbers, and counts every
            element that crosses the block boundary. Sizes are small and deliberately not multiples of
            every tile: a partial last block moves only its real elements, so the formula uses
            `⌈n/g⌉`. The counts must equal the formula, the model's numeric cost, and C must equal A·B.
        '''),
        code('''
            import numpy as np
            from napkin.perfmodel.interpreter import interpret

            small = dict(a=96, b=80, c=72)
            rng = np.random.default_rng(0)
            A_, B_ = rng.standard_normal((small["a"], small["b"])), rng.standard_normal((small["b"], small["c"]))
            ceil = lambda n, g: -(-n // g)
            rows = []
            for g_a_, g_c_, s_b_ in [(16, 16, 16), (32, 24, 8), (40, 16, 24), (96, 72, 80)]:
                s = Schedule.fused(mm.bind(**small), groups={"a": g_a_, "c": g_c_}, streams={"b": s_b_}, gpu=None)
                run = interpret(s, {"A": A_, "B": B_})
                model = cost(s, l2_caching=False)
                formula = (small["a"] * small["b"] * ceil(small["c"], g_c_)
                           + small["b"] * small["c"] * ceil(small["a"], g_a_) + small["a"] * small["c"])
                err = float(np.abs(run.outputs["C"] - A_ @ B_).max())
                rows.append([f"{g_a_}×{g_c_}, s_b={s_b_}", formula, model.H("L2"), run.transfers["L2"],
                             model.M("SMEM"), run.memory_peak["SMEM"], f"{err:.1e}"])
                assert run.transfers["L2"] == model.H("L2") == formula
                assert run.memory_peak["SMEM"] == model.M("SMEM")
                assert err < 1e-9
            table(["tiles", "formula H", "model H", "interpreter H", "model M", "interpreter M", "max |C − A·B|"], rows)
        '''),
        md('''
            ## 8. What the method refuses

            Grouping the contracted axis `b` would split every dot product across blocks with no one
            to add the pieces: napkin refuses it and says why.
        '''),
        code('''
            try:
                cost(Schedule.fused(mm, groups={"b": None}, gpu=None))
                raise AssertionError("grouping b should have been refused")
            except ScheduleError as e:
                print("ScheduleError:", e)
        '''),
    ]


# ----------------------------------------------------------------------------- 02 attention

def nb_attention():
    return [
        md('''
            # 02 · FlashAttention, derived step by step

            Attention `O = softmax_x(Q·Kᵀ/√d)·V` for one head, `Q[q,d]`, `K,V[x,d]`. Starting from the
            naive algorithm (three kernels, the scores through HBM) napkin applies the paper's moves one
            at a time — **fuse** the scores and probabilities into one kernel, **group** the query axis,
            **stream** the key axis with the online softmax — and after each step shows the coloured
            diagram and the transfer cost H and memory M it reads off. The end point is FlashAttention:
            `H = 2qd + 2xdq/g_q`, `M = 2d(g_q + s_x)`, and the optimum `H* = 2qd + 4xqd²/M`.
        '''),
        SETUP,
        code('''
            from napkin.perfmodel.schedule import Schedule, Relabel
            from napkin.perfmodel.cost import cost
            from napkin.perfmodel.canonical import canonical_form_of, MEMORY
            from napkin.errors import ScheduleError

            att = library.get("attention")
            print(att)
            show(att)
            q, x, d = (library.symbol(n) for n in "qxd")
            g_q, s_x = (sympy.Symbol(n, integer=True, positive=True) for n in ("g_q", "s_x"))


            def step(schedule, title):
                """Draw a schedule and print the H and M napkin reads off it."""
                show(schedule, title=title)
                c = cost(schedule)
                table(["kernels", "H (values moved to and from HBM)", "M (values per block, SMEM)", "M (RF)"],
                      [[" · ".join("+".join(k.boxes) for k in schedule.kernels), tex(c.H("L2")),
                        tex(c.M("SMEM")), tex(c.M("RF"))]])
                return c
        '''),
        md('''
            ## Step 0 · naive: one kernel per box

            S (with its scale), the softmax P and the output O each run as their own kernel. S and P are
            written to HBM and read back (red wires): `4qx` values on top of reading Q, K, V and writing
            O once. M is the whole problem.
        '''),
        code('''
            naive = Schedule.unfused(att, gpu=None)
            c0 = step(naive, "step 0: unfused, S and P through HBM")
            assert sympy.expand(c0.H("L2") - (2*q*d + 2*x*d + 4*q*x)) == 0
        '''),
        md('''
            ## Step 1 · fuse S, P and O into one kernel

            In one kernel S and P never leave the chip: the `4qx` term is gone, `H = 2qd + 2xd` (every
            input read once, the output written once). The price is memory: one block holds Q, K, V and
            a whole `q × x` score matrix in registers.
        '''),
        code('''
            fused = Schedule.fused(att, gpu=None)
            c1 = step(fused, "step 1: fused")
            assert sympy.expand(c1.H("L2") - (2*q*d + 2*x*d)) == 0
            assert sympy.expand(c0.H("L2") - c1.H("L2") - 4*q*x) == 0
        '''),
        md('''
            ## Step 2 · group the query axis

            Every box is woven over `q`, so `q` can be partitioned into `q/g_q` groups, one block each.
            K and V lack `q`, so every block reloads them: the K/V traffic becomes `2xd·q/g_q`. M drops
            to one group's rows, but K, V and `g_q × x` scores still have to fit.
        '''),
        code('''
            grouped = Schedule.fused(att, groups={"q": None}, gpu=None)
            c2 = step(grouped, "step 2: q grouped")
            assert sympy.simplify(c2.H("L2") - (2*q*d + 2*x*d*q/g_q)) == 0
        '''),
        md('''
            ## Step 3 · stream the key axis with the online softmax

            Streaming `x` in chunks of `s_x` keeps only one chunk of K and V on chip. The traffic is the
            same (streaming cuts memory, not the traffic of the streamed input), and M becomes
            `2d(g_q + s_x)` per block: this is FlashAttention. It is legal because the softmax is
            followed by a contraction over the same axis (next section).
        '''),
        code('''
            flash = Schedule.fused(att, groups={"q": None}, streams={"x": None}, gpu=None)
            c3 = step(flash, "step 3: q grouped, x streamed (FlashAttention)")
            assert sympy.simplify(c3.H("L2") - (2*q*d + 2*x*d*q/g_q)) == 0
            assert sympy.expand(c3.M("SMEM") - 2*d*(g_q + s_x)) == 0

            form = canonical_form_of(c3)
            print(form)
            assert sympy.simplify(form.expr - (2*q*d + 4*x*q*d**2/MEMORY)) == 0
            assert form.betas == (0, 1)
        '''),
        md('''
            napkin writes the schedule as the loop nest a kernel runs:
        '''),
        code('''
            print(pseudocode(flash))
        '''),
        md('''
            The optimum has β = 1 (matmul had ½): doubling the memory halves attention's K/V traffic.

            ## Why a softmax alone cannot be streamed

            Streaming needs an accumulator `B` with `B(f(x), y) = f(x ⊕ y)`. A softmax's first output
            element depends on the whole row (its normaliser), so no prefix of the output can be
            emitted: napkin refuses the stream and says why.
        '''),
        code('''
            try:
                cost(Schedule.fused(library.get("softmax"), streams={"x": None}, gpu=None))
                raise AssertionError("streaming a lone softmax should have been refused")
            except ScheduleError as e:
                print("ScheduleError:", e)
        '''),
        md('''
            Followed by a contraction over the same axis it is streamable: the state is a running max
            μ, a running sum z and a running output o, and each chunk rescales them by
            `exp(μ_old − μ_new)`. Here is that accumulator on its own, chunk by chunk, against the
            whole-row softmax:
        '''),
        code('''
            import numpy as np

            rng = np.random.default_rng(0)
            row, V_ = rng.standard_normal(200) * 4, rng.standard_normal((200, 8))
            mu, z, o = -np.inf, 0.0, np.zeros(8)
            for i in range(0, 200, 64):                          # chunks of s_x = 64 (the last is partial)
                s = row[i:i + 64]
                mu_new = max(mu, s.max())
                scale = np.exp(mu - mu_new)                      # rescale the old state
                p = np.exp(s - mu_new)
                z, o, mu = z * scale + p.sum(), o * scale + p @ V_[i:i + 64], mu_new
            whole = np.exp(row - row.max()) / np.exp(row - row.max()).sum() @ V_
            print("max |streamed − whole| =", np.abs(o / z - whole).max())
            assert np.allclose(o / z, whole, atol=1e-12)
        '''),
        md('''
            napkin's interpreter runs the whole FlashAttention schedule that way (blocks of `g_q` rows,
            chunks of `s_x` keys, online softmax) and counts what crosses HBM; sizes are not multiples of
            the tiles on purpose.
        '''),
        code('''
            from napkin.perfmodel.interpreter import interpret

            small = dict(q=100, x=150, d=16)
            ceil = lambda n, g: -(-n // g)
            rows = []
            for gq, sx in [(16, 16), (32, 64), (100, 150)]:
                s = Schedule.fused(att.bind(**small), groups={"q": gq}, streams={"x": sx}, gpu=None)
                run = interpret(s, seed=1)
                Q_, K_, Vv = (run.arrays[n] for n in "QKV")
                S_ = Q_ @ K_.T / math.sqrt(small["d"])
                P_ = np.exp(S_ - S_.max(1, keepdims=True)); P_ /= P_.sum(1, keepdims=True)
                err = float(np.abs(run.outputs["O"] - P_ @ Vv).max())
                formula = 2 * small["q"] * small["d"] + 2 * small["x"] * small["d"] * ceil(small["q"], gq)
                model = cost(s, l2_caching=False)
                rows.append([f"g_q={gq}, s_x={sx}", formula, model.H("L2"), run.transfers["L2"],
                             model.M("SMEM"), run.memory_peak["SMEM"], f"{err:.1e}"])
                assert run.transfers["L2"] == model.H("L2") == formula
                assert run.memory_peak["SMEM"] == model.M("SMEM")
                assert err < 1e-9
            table(["tiles", "formula 2qd + 2xd⌈q/g_q⌉", "model H", "interpreter H", "model M",
                   "interpreter M", "max |O − reference|"], rows)
        '''),
        md('''
            ## Multi-head attention and GQA

            Multi-head attention is the same diagram woven over heads `h`. Grouping `h` in groups of one
            (a block per head and query group) multiplies H by `h` and leaves M per block unchanged.
        '''),
        code('''
            mha = library.get("mha")
            h, j = library.symbol("h"), library.symbol("j")
            c_mha = step(Schedule.fused(mha, groups={"h": 1, "q": None}, streams={"x": None}, gpu=None),
                         "multi-head attention")
            assert sympy.simplify(c_mha.H("L2") - h * c3.H("L2")) == 0
            assert sympy.expand(c_mha.M("SMEM") - c3.M("SMEM")) == 0
        '''),
        md('''
            Grouped-query attention (here causal) has `h` K/V heads, each shared by `j` query heads:
            `Q[h,j,q,d]`, `K,V[h,x,d]`. With one query head per block, every query head reloads its
            shared K/V. Grouping `j` as well puts `g_j` query heads that share K/V in one block, and the
            K/V traffic falls by `g_j`. That matters when `q` is short: in decoding, `q = 1` caps `g_q`
            at 1 and only `g_j` can give reuse.
        '''),
        code('''
            gqa = library.get("gqa")
            g_j = sympy.Symbol("g_j", integer=True, positive=True)
            c_one = step(Schedule.fused(gqa, groups={"h": 1, "j": 1, "q": None}, streams={"x": None}, gpu=None),
                         "GQA, one query head per block")
            c_shared = step(Schedule.fused(gqa, groups={"h": 1, "j": None, "q": None}, streams={"x": None}, gpu=None),
                            "GQA, g_j query heads per block")
            kv_one = c_one.H("L2") - 2*d*h*j*q
            kv_shared = c_shared.H("L2") - 2*d*h*j*q
            assert sympy.simplify(kv_one / kv_shared - g_j) == 0

            # Decoding: one new token attends to every cached key, so the decoding diagram has no mask
            # (the library's causal GQA aligns the mask top-left, right for prefill, not for one token).
            from napkin.diagrams import Axis, Diagram, array
            from napkin.diagrams.library import attention_core
            ax = {n: Axis(n) for n in "hjqxd"}
            gqa_decode = Diagram("gqa_decode", attention_core(
                array("Q", ax["h"], ax["j"], ax["q"], ax["d"]), array("K", ax["h"], ax["x"], ax["d"]),
                array("V", ax["h"], ax["x"], ax["d"])))
            decode = dict(h=8, j=4, q=1, x=8192, d=128)              # one new token, 8 K/V heads shared by 4
            rows = []
            for gj in (1, decode["j"]):
                s = Schedule.fused(gqa_decode, groups={"h": 1, "j": gj, "q": 1}, streams={"x": 64}, gpu=None)
                rows.append([f"g_j = {gj}", f"{cost(s, sizes=decode, l2_caching=False).H('L2'):,}"])
            table(["decoding, " + ", ".join(f"{k}={v}" for k, v in decode.items()), "H (values)"], rows)
        '''),
        md('''
            ## The `4qx` term at real sizes

            Multi-head attention at the library's default sizes, bf16, on an H100, with the same tiles
            (`g_q = 128, s_x = 64`, a block per head) for the fused and the unfused algorithm. The unfused
            softmax kernel holds whole rows, so it takes 4 rows per block (its HBM traffic does not
            depend on that). Blocks fetch tiles through L2, and blocks running at the same time share
            what they fetch (notebook 03), so DRAM sees less than the blocks load. The roofline turns
            bytes and FLOPs into time.
        '''),
        code('''
            from napkin.perfmodel.hardware import get_gpu
            from napkin.perfmodel.legality import check_schedule
            from napkin.perfmodel.roofline import predict

            h100 = get_gpu("h100")
            sizes = library.entry("mha").default_sizes
            tiles = dict(groups={"h": 1, "q": 128}, streams={"x": 64})
            fused_s = Schedule.fused(mha, **tiles)
            naive_s = Schedule.unfused(mha, **tiles)
            naive_s = naive_s.replace(kernels=tuple(
                k.replace(relabels=(Relabel("h", 1), Relabel("q", 4))) if k.name == "P" else k
                for k in naive_s.kernels))
            for s in (fused_s, naive_s):
                check_schedule(s, h100, sizes=sizes)                 # both legal on an H100

            rows, res = [], {}
            for name, s in (("unfused", naive_s), ("fused (FlashAttention)", fused_s)):
                cn = cost(s, h100, sizes=sizes)                      # with L2 reuse between concurrent blocks
                p = predict(h100, cn.to_work("bf16"))
                res[name] = (cn, p)
                rows.append([name, len(s.kernels), f"{cn.H_bytes('L2') / 1e9:.3f} GB", f"{cn.H_bytes('HBM') / 1e9:.3f} GB",
                             f"{cn.total_flops / 1e9:.1f} GFLOP", f"{p.seconds * 1e6:.0f} µs", p.bound, f"{p.tflops:.0f} TFLOP/s"])
            table(["algorithm", "kernels", "block traffic H[L2]", "DRAM traffic H[HBM]", "FLOPs", "predicted time",
                   "bound", "rate"], rows)

            (cu, pu), (cf, pf) = res["unfused"], res["fused (FlashAttention)"]
            four_qx = 4 * sizes["h"] * sizes["q"] * sizes["x"]
            print(f"difference: {cu.H('L2') - cf.H('L2'):,} values = 4·h·q·x = {four_qx:,}; "
                  f"predicted speed-up {pu.seconds / pf.seconds:.1f}×")
            assert cu.H("L2") - cf.H("L2") == four_qx
            assert pf.seconds < pu.seconds
        '''),
        md('''
            Against sequence length (`q = x = N`, the same heads and head size): the unfused algorithm's
            `4qx` grows as `N²` and keeps it HBM-bound; the fused one's K/V traffic is shared through L2, so
            its FLOPs per byte grow with `N` until the tensor cores, not HBM, set the time.
        '''),
        code('''
            Ns = [512, 1024, 2048, 4096, 8192, 16384, 32768]
            curves = {"unfused": [], "fused": []}
            times = {"unfused": [], "fused": []}
            for N in Ns:
                sz = dict(sizes, q=N, x=N)
                for name, s in (("unfused", naive_s), ("fused", fused_s)):
                    cn = cost(s, h100, sizes=sz)
                    curves[name].append(cn.H_bytes("HBM"))
                    times[name].append(predict(h100, cn.to_work("bf16")).seconds)
            fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
            for name in curves:
                ax1.loglog(Ns, curves[name], "o-", label=name)
                ax2.loglog(Ns, [t * 1e3 for t in times[name]], "o-", label=name)
            ax1.set_xlabel("sequence length N"); ax1.set_ylabel("DRAM bytes H[HBM]"); ax1.legend(); ax1.set_title("transfers")
            ax2.set_xlabel("sequence length N"); ax2.set_ylabel("predicted ms on H100"); ax2.legend(); ax2.set_title("roofline time")
            plt.tight_layout(); plt.show()
        '''),
        md('''
            ## The same derivation, by program

            `derive` searches what can run — the partitions into kernels and the configurations napkin's
            families build, ranked by the model — and narrates its plan as the same steps (docs/architecture.md §5–6).
        '''),
        code('''
            from napkin.codegen.planner import derive

            der = derive(mha, "h100", sizes=sizes)
            print(der)
            assert [st.title for st in der.steps] == ["naive", "fuse", "group", "stream"]
            best = {r.axis: r.kind for r in der.best.kernels[0].relabels}
            assert best.get("q") == "group" and best.get("x") == "stream" and len(der.best.kernels) == 1
            show(der.best, title="derived on H100")
        '''),
    ]


# ----------------------------------------------------------------------------- 03 hardware

def nb_hardware():
    return [
        md('''
            # 03 · Hardware, levels and quantisation

            The cost of notebook 01 and 02 is in values moved; time needs the hardware. This notebook
            puts the three GPU profiles napkin ships side by side, derives the compute-bound thresholds
            (docs/architecture.md §4.4), weights several memory levels by their speed (§4.3), and follows the canonical
            form to three consequences: lower precision (the `q^(1+β)` law), L2 caching and clusters.
        '''),
        SETUP,
        md('''
            ## A100, H100, H200 side by side

            The profiles are datasheet values (a `calibrate` step overrides them with measurements).
        '''),
        code('''
            from napkin.perfmodel.hardware import get_gpu
            from napkin.perfmodel.occupancy import compute_bound_thresholds

            gpus = [get_gpu(n) for n in ("a100", "h100", "h200")]
            KiB, rows = 1024, []
            spec = [
                ("architecture", lambda g: g.arch),
                ("SMs", lambda g: g.sms),
                ("clock (GHz)", lambda g: f"{g.clock_hz / 1e9:.2f}"),
                ("fp16/bf16 tensor TFLOP/s", lambda g: f"{g.tensor_rate('fp16') / 1e12:.1f}"),
                ("fp8 tensor TFLOP/s", lambda g: f"{g.tensor_rate('fp8') / 1e12:.1f}" if "fp8" in g.tensor_flops else "—"),
                ("fp32 CUDA-core TFLOP/s", lambda g: f"{g.cuda_core_rate('fp32') / 1e12:.1f}"),
                ("HBM TB/s", lambda g: f"{g.hbm_bandwidth / 1e12:.3f}"),
                ("L2 (MiB)", lambda g: f"{g.level('L2').capacity_bytes / KiB**2:.0f}"),
                ("SMEM per SM / per block (KiB)", lambda g: f"{g.level('SMEM').capacity_bytes / KiB:.0f} / {g.level('SMEM').per_block_bytes / KiB:.0f}"),
                ("registers per SM (KiB)", lambda g: f"{g.regs_per_sm_bytes / KiB:.0f}"),
                ("SFU ops/clk/SM", lambda g: f"{g.sfu_ops_per_clk_per_sm:g}"),
                ("wgmma / TMA", lambda g: f"{'yes' if g.has_wgmma else 'no'} / {'yes' if g.has_tma else 'no'}"),
            ]
            table(["", *(g.name for g in gpus)], [[k, *(f(g) for g in gpus)] for k, f in spec])
        '''),
        md('''
            ## Compute-bound thresholds

            A kernel is compute-bound when it does more FLOPs per value it moves from HBM than the
            tensor cores do per value HBM delivers: `tensor FLOP/s ÷ (HBM bytes/s ÷ bytes per value)`.
            On an H100 in fp16 that is 989.4 TFLOP/s over 1.675e12 values/s = **590.7 FLOP per value**.

            - A matmul does `2b` FLOPs per output value, so its contraction axis needs `b ≥ 295`.
            - Attention does `4 g_q s_x d` FLOPs per `2 s_x d` values of K and V: `g_q ≥ 295`.
            - Square matmul tiles `g × g` do `2g²s_b` FLOPs per `2g s_b` values: `g ≥ 590.7`, so a
              block must hold `M ≈ g²` values, **681 KiB** in fp16 — more than the SMEM any block
              may have. Only L2 reuse gets a matmul there (below).
        '''),
        code('''
            rows = []
            for g in gpus:
                t = compute_bound_thresholds(g, "fp16")
                rows.append([g.name, f"{t.hbm_values_per_s / 1e12:.3f}e12", f"{t.flops_per_value:.1f}",
                             f"{t.matmul_min_contraction:.0f}", f"{t.attention_min_g_q:.0f}", f"{t.matmul_min_memory_kib:.0f}"])
            table(["GPU (fp16)", "HBM values/s", "FLOP per value", "matmul b ≥", "attention g_q ≥", "matmul M ≥ (KiB)"], rows)

            t = compute_bound_thresholds(get_gpu("h100"), "fp16")
            assert round(t.flops_per_value, 1) == 590.7
            assert round(t.matmul_min_contraction) == 295 and round(t.attention_min_g_q) == 295
            assert round(t.matmul_min_memory_kib) == 681
        '''),
        md('''
            The H200 has the H100's compute and more bandwidth, so its threshold is lower: the same kernel
            is more often compute-bound there. fp8 doubles both the FLOP rate and the values HBM delivers
            per second, so its threshold per value equals fp16's:
        '''),
        code('''
            fig, ax = plt.subplots()
            width = 0.38
            for i, dt in enumerate(("fp16", "fp8")):
                have = [k for k, g in enumerate(gpus) if dt in g.tensor_flops]   # A100 has no fp8 tensor path
                vals = [compute_bound_thresholds(gpus[k], dt).flops_per_value for k in have]
                bars = ax.bar([k + (i - 0.5) * width for k in have], vals, width, label=dt)
                ax.bar_label(bars, fmt="%.0f", fontsize=8)
            ax.set_xticks(range(len(gpus)), [g.key for g in gpus]); ax.set_ylabel("FLOP per value moved from HBM")
            ax.set_title("compute-bound threshold"); ax.legend(); plt.show()
        '''),
        md('''
            ## Several levels, weighted by speed

            The canonical optimum `H*(M) = Σ_t α_t M^(−β_t)` holds for every level: traffic into a level
            depends on that level's memory. Weighting each level by the time per value moved into it
            gives the multi-level time

            `T = Σ_t α_t Σ_ℓ M_ℓ^(−β_t) / Ḣ_ℓ`

            (the top level, HBM, has unbounded memory and costs nothing). napkin takes `M_ℓ` and `Ḣ_ℓ`
            from the profile: L2 is fed by HBM, SMEM by L2, registers by SMEM. Below, the β > 0 terms of
            the matmul and of multi-head attention at the library's default sizes, in bf16.
        '''),
        code('''
            from napkin.perfmodel.schedule import Schedule
            from napkin.perfmodel.cost import cost
            from napkin.perfmodel.canonical import canonical_form_of, levels_from_gpu, multilevel_time

            def form_of(name, groups, streams):
                return canonical_form_of(cost(Schedule.fused(library.get(name), groups=groups, streams=streams, gpu=None)))

            forms = {
                "matmul": (form_of("matmul", {"a": None, "c": None}, {"b": None}), library.entry("matmul").default_sizes),
                "attention": (form_of("mha", {"h": 1, "q": None}, {"x": None}), library.entry("mha").default_sizes),
            }
            level_names = ("L2", "SMEM", "RF")
            per_level, rows = {}, []
            for op, (form, sz) in forms.items():
                terms = [(float(a_.subs({library.symbol(k): v for k, v in sz.items()})), b_) for a_, b_ in form.terms if b_ > 0]
                for g in gpus:
                    lv = levels_from_gpu(g, "bf16", names=level_names)
                    parts = {n: multilevel_time(terms, {n: lv[n]}) for n in level_names}
                    total = multilevel_time(terms, lv)
                    assert math.isclose(total, sum(parts.values()))
                    per_level[(op, g.key)] = parts
                    worst = max(parts, key=parts.get)
                    rows.append([op, g.key, *(f"{parts[n] * 1e6:.1f}" for n in level_names), f"{total * 1e6:.1f}", worst])
            table(["operation", "GPU", *(f"into {n} (µs)" for n in level_names), "total (µs)", "largest"], rows)
        '''),
        code('''
            fig, axes_ = plt.subplots(1, 2, figsize=(12, 4))
            for ax, op in zip(axes_, forms):
                bottom = [0.0] * len(gpus)
                for n in level_names:
                    vals = [per_level[(op, g.key)][n] * 1e6 for g in gpus]
                    ax.bar([g.key for g in gpus], vals, bottom=bottom, label=f"into {n}")
                    bottom = [b_ + v for b_, v in zip(bottom, vals)]
                ax.set_title(f"{op}: β-term time per level"); ax.set_ylabel("µs"); ax.legend()
            plt.tight_layout(); plt.show()
        '''),
        md('''
            ## Precision: the `q^(1+β)` law

            At `q` bytes per value a level holds `M_bytes/q` values and moves `Ḣ_bytes/q` values per
            second, so the β-term's time `α (M_bytes/q)^(−β) / (Ḣ_bytes/q)` scales as `q^(1+β)`. Halving
            the bytes speeds attention's term (β = 1) ×4 and matmul's (β = ½) ×2.83 — more than the ×2
            of moving half the bytes, because the same memory also holds twice the values.
        '''),
        code('''
            from napkin.perfmodel.canonical import quantization_speedup
            from napkin.dtypes import dtype

            h100 = get_gpu("h100")
            rows = []
            for op, (form, sz) in forms.items():
                beta = form.beta
                alpha = float(form.alpha(beta).subs({library.symbol(k): v for k, v in sz.items()}))
                M_bytes, rate_bytes = h100.level("SMEM").per_block_bytes, h100.bandwidth_into("SMEM")
                times = {}
                for dt in ("fp32", "fp16", "fp8"):
                    qb = dtype(dt).bytes
                    times[dt] = multilevel_time([(alpha, beta)], [(M_bytes / qb, rate_bytes / qb)])
                for lo, hi in (("fp32", "fp16"), ("fp16", "fp8")):
                    law = quantization_speedup(beta, lo, hi)
                    assert math.isclose(times[lo] / times[hi], law)
                    rows.append([op, f"β = {beta}", f"{lo} → {hi}", f"{times[lo] / times[hi]:.3f}", f"{law:.3f}"])
            table(["operation", "β", "precision", "time ratio from the cost", "q^(1+β)"], rows)

            assert quantization_speedup(1, "fp32", "fp16") == 4
            assert round(quantization_speedup(sympy.Rational(1, 2), "fp32", "fp16"), 2) == 2.83
        '''),
        md('''
            ## L2 caching

            The L2 is shared by all concurrently running blocks. For traffic from HBM it acts as if its
            memory were theirs combined, while it fits: blocks that run together and need the same tile
            of A or B fetch it from HBM once. napkin's cost model applies this to `H["HBM"]` (numeric
            sizes and a GPU): each grouped axis's group is enlarged by a factor `f_a` with `Π f_a ≤ P`,
            the number of block working sets that run at once and fit in L2. Below: the 8192³ matmul
            with 128 × 128 tiles.
        '''),
        code('''
            from napkin.perfmodel.canonical import l2_effective_memory

            mm = library.get("matmul")
            big = dict(a=8192, b=8192, c=8192)
            tiled = Schedule.fused(mm, groups={"a": 128, "c": 128}, streams={"b": 64})
            rows = []
            for g in gpus:
                cn = cost(tiled, g, sizes=big)
                k = cn.per_kernel[0]
                f_a, f_c = k.l2_split.get("a", 1), k.l2_split.get("c", 1)
                # the formula without L2, with each group enlarged by its factor (a partial last group rounds up)
                ceil = lambda n, g: -(-n // g)
                expect = (big["a"] * big["b"] * ceil(big["c"] // 128, f_c) * 1 + big["b"] * big["c"] * ceil(big["a"] // 128, f_a)
                          + big["a"] * big["c"])
                M_eff = l2_effective_memory(float(cn.M_bytes("SMEM")), k.concurrent_blocks, g.level("L2").capacity_bytes)
                rows.append([g.key, k.concurrent_blocks, f"{f_a} × {f_c}", f"{M_eff / 2**20:.1f} MiB",
                             f"{cn.H_bytes('L2') / 1e9:.1f} GB", f"{cn.H_bytes('HBM') / 1e9:.2f} GB",
                             f"{cn.H('L2') / cn.H('HBM'):.1f}×", f"{2 * big['a'] * big['b'] * big['c'] / cn.H('HBM'):.0f}"])
                assert math.isclose(cn.H("HBM"), expect, rel_tol=1e-9)
                assert cn.H("HBM") < cn.H("L2")
            table(["GPU", "concurrent blocks P", "group enlargement f_a × f_c", "effective memory",
                   "block traffic H[L2]", "HBM traffic H[HBM]", "saved", "FLOP per HBM value"], rows)
        '''),
        md('''
            With L2 reuse the FLOP per HBM value clears the thresholds above, which SMEM alone could not
            (notebook 01).

            ## Clusters

            On Hopper, the blocks of a thread-block cluster can read each other's shared memory. A level
            whose children exchange data directly is modelled as an extra level whose weight is the
            difference of the per-value costs: traffic into each SM is `H(M_SM)·c_peer +
            H(M_cluster)·(c_above − c_peer)`. With attention's β = 1 term and a cluster of `C` SMs
            (`M_cluster = C·M_SM`), the time relative to no cluster is `r + (1 − r)/C`, where
            `r = c_peer / c_above` — the peer rate is a hardware parameter the profile does not carry,
            so it is swept here.
        '''),
        code('''
            from napkin.perfmodel.canonical import cluster_level_weight

            form, sz = forms["attention"]
            alpha = float(form.alpha(1).subs({library.symbol(k): v for k, v in sz.items()}))
            M_sm = h100.level("SMEM").per_block_bytes / 2
            c_above = 2 / h100.bandwidth_into("SMEM")                      # seconds per bf16 value from L2
            base = multilevel_time([(alpha, 1)], [(M_sm, 1 / c_above)])
            rs = [i / 20 for i in range(21)]
            fig, ax = plt.subplots()
            for C in (2, 4, 8):
                rel = []
                for r in rs:
                    c_peer = r * c_above
                    w = cluster_level_weight(c_above, c_peer)
                    t = alpha * (M_sm ** -1 * c_peer + (C * M_sm) ** -1 * w)
                    rel.append(t / base)
                    assert math.isclose(t / base, r + (1 - r) / C)
                ax.plot(rs, rel, label=f"cluster of {C}")
            ax.set_xlabel("r = per-value cost from a peer SM ÷ from L2"); ax.set_ylabel("attention K/V time vs no cluster")
            ax.set_title("clusters as an extra level"); ax.legend(); plt.show()
            assert cluster_level_weight(c_above, c_above) == 0            # peers no cheaper: nothing gained
        '''),
    ]


# ----------------------------------------------------------------------------- 04 hopper

def nb_hopper():
    return [
        md('''
            # 04 · Hopper attention: from the diagram to 1.319 PFLOP/s

            The paper closes with a Hopper FlashAttention configuration worked out on a napkin: one
            warpgroup (128 threads) owns `w_q = 128` query rows, K and V stream in chunks of `s_x = 64`,
            `d = 128`, QK in fp8 and PV in fp16, K/V double-buffered. From that configuration alone
            napkin derives how many warpgroups fit on an SM, the resulting query group `g_q`, the time of
            one streaming step and the throughput (docs/architecture.md §4.4). Then the same accounting for Ampere.
        '''),
        SETUP,
        md('''
            ## The algorithm as a diagram

            Two levels of grouping: a block (one per SM) takes `g_q` query rows (SMEM), split into
            warpgroups of `w_q` rows (RF); `x` is streamed in chunks of `s_x`. Q, K, V and O tiles live in
            SMEM, the scores, probabilities and the O accumulator in registers.
        '''),
        code('''
            from napkin.perfmodel.hardware import get_gpu
            from napkin.perfmodel.occupancy import hopper_attention_analysis, ampere_attention_analysis
            from napkin.perfmodel.schedule import Schedule
            from napkin.perfmodel.cost import cost

            h100 = get_gpu("h100")
            an = hopper_attention_analysis(h100)               # w_q=128, s_x=64, d=128, fp8 QK, fp16 PV, 2 stages
            att = library.get("attention").bind(d=an.d)
            sched = Schedule.fused(att, groups={"q": an.g_q}, rf_groups={"q": an.w_q}, streams={"x": an.s_x})
            show(sched, title=f"Hopper attention: g_q={an.g_q} per block, w_q={an.w_q} per warpgroup, s_x={an.s_x}",
                 relabels={"q": f"g_q={an.g_q}/w_q={an.w_q}"})
        '''),
        md('''
            napkin's pseudocode of the schedule (the diagram is bf16 throughout, so its per-column
            memory is counted at 2 bytes per value), then the same loop annotated with the Hopper
            design's dtypes and instructions (every size taken from the analysis):
        '''),
        code('''
            print(pseudocode(sched))
        '''),
        code('''
            print(f"""\\
            for each block (one per SM, {an.units} warpgroups):           # q grouped: g_q = {an.units} × w_q = {an.g_q} rows
                warpgroup i loads its Q tile [w_q={an.w_q}, d={an.d}] ({an.qk_dtype})   -> SMEM
                o = 0 [w_q, d] (fp32), mu = -inf, z = 0 [w_q]                  -> registers
                for each chunk of s_x={an.s_x} keys:                             # x streamed, {an.stages} stages in flight
                    TMA: K chunk [s_x, d] ({an.qk_dtype}), V chunk [s_x, d] ({an.pv_dtype})   -> SMEM, shared by the warpgroups
                    S = Q K^T / sqrt(d)        wgmma, {an.qk_dtype}                # {an.flops_qk_per_step / an.units:,.0f} FLOP per warpgroup
                    mu' = max(mu, rowmax S);  P = exp(S - mu')  ({an.p_dtype}, SFU)
                    z = z exp(mu - mu') + rowsum P;  o = o exp(mu - mu') + P V   # wgmma, {an.pv_dtype}
                    mu = mu'
                O = o / z  -> SMEM (staging) -> HBM""")
        '''),
        md('''
            ## The resource table

            Per block (shared by its warpgroups): the K and V chunks, times the number of stages. Per
            warpgroup: its Q tile and the O staging tile in SMEM; in registers (per thread) the fp32 O
            accumulator, the P tile and the running max and sum.
        '''),
        code('''
            KiB = 1024
            table(["resource", "what", "amount"], [
                ["SMEM per block", f"K chunk s_x·d {an.qk_dtype} + V chunk s_x·d {an.pv_dtype}, × {an.stages} stages",
                 f"({an.smem_k_chunk_bytes / KiB:.0f} + {an.smem_v_chunk_bytes / KiB:.0f}) × {an.stages} = {an.smem_per_block_bytes / KiB:.0f} KiB"],
                ["SMEM per warpgroup", f"Q tile w_q·d {an.qk_dtype} + O staging w_q·d {an.pv_dtype}",
                 f"{an.smem_q_tile_bytes / KiB:.0f} + {an.smem_o_staging_bytes / KiB:.0f} = {an.smem_per_unit_bytes / KiB:.0f} KiB"],
                ["registers per thread", "O accumulator w_q·d/128 fp32 + P w_q·s_x/128 + max, sum",
                 f"{an.regs_o_acc} + {an.regs_p} + {an.regs_stats} = {an.regs_per_thread}"],
                ["registers per warpgroup", "× 4 B × 128 threads", f"{an.registers_per_unit_bytes:,} B = {an.registers_per_unit_bytes / 1000:.2f} KB"],
                ["SMEM a block may use", "H100 profile", f"{an.smem_capacity_bytes / KiB:.0f} KiB"],
                ["register file per SM", "H100 profile", f"{an.register_capacity_bytes / KiB:.0f} KiB"],
            ])
            assert an.smem_per_block_bytes == 48 * KiB and an.smem_per_unit_bytes == 48 * KiB
            assert an.regs_per_thread == 146 and an.registers_per_unit_bytes == 74_752
        '''),
        md('''
            ## Warpgroups per SM

            Warpgroups per SM = min over resources of (capacity − per-block use) ÷ per-warpgroup use:
            SMEM `(227 − 48)/48 = 3.7`, registers `256/74.75 = 3.4` (the paper divides KiB by decimal KB;
            with bytes on both sides the figure is a little higher, with the same floor). So **3 warpgroups**, `g_q = 384` —
            and 384 ≥ 295 is the attention threshold of notebook 03: the kernel can be compute-bound.
        '''),
        code('''
            from napkin.perfmodel.occupancy import compute_bound_thresholds

            print(an.occupancy)
            print(f"by SMEM {an.warpgroups_by_smem:.2f}, by registers {an.warpgroups_by_registers:.2f} "
                  f"({an.units_by_registers_bytes:.2f} in bytes) -> {an.warpgroups} warpgroups, g_q = {an.g_q}")
            assert round(an.warpgroups_by_smem, 1) == 3.7 and round(an.warpgroups_by_registers, 1) == 3.4
            assert an.warpgroups == 3 and an.g_q == 384
            assert an.g_q >= compute_bound_thresholds(h100, "fp16").attention_min_g_q

            # the block's SMEM in values (one stage) is exactly the M the cost model reads off the diagram
            M_model = cost(Schedule.fused(att, groups={"q": an.g_q}, streams={"x": an.s_x}), False,
                           sizes=dict(q=4096, x=4096)).M("SMEM")
            from napkin.dtypes import dtype
            qk, pv = dtype(an.qk_dtype).bytes, dtype(an.pv_dtype).bytes
            values_per_block = (an.smem_k_chunk_bytes // qk + an.smem_v_chunk_bytes // pv
                                + an.units * (an.smem_q_tile_bytes // qk + an.smem_o_staging_bytes // pv))
            print(f"SMEM values per block: analysis {values_per_block:,}, cost model 2d(g_q + s_x) = {M_model:,}")
            assert values_per_block == M_model == 2 * an.d * (an.g_q + an.s_x)
        '''),
        md('''
            ## One streaming step

            Per step, an SM does `2 g_q s_x d` FLOPs for QK (at the fp8 rate per SM and clock) and the same
            for PV (at the fp16 rate, half of it), while every SM loads its K and V chunks from HBM. The loads overlap
            the compute, so the step takes the longer of the two.
        '''),
        code('''
            table(["per step, per SM", "amount", "time"], [
                ["QK (fp8)", f"{an.flops_qk_per_step:,.0f} FLOP at {an.qk_flops_per_clk:.0f}/clk",
                 f"{an.flops_qk_per_step / an.qk_flops_per_clk:.0f} clk"],
                ["PV (fp16)", f"{an.flops_pv_per_step:,.0f} FLOP at {an.pv_flops_per_clk:.0f}/clk",
                 f"{an.flops_pv_per_step / an.pv_flops_per_clk:.0f} clk"],
                ["tensor cores", f"{an.compute_clocks:.0f} clk at {h100.clock_hz / 1e9:.2f} GHz", f"{an.compute_s * 1e6:.2f} µs"],
                ["HBM (all SMs)", f"{an.hbm_bytes_per_step / 1e6:.2f} MB at {h100.hbm_bandwidth / 1e12:.2f} TB/s", f"{an.hbm_s * 1e6:.2f} µs"],
                ["exp (SFU, overlapped)", f"{an.exps_per_step:,.0f} exp at {h100.sfu_ops_per_clk_per_sm:g}/clk", f"{an.sfu_clocks:.0f} clk"],
                ["**step**", f"**{an.bound}-bound**", f"**{an.step_s * 1e6:.2f} µs**"],
                ["throughput", f"{h100.sms} SMs × {an.flops_per_step:,.0f} FLOP per step", f"**{an.throughput_flops / 1e15:.3f} PFLOP/s** = {an.fraction_of_peak:.3f} of the fp8 peak"],
            ])
            assert round(an.compute_clocks) == 2304 and round(an.compute_s * 1e6, 2) == 1.26
            assert round(an.hbm_s * 1e6, 2) == 0.97 and an.bound == "compute"
            assert round(an.throughput_flops / 1e15, 3) == 1.319
            assert math.isclose(an.fraction_of_peak, 2 / 3, abs_tol=1e-3)
        '''),
        code('''
            fig, ax = plt.subplots(figsize=(7.5, 2.8))
            parts = [("QK fp8", an.flops_qk_per_step / an.qk_flops_per_clk / h100.clock_hz),
                     ("PV fp16", an.flops_pv_per_step / an.pv_flops_per_clk / h100.clock_hz)]
            left = 0
            for name, t in parts:
                ax.barh("tensor cores", t * 1e6, left=left * 1e6, label=name); left += t
            ax.barh("HBM loads", an.hbm_s * 1e6, color="tab:red", label="K, V chunks")
            ax.barh("SFU (exp)", an.sfu_clocks / h100.clock_hz * 1e6, color="tab:gray", label="exp")
            ax.axvline(an.step_s * 1e6, ls="--", color="k")
            ax.set_xlabel("µs per step (H100)"); ax.set_title("one s_x step")
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
            plt.tight_layout(); plt.show()
        '''),
        md('''
            Two observations follow from the table: QK in fp8 costs half of PV's clocks, so PV dominates;
            and the exp work on the SFU is of the same order as the tensor work, so a real kernel must
            overlap the two (FlashAttention-3's ping-pong scheduling). On the H200 the step is
            the same on the tensor cores and HBM has more slack:
        '''),
        code('''
            rows = []
            for name, g in (("H100", h100), ("H200", get_gpu("h200"))):
                for qk, pv in (("fp8", "fp16"), ("fp16", "fp16")):
                    r = hopper_attention_analysis(g, qk_dtype=qk, pv_dtype=pv)
                    rows.append([name, f"{qk}/{pv}", r.warpgroups, r.g_q, f"{r.compute_s * 1e6:.2f}", f"{r.hbm_s * 1e6:.2f}",
                                 r.bound, f"{r.throughput_flops / 1e12:.0f}", f"{r.fraction_of_peak:.2f}"])
            table(["GPU", "QK/PV", "warpgroups", "g_q", "compute µs", "HBM µs", "bound", "TFLOP/s", "of QK peak"], rows)
        '''),
        md('''
            ## The same analysis on Ampere

            Ampere has no warpgroups: `mma.sync` runs per warp, and a block holds whole warps. The
            accounting is the same with warps as the unit, each warp owning `w_q` query rows; several
            blocks may share an SM, each with its own K/V buffers. FlashAttention-2's forward
            configuration for d = 128 on A100 is 4 warps per block, a 128 × 64 tile, fp16.
        '''),
        code('''
            a100 = get_gpu("a100")
            fa2 = ampere_attention_analysis(a100)                       # block_q=128, s_x=64, 4 warps, fp16
            print(fa2)
            print(f"{fa2.occupancy.floor} warps fit by the per-warp rule; whole blocks of 4 warps: "
                  f"{fa2.blocks_per_sm} blocks = {fa2.warps} warps per SM")
        '''),
        md('''
            napkin's own algorithm for the same problem: `derive` searches the schedules of multi-head
            attention on the A100 in fp16 and keeps the one its roofline predicts fastest. Its launch
            (threads per block, registers, blocks per SM) comes from the model's residency rule. Below,
            both configurations through both of napkin's models: the per-step warp analysis above and
            the schedule prediction `derive` ranks with.
        '''),
        code('''
            from napkin.codegen.planner import derive
            from napkin.perfmodel.predict import predict_schedule, LaunchAssumptions

            sizes = library.entry("mha").default_sizes
            mha = library.get("mha")
            der = derive(mha, a100, dtype="fp16", sizes=sizes)
            tiles = {r.axis: r.size for r in der.best.kernels[0].relabels if r.level == "SMEM"}
            print("derived:", der.plan.kernels[0].describe())

            fa2_sched = Schedule.fused(mha, groups={"h": 1, "q": fa2.g_q // fa2.blocks_per_sm}, streams={"x": fa2.s_x}, gpu=a100.key, dtype="fp16")
            rows, model = [], {}
            for label, sched_ in (("FlashAttention-2", fa2_sched), ("napkin-derived", der.best)):
                rel = {r.axis: r.size for r in sched_.kernels[0].relabels if r.level == "SMEM"}
                pred = predict_schedule(sched_, a100, sizes=sizes)
                k = pred.kernels[0]
                if label == "FlashAttention-2":
                    warps_per_block = fa2.warps // fa2.blocks_per_sm
                else:                              # the derived launch: the plan's warps per block
                    warps_per_block = der.plan.kernels[0].kernel.options.warps
                an_ = ampere_attention_analysis(a100, block_q=rel["q"], s_x=rel["x"], warps_per_block=warps_per_block)
                model[label] = (an_, pred, warps_per_block)
                rows.append([label, f"{rel['q']}×{rel['x']}, {warps_per_block} warps",
                             f"{an_.warps_by_smem:.1f} / {an_.warps_by_registers:.1f} → {an_.warps}",
                             f"{an_.bound}, {an_.throughput_flops / 1e12:.0f}",
                             f"{k.blocks_per_sm} × {warps_per_block} = {k.blocks_per_sm * warps_per_block} ({k.limited_by})",
                             f"{pred.bound}, {pred.tflops:.0f}"])
            table(["", "tile g_q×s_x, warps per block", "warp analysis: warps per SM (SMEM / registers → whole blocks)",
                   "warp analysis: bound, TFLOP/s", "schedule model: warps per SM (limit)", "schedule model: bound, TFLOP/s"], rows)
            assert fa2.warps == 8 and fa2.blocks_per_sm == 2 and fa2.g_q == 256
        '''),
        md('''
            What the two models say, in their own figures:
        '''),
        code('''
            (an_d, pred_d, wd) = model["napkin-derived"]
            (an_f, pred_f, wf) = model["FlashAttention-2"]
            display(Markdown(
                f"- FlashAttention-2 fits **{fa2.warps} warps** per SM ({fa2.warps / a100.max_warps_per_sm:.1%} of the "
                f"{a100.max_warps_per_sm}-warp limit), as {fa2.blocks_per_sm} blocks of {fa2.warps // fa2.blocks_per_sm}; "
                f"its {fa2.regs_per_thread} registers per thread limit it, not SMEM.\\n"
                f"- The derived algorithm ({der.plan.kernels[0].describe()}) gets "
                f"**{an_d.warps} warps** per SM by the warp analysis, "
                f"{pred_d.kernels[0].blocks_per_sm * wd} by the schedule model's residency.\\n"
                f"- The warp analysis charges every block's K/V chunks to HBM, so blocks that share an SM each "
                f"reload them: FlashAttention-2 is {an_f.bound}-bound there ({an_f.compute_s * 1e6:.2f} µs of tensor work "
                f"against {an_f.hbm_s * 1e6:.2f} µs of HBM per step) and the derived one {an_d.bound}-bound "
                f"({an_d.compute_s * 1e6:.2f} against {an_d.hbm_s * 1e6:.2f} µs).\\n"
                f"- The schedule model lets blocks that run together share K/V through L2 (notebook 03): DRAM then moves "
                f"{pred_d.hbm_bytes / 1e6:.0f} MB for the derived schedule, and both are {pred_f.bound}-bound "
                f"({pred_f.tflops:.0f} and {pred_d.tflops:.0f} TFLOP/s predicted). Which of the two pictures holds "
                f"on a real A100 is what the benchmarks (notebook 05) measure."))
        '''),
    ]


# ----------------------------------------------------------------------------- 05 generate

def nb_generate():
    return [
        md("""
            # 05 · Generate, verify and benchmark a kernel

            The last stage of the pipeline: napkin lowers a scheduled diagram to CUDA C++ (Jinja
            templates around a small device library), compiles it at run time (NVRTC through CuPy),
            checks it against the PyTorch reference and times it next to the model's prediction.

            Generating the source needs no GPU. The cells that compile, verify and benchmark run only
            where a CUDA GPU (with torch and CuPy) exists; elsewhere they say so and skip, and the last
            section shows the benchmark results committed in `benchmarks/results/`.
        """),
        SETUP,
        code("""
            import importlib.util

            def cuda_gpu():
                \"\"\"The GPU profile key of the device at hand, or None (no torch, no CuPy or no CUDA GPU).\"\"\"
                if importlib.util.find_spec("torch") is None or importlib.util.find_spec("cupy") is None:
                    return None
                import torch
                if not torch.cuda.is_available():
                    return None
                from napkin.perfmodel.hardware import match_device_name
                return match_device_name(torch.cuda.get_device_name())

            gpu = cuda_gpu()
            print("CUDA GPU:", gpu or "none here; the GPU cells below skip")
        """),
        md("""
            ## Generate

            Multi-head attention at the library's default sizes, bf16, for an H100 (the profile sets the
            architecture; no GPU is needed). napkin picks the code-generation family that takes the
            diagram, ranks that family's tile configurations with the performance model and lowers the
            best one.
        """),
        code("""
            import napkin.codegen as cg

            mha = library.get("mha")
            sizes = library.entry("mha").default_sizes
            target = gpu or "h100"
            program = cg.lower_diagram(mha, gpu=target, dtype="bf16", sizes=sizes)
            sched = program.schedule
            rel = {r.axis: r for r in sched.kernels[0].relabels}
            print(f"family: {program.family}")
            print(sched)
            table(["kernel", "grid", "block", "shared memory"],
                  [[k.name, k.grid, k.block, f"{k.shared_bytes:,} B"] for k in program.launches])
            rf = [r for r in sched.kernels[0].relabels if r.level == "RF"]
            show(sched, title="the schedule the kernel implements",
                 relabels={r.axis: f"{relabel_labels(sched)[r.axis]}/{r.symbol}={r.size}" for r in rf})
            assert program.family == "attention"
            kinds = {(r.axis, r.kind) for r in sched.kernels[0].relabels}
            assert ("q", "group") in kinds and ("x", "stream") in kinds
        """),
        md("""
            The kernel's source as napkin writes it (it `#include`s the device library; `generate_source`
            inlines the library to give one self-contained `.cu`):
        """),
        code("""
            print(program.source())
            src = cg.generate_source(mha, sizes=sizes, gpu=target, dtype="bf16")
            print(f"// generate_source: {len(src.splitlines()):,} lines, self-contained")
            assert all(k.name in src for k in program.launches)
        """),
        md("""
            ## Verify (GPU)

            Fresh random inputs, outputs poisoned with NaN first, compared with the float64 PyTorch
            reference over several shapes, including sizes that are not multiples of the tiles. The
            relative error must be under 1e-2 in bf16.
        """),
        code("""
            if gpu:
                report = cg.verify_diagram(mha, sizes=dict(sizes, h=4, q=1024, x=1024), dtype="bf16")
                print(report)
                assert report.ok
            else:
                print("skipped: verifying runs the kernel, which needs a CUDA GPU")
        """),
        md("""
            ## Benchmark (GPU)

            One point of the benchmark suite, measured the way the suite measures it (CUDA events,
            median of many runs, inputs rotated past L2): napkin's kernel, PyTorch's SDPA backends, and
            the model's prediction for napkin's schedule.
        """),
        code("""
            if gpu:
                from napkin.bench.suite import Point, SuiteConfig, run_point

                point = Point("attention", "mha", dict(sizes), "bf16", {"d": sizes["d"], "causal": False, "seq": sizes["q"]})
                rec = run_point(point, SuiteConfig(gpu=gpu, autotune=False, compile_baselines=False, reps=30))
                rows = [["napkin", f"{rec['napkin_s'] * 1e6:.1f}" if rec["napkin_s"] else rec["errors"].get("napkin"),
                         f"{rec['tflops']:.0f}" if rec["tflops"] else "—"]]
                rows.append(["model prediction", f"{rec['pred_s'] * 1e6:.1f}" if rec["pred_s"] else "—",
                             f"{point.flops / rec['pred_s'] / 1e12:.0f}" if rec["pred_s"] else "—"])
                for name, v in rec["baselines"].items():
                    rows.append([name, f"{v * 1e6:.1f}" if isinstance(v, float) else next(iter(v.values()))[:80],
                                 f"{rec['rates'][name]:.0f}" if name in rec["rates"] else "—"])
                table(["", "µs", "TFLOP/s"], rows)
                print("check against", rec.get("check"))
                assert rec["napkin_s"] is not None
            else:
                print("skipped: benchmarking needs a CUDA GPU; the committed results follow")
        """),
        md("""
            ## Committed benchmark results

            `benchmarks/run_all.py` writes `benchmarks/results/<gpu>/*.json`, plots and `BENCHMARKS.md`.
            Every point records napkin's time, each baseline's, and the model's prediction.
        """),
        code("""
            from napkin.bench.report import load_results, point_label
            from IPython.display import Image

            root = pathlib.Path(sys.path[0]) / "benchmarks" / "results"
            folders = sorted({p.parent for p in root.glob("*/*.json")})
            if not folders:
                print("no benchmark results are committed yet (benchmarks/results/<gpu>/*.json)")
            for folder in folders:
                device, points = load_results(folder)
                display(Markdown(f"### {folder.name}: {device.get('name', '?')}"))
                rows = []
                for p in points:
                    metric = p.get("metric", "tflops")
                    rate = p.get(metric)
                    best = max(((n, r) for n, r in p.get("rates", {}).items() if n != "napkin" and r), key=lambda t: t[1], default=None)
                    rows.append([point_label(p), f"{rate:.0f} {metric}" if rate else "—",
                                 f"{best[0]}: {best[1]:.0f}" if best else "—",
                                 f"{p['pred_err']:.0%}" if p.get("pred_err") is not None else "—"])
                table(["point", "napkin", "best baseline", "model error"], rows)
                for png in sorted((folder / "plots").glob("*.png")):
                    display(Markdown(f"`{png.relative_to(root.parent.parent)}`"))
                    display(Image(filename=str(png)))
        """),
    ]


NOTEBOOKS = {
    "01_matmul": nb_matmul,
    "02_flashattention": nb_attention,
    "03_hardware_and_quantization": nb_hardware,
    "04_hopper_attention": nb_hopper,
    "05_generate_and_benchmark": nb_generate,
}


def build(name: str):
    """The notebook ``name`` as an nbformat object (no outputs)."""
    nb = new_notebook(cells=NOTEBOOKS[name]())
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{name[:2]}-{i:02d}"      # stable ids: rebuilding changes nothing
    return nb


def execute(nb, timeout: int = 600):
    """Run ``nb`` top to bottom in a python3 kernel, in this folder; raise on the first failing cell."""
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(HERE)}})
    client.execute()
    return nb


def sources(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in nb.cells]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--execute", action="store_true", help="run the notebooks and save their outputs")
    ap.add_argument("--check", action="store_true", help="compare the committed notebooks with this file")
    ap.add_argument("only", nargs="*", help="notebook name prefixes (default: all)")
    args = ap.parse_args(argv)
    names = [n for n in NOTEBOOKS if not args.only or any(n.startswith(p) for p in args.only)]
    status = 0
    for name in names:
        path = HERE / f"{name}.ipynb"
        nb = build(name)
        if args.check:
            if not path.exists():
                print(f"{path.name}: missing (run python3 notebooks/build.py --execute)")
                status = 1
            elif sources(nbformat.read(path, as_version=4)) != sources(nb):
                print(f"{path.name}: cells differ from notebooks/build.py (run python3 notebooks/build.py --execute)")
                status = 1
            continue
        if args.execute:
            print(f"executing {name} ...", flush=True)
            try:
                execute(nb)
            except Exception as e:  # a failing cell: say which, without the terminal colour codes
                print(re.sub(r"\x1b\[[0-9;]*m", "", str(e))[-3000:], file=sys.stderr)
                return 1
        nbformat.validate(nb)
        nbformat.write(nb, path)
        print(f"wrote {path.relative_to(HERE.parent)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
