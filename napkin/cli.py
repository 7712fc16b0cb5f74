"""The ``napkin`` command line.

    napkin list                                   the built-in diagrams
    napkin show NAME [-s q=4096 ...]              a diagram's inputs, boxes, outputs and sizes
    napkin render NAME [-s ...] -o file.svg       draw it (SVG, or graphviz DOT with --format dot)
    napkin cost NAME [-s ...] [--group q=128]     per level H, M, FLOPs and predicted time
    napkin derive NAME [-s ...] [--gpu h100]      the Napkin derivation and the chosen schedule
    napkin generate NAME [-s ...] -o file.cu      the kernel as one self-contained CUDA file (no GPU)
    napkin verify NAME [-s ...]                   run it against the PyTorch reference (GPU)
    napkin bench NAME [-s ...] [--sweep]          time it next to cuBLAS/SDPA/Flex and the model (GPU)
    napkin calibrate [-o profile.json]            measure this GPU's rates into a profile (GPU)

NAME is a built-in diagram (``attention``) or a diagram in a user file
(``path/file.py:name``). ``--grad`` (show, derive, generate) takes its backward diagram instead
(``Diagram.grad``, with the forward arrays the performance model chooses to save). Every mistake a user can make ends in one line
``error: ...`` on stderr and exit status 2: a NapkinError, a usage error (an unknown
command or option, a missing argument), output that cannot be written (stdout closed
or on a full disk, an ``-o`` that names a folder). A closed pipe (``| head``) ends
quietly with status 141. Output files are checked before any work, sizes are at most
2^48, a diagram past the planner's limit (1000 boxes) is refused, and arrays larger
than the GPU's memory get a warning (cost, derive, generate) or an error (verify, bench).

Adding a command: write a function with the shared options of
:mod:`napkin.cli_common` and register it under ``@app.command()`` then
``@handle_errors``. Name output files with :func:`~napkin.cli_common.output_path`
(before the work) and write them with :func:`~napkin.cli_common.write_output`.
Import heavy modules (torch, cupy, the performance model) inside the function,
never at the top of this file: ``napkin --help`` and ``napkin list`` must not
import torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import __version__
from .cli_common import (DEFAULT_DTYPE, DEFAULT_GPU, DtypeOpt, GpuOpt, JsonOpt, NameArg, NapkinGroup,  # noqa: F401
                         SizesOpt, UsageError, check_memory, console, format_sizes, handle_errors, load_bound,
                         output_dir, output_path, parse_sizes, print_error, print_json, print_warning, write_output)

app = typer.Typer(
    name="napkin",
    cls=NapkinGroup,
    help="Neural circuit diagrams to IO-aware GPU algorithms: list, show, render, cost, derive, generate, verify, bench, calibrate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"napkin {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
    verbose: Annotated[
        int, typer.Option("--verbose", "-v", count=True,
                          help="Log what napkin does on stderr: -v info (plans, compiles, caches), -vv debug."),
    ] = 0,
    log_level: Annotated[
        Optional[str], typer.Option("--log-level", metavar="LEVEL",
                                    help="debug, info, warning or error (default: $NAPKIN_LOG_LEVEL, else warning).",
                                    show_default=False),
    ] = None,
    device: Annotated[
        Optional[str], typer.Option("--device", metavar="N",
                                    help="CUDA device for verify, bench and calibrate (default: $NAPKIN_DEVICE, "
                                         "else the current one).", show_default=False),
    ] = None,
) -> None:
    """Neural circuit diagrams to IO-aware GPU algorithms.

    NAME is a built-in diagram (see `napkin list`) or path/file.py:name.
    Bind axis sizes with -s name=value (repeatable).
    """
    import os

    from .settings import DEVICE_ENV, configure_logging, parse_device

    configure_logging(verbose, log_level)
    if device is not None:
        parse_device(device, "--device ")  # a bad value is refused here, naming it
        os.environ[DEVICE_ENV] = device  # the benchmark's child processes inherit it


# ----------------------------------------------------------------------------- list

@app.command("list")
@handle_errors
def list_(json_out: JsonOpt = False) -> None:
    """List the built-in diagrams: name, family, description, default sizes."""
    from .diagrams import library

    entries = library.entries()
    if json_out:
        print_json([{"name": e.name, "family": e.family, "description": e.description,
                     "default_sizes": dict(e.default_sizes)} for e in entries])
        return
    from rich.table import Table
    from rich.text import Text

    table = Table(title="built-in diagrams", title_justify="left", header_style="bold")
    table.add_column("name", style="cyan", no_wrap=True)
    table.add_column("family")
    table.add_column("description")
    table.add_column("default sizes")
    for e in entries:
        table.add_row(Text(e.name), Text(e.family), Text(e.description), Text(format_sizes(e.default_sizes)))
    console().print(table)
    console().print(Text("Use one as NAME, or a diagram of your own as path/file.py:name."))


# ----------------------------------------------------------------------------- show

GradOpt = Annotated[bool, typer.Option("--grad", help="Use the diagram's backward (Diagram.grad): the "
                                       "gradients from the cotangents, saving the forward arrays the "
                                       "model chooses to save (the table says which and why).")]


def _backward(diagram, gpu: str, dtype: Optional[str]):
    """The backward diagram of ``diagram`` and the model's save-or-recompute choice on ``gpu`` (None
    where sizes are symbolic: then everything is recomputed)."""
    if not diagram.is_bound:
        return diagram.grad(), None
    from .perfmodel.saving import backward

    return backward(diagram, gpu, dtype)


def _print_saves(saves) -> None:
    if saves is None:
        typer.echo("saved: nothing (sizes are symbolic; bind them with -s to let the model choose what "
                   "the backward saves)")
    else:
        typer.echo(str(saves))


@app.command()
@handle_errors
def show(name: NameArg, size: SizesOpt = None, json_out: JsonOpt = False, grad: GradOpt = False) -> None:
    """Print a diagram: inputs, boxes (with the axes each is woven over), outputs and sizes.

    Without -s a built-in diagram keeps its sizes symbolic. --grad prints its backward diagram.
    """
    diagram = load_bound(name, size, use_defaults=False)
    saves = None
    if grad:
        diagram, saves = _backward(diagram, DEFAULT_GPU, None)
    if json_out:
        print_json({
            **({"saves": saves.to_dict() if saves is not None else None} if grad else {}),
            "name": diagram.name,
            "description": diagram.description,
            "sizes": {n: (s if isinstance(s, int) else str(s)) for n, s in diagram.sizes.items()},
            "inputs": [{"name": v.name, "axes": list(v.axis_names), "dtype": v.dtype} for v in diagram.inputs],
            "outputs": [{"name": n, "axes": list(v.axis_names), "dtype": v.dtype}
                        for n, v in zip(diagram.output_names, diagram.outputs)],
            "summary": diagram.summary(),
        })
        return
    from rich.panel import Panel
    from rich.text import Text

    title = Text(diagram.name, style="bold cyan")
    body = Text(diagram.summary())
    console().print(Panel(body, title=title, title_align="left", expand=False))
    sizes = diagram.sizes
    bound = {n: s for n, s in sizes.items() if isinstance(s, int)}
    if len(bound) == len(sizes):
        console().print(Text("sizes: ", style="bold") + Text(format_sizes(sizes)))
    elif bound:
        console().print(Text("sizes: ", style="bold") + Text(format_sizes(bound))
                        + Text(f"  (symbolic: {', '.join(n for n in sizes if n not in bound)})"))
    else:
        console().print(Text("sizes: ", style="bold") + Text("symbolic (bind with -s name=value)"))
    if grad:
        _print_saves(saves)


# ----------------------------------------------------------------------------- render

FormatOpt = Annotated[
    Optional[str],
    typer.Option("--format", "-f", metavar="svg|dot",
                 help="Output format; default: from the -o suffix (.dot/.gv → dot), else svg.",
                 show_default=False),
]
OutOpt = Annotated[
    Optional[Path],
    typer.Option("--output", "-o", metavar="FILE",
                 help="File to write ('-' for stdout); default: NAME.svg (or NAME.dot).", show_default=False),
]


def _render_text(diagram, fmt: str) -> str:
    """The drawing as text; a missing renderer or graphviz package is a one-line error."""
    try:
        if fmt == "svg":
            return diagram.to_svg()
        from .diagrams.dot import to_dot_source

        return to_dot_source(diagram)
    except ModuleNotFoundError as e:
        if e.name == "graphviz":
            raise UsageError("render --format dot needs the graphviz Python package: "
                             "python3 -m pip install graphviz") from None
        if e.name and e.name.startswith("napkin."):
            raise UsageError(f"render --format {fmt}: this napkin has no {e.name} module") from None
        raise
    except ImportError as e:
        if "napkin.diagrams" in str(e):
            raise UsageError(f"render --format {fmt}: the renderer is not available ({e})") from None
        raise


#: What ``render`` draws, by the suffix of ``-o``.
RENDER_SUFFIXES = {".svg": "svg", ".dot": "dot", ".gv": "dot"}


def _render_format(fmt: Optional[str], output: Optional[Path]) -> str:
    """The format ``render`` writes: ``--format``, else the suffix of ``-o``, else svg. A format or
    suffix napkin does not draw (png, pdf, ...), or a suffix that contradicts ``--format``, is a
    UsageError naming what it does draw."""
    drawn = "napkin draws svg or dot (graphviz source; `dot -Tpng FILE.dot -o FILE.png` makes a PNG)"
    if fmt is not None:
        fmt = fmt.lower()
        if fmt not in ("svg", "dot"):
            raise UsageError(f"render: unknown format {fmt!r}; {drawn}")
    suffix = output.suffix.lower() if output is not None and str(output) != "-" else ""
    if suffix and suffix not in RENDER_SUFFIXES:
        raise UsageError(f"render -o {str(output)!r}: {drawn}, not {suffix[1:]}; name the file .svg or .dot")
    if fmt is not None and suffix and RENDER_SUFFIXES[suffix] != fmt:
        raise UsageError(f"render -o {str(output)!r} --format {fmt}: the suffix {suffix} says "
                         f"{RENDER_SUFFIXES[suffix]}; give one or make them agree")
    return fmt or RENDER_SUFFIXES.get(suffix, "svg")


@app.command()
@handle_errors
def render(name: NameArg, size: SizesOpt = None, output: OutOpt = None, fmt: FormatOpt = None) -> None:
    """Draw a diagram as a neural circuit diagram (SVG) or as graphviz DOT source."""
    fmt = _render_format(fmt, output)
    diagram = load_bound(name, size, use_defaults=False)
    target = output_path("render", "-o", output, Path(f"{diagram.name}.{fmt}"), suffixes=tuple(RENDER_SUFFIXES))
    text = _render_text(diagram, fmt)
    path = write_output("render", text, target)
    if path is not None:
        from rich.text import Text

        console().print(Text(f"wrote {path} ({fmt}, {len(text.encode('utf-8')) / 1024:.1f} KiB)"))


# ----------------------------------------------------------------------------- cost, derive

GroupOpt = Annotated[
    Optional[list[str]],
    typer.Option("--group", "-g", metavar="AXIS=SIZE[@LEVEL]",
                 help="Tile (group) an axis, at SMEM unless a level is named: q=128 or q=16@RF (repeatable).",
                 show_default=False),
]
StreamOpt = Annotated[
    Optional[list[str]],
    typer.Option("--stream", metavar="AXIS=SIZE[@LEVEL]",
                 help="Stream an axis in chunks: x=64 (repeatable).", show_default=False),
]
SymbolicOpt = Annotated[bool, typer.Option("--symbolic", help="Also print H and M as sympy formulas.")]


def _progress():
    """A callback that prints derive's progress lines dimmed on stderr."""
    from .cli_common import err_console

    def say(message: str) -> None:
        from rich.text import Text

        try:  # one line each (never wrapped), and a stderr that fails does not stop the search
            err_console().print(Text(f"… {message}", style="dim"), soft_wrap=True, highlight=False)
        except (OSError, ValueError):
            pass

    return say


def _plan(diagram, gpu: str, dtype: str, group, stream, *, quiet: bool, explain: bool = True):
    """The derivation of ``diagram`` with the pinned relabellings (one planner for cost, derive
    and generate)."""
    from .codegen.planner import derive as run_derive
    from .perfmodel.report import parse_relabels

    fixed = parse_relabels(group, stream)
    return run_derive(diagram, gpu, dtype, fixed=fixed, explain=explain, progress=None if quiet else _progress())


@app.command()
@handle_errors
def cost(name: NameArg, size: SizesOpt = None, gpu: GpuOpt = DEFAULT_GPU, dtype: DtypeOpt = DEFAULT_DTYPE,
         group: GroupOpt = None, stream: StreamOpt = None, symbolic: SymbolicOpt = False,
         explain: Annotated[bool, typer.Option("--explain", help="Also list every assumption of the "
                            "prediction that is not a datasheet fact, with its value and source.")] = False,
         json_out: JsonOpt = False) -> None:
    """Per level H (transfers), M (memory), FLOPs and predicted time of the derived plan.

    --group/--stream pin relabellings; whatever is not given is chosen by derive.
    Sizes default to the library's example sizes.
    """
    from .perfmodel.report import cost_report, format_cost_report

    diagram = load_bound(name, size, use_defaults=True, plan=True)
    check_memory(diagram, dtype, gpu=gpu, consequence="the prediction assumes they fit")
    der = _plan(diagram, gpu, dtype, group, stream, quiet=json_out, explain=False)
    rep = cost_report(der.plan, symbolic=symbolic)
    if explain:
        rep["assumptions"] = _assumptions(der.plan)
    if json_out:
        print_json(rep)
        return
    typer.echo(format_cost_report(rep))
    if explain:
        typer.echo("assumptions (not datasheet facts):")
        for a in rep["assumptions"]:
            typer.echo(f"  {a['name']} = {a['value']}  ({a['source']})")


def _assumptions(plan) -> list[dict]:
    """Every named assumption of the prediction (profile fields, and each kernel's launch facts as
    its family states them), JSON-safe."""
    from .codegen.planner import kernel_predictions
    from .perfmodel.hardware import get_gpu
    from .perfmodel import predict

    explain_fn = getattr(predict, "explain_assumptions", None)
    if explain_fn is None:
        return []
    rows = explain_fn(get_gpu(plan.gpu), kernels=kernel_predictions(plan))
    return [{"name": str(n), "value": v if isinstance(v, (int, float, str)) else str(v), "source": str(src)}
            for n, v, src in rows]


@app.command()
@handle_errors
def derive(name: NameArg, size: SizesOpt = None, gpu: GpuOpt = DEFAULT_GPU, dtype: DtypeOpt = DEFAULT_DTYPE,
           group: GroupOpt = None, stream: StreamOpt = None,
           top: Annotated[int, typer.Option("--top", min=1, help="How many configurations of the costliest "
                                            "kernel to show (at least 1).")] = 5,
           json_out: JsonOpt = False,
           svg: Annotated[Optional[Path], typer.Option("--svg", metavar="FILE",
                          help="Also draw the plan (wires coloured by level).")] = None,
           pseudocode: Annotated[bool, typer.Option("--pseudocode", help="Print the plan as "
                                 "pseudocode with the memory held per column.")] = False,
           grad: GradOpt = False) -> None:
    """Derive the plan: the method's steps (naive → fuse → group → stream), then the kernels, each
    with the family that builds it, its tiles and options. `napkin generate` builds this plan.
    --grad derives the backward diagram's plan."""
    from .codegen.planner import derive as run_derive
    from .perfmodel.report import parse_relabels

    diagram = load_bound(name, size, use_defaults=True, plan=True)
    saves = None
    if grad:
        diagram, saves = _backward(diagram, gpu, dtype)
    svg_target = output_path("derive", "--svg", svg, suffixes=(".svg",), stdout=False) if svg is not None else None
    fixed = parse_relabels(group, stream)
    check_memory(diagram, dtype, gpu=gpu, consequence="the prediction assumes they fit")
    der = run_derive(diagram, gpu, dtype, fixed=fixed, top=top, progress=None if json_out else _progress())
    if svg_target is not None:
        from .perfmodel.view import scheduled_svg

        write_output("derive", scheduled_svg(der.best), svg_target)
    if json_out:
        out = der.to_dict()
        if grad:
            out["saves"] = saves.to_dict() if saves is not None else None
        if pseudocode:
            from .perfmodel.view import pseudocode as code

            out["pseudocode"] = code(der.best)
        print_json(out)
        return
    if grad:
        _print_saves(saves)
        typer.echo("")
    typer.echo(str(der))
    for note in der.plan.notes:
        print_warning(note)
    if pseudocode:
        from .perfmodel.view import pseudocode as code

        typer.echo("\n" + code(der.best))
    if svg_target is not None:
        typer.echo(f"wrote {svg_target}")


# ----------------------------------------------------------------------------- generate, verify, bench

def _check_device_memory(command: str, diagram, dtype: str) -> None:
    """Refuse, before anything is allocated, a diagram whose inputs and outputs do not fit in the
    memory of the GPU at hand."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    check_memory(diagram, dtype, capacity=float(props.total_memory), device=str(props.name), refuse=True,
                 consequence=f"{command} would not find room for them; give smaller sizes with -s")


def _require_gpu(command: str) -> None:
    """One clear error when a command needs CUDA and this machine has none."""
    try:
        import torch
    except ImportError:
        raise UsageError(f"{command} needs PyTorch with CUDA; it is not installed") from None
    if not torch.cuda.is_available():
        raise UsageError(f"{command} needs a CUDA GPU and this machine has none "
                         "(generate, cost and derive work without one)")
    from .settings import use_cuda_device

    use_cuda_device()
    try:
        import cupy  # noqa: F401
    except ImportError:
        raise UsageError(f"{command} compiles kernels with CuPy: python3 -m pip install cupy-cuda13x") from None


CudaOutOpt = Annotated[
    Optional[Path],
    typer.Option("--output", "-o", metavar="FILE",
                 help="File to write ('-' for stdout); default: NAME.cu.", show_default=False),
]


@app.command()
@handle_errors
def generate(name: NameArg, size: SizesOpt = None, gpu: GpuOpt = DEFAULT_GPU, dtype: DtypeOpt = DEFAULT_DTYPE,
             group: GroupOpt = None, stream: StreamOpt = None, output: CudaOutOpt = None,
             json_out: JsonOpt = False, grad: GradOpt = False) -> None:
    """Write the kernels of the derived plan as one self-contained .cu (no GPU needed).

    The device library is inlined, so `nvcc -cubin -gencode=arch=compute_90a,code=sm_90a FILE.cu`
    compiles it as it stands. --json prints the plan (the same object `napkin derive --json`
    prints under "plan") and the launches. --grad writes the backward diagram's kernels (NAME_grad.cu).
    """
    from .codegen.generate import generate_program

    if json_out and output is not None and str(output) == "-":
        raise UsageError("generate --json prints the plan on stdout; give the .cu a file name with -o FILE")
    diagram = load_bound(name, size, use_defaults=True, plan=True)
    saves = None
    if grad:
        diagram, saves = _backward(diagram, gpu, dtype)
    target = output_path("generate", "-o", output, Path(f"{diagram.name}.cu"))
    check_memory(diagram, dtype, gpu=gpu, consequence="the generated kernels assume they fit")
    der = _plan(diagram, gpu, dtype, group, stream, quiet=json_out, explain=False)
    text, program = generate_program(diagram, gpu=gpu, plan=der.plan)
    path = write_output("generate", text, target)
    if json_out:
        print_json({"plan": program.plan.to_dict(), "output": str(path) if path is not None else None,
                    "launches": [{"name": k.name, "template": k.template, "grid": list(k.grid),
                                  "block": list(k.block), "shared_bytes": k.shared_bytes} for k in program.launches],
                    "buffers": [b.name for b in program.buffers],
                    **({"saves": saves.to_dict() if saves is not None else None} if grad else {})})
        return
    for note in program.plan.notes:
        print_warning(note)
    if grad and path is not None:
        _print_saves(saves)
    if path is not None:
        typer.echo(text.split("\n\n", 1)[0])  # the header comment: plan and launches
        typer.echo(f"wrote {path} ({len(text.encode('utf-8')) / 1024:.1f} KiB)")


@app.command()
@handle_errors
def verify(name: NameArg, size: SizesOpt = None, gpu: GpuOpt = DEFAULT_GPU, dtype: DtypeOpt = DEFAULT_DTYPE,
           seed: Annotated[Optional[int], typer.Option("--seed", help="Seed of the random inputs.")] = None,
           json_out: JsonOpt = False) -> None:
    """Check the generated kernel against the float64 PyTorch reference (GPU).

    Fresh random inputs over a sweep of shapes (the given sizes, sizes that are not tile
    multiples, tiny odd sizes), outputs poisoned with NaN first; prints the relative error of
    every output and exits 1 if any misses its tolerance (1e-2 for bf16/fp16, 1e-5 for fp32).
    """
    diagram = load_bound(name, size, use_defaults=True, plan=True)
    _require_gpu("verify")
    _check_device_memory("verify", diagram, dtype)
    from .codegen.verify import verify as run_verify

    report = run_verify(diagram, dtype=dtype, gpu=gpu, seed=seed)
    if json_out:
        print_json({"ok": report.ok, "rows": [r.__dict__ if hasattr(r, "__dict__") else str(r)
                                              for r in report.rows]})
    else:
        typer.echo(str(report))
    if not report.ok:
        raise typer.Exit(1)


@app.command()
@handle_errors
def bench(name: NameArg, size: SizesOpt = None, gpu: Annotated[Optional[str], typer.Option(
              "--gpu", metavar="GPU", help="Profile for codegen and the model (default: this device's).")] = None,
          dtype: DtypeOpt = DEFAULT_DTYPE,
          sweep: Annotated[bool, typer.Option("--sweep", help="Run the benchmark sweep of this diagram's "
                                              "family and write JSON, plots and BENCHMARKS.md.")] = False,
          quick: Annotated[bool, typer.Option("--quick", help="With --sweep: a short sweep.")] = False,
          out: Annotated[Path, typer.Option("--out", metavar="DIR", help="With --sweep: results folder.")] =
          Path("benchmarks/results"),
          json_out: JsonOpt = False) -> None:
    """Time the generated kernels next to the baselines (cuBLAS, SDPA backends, FlexAttention, and
    for any other diagram, a user's file included, its PyTorch reference eager and under
    torch.compile) and the model's prediction: CUDA events, warm-up, medians, rotated inputs."""
    from .diagrams import library

    if sweep and name not in library.names():
        raise UsageError(f"--sweep runs the sweep of a built-in diagram's family; {name!r} is not built in "
                         "(leave out --sweep to time it)")
    if sweep:
        output_dir("bench", "--out", out)
        diagram = None
    else:
        diagram = load_bound(name, size, use_defaults=True, plan=True)
    _require_gpu("bench")
    if diagram is not None:
        _check_device_memory("bench", diagram, dtype)
    from .bench import suite
    from .bench.baselines import family_of

    if sweep:
        fam = family_of(library.get(name))
        points = [p for p in suite.all_points(quick, (fam,)) if p.diagram == name] or suite.all_points(quick, (fam,))
        args = {"quick": quick, "families": fam, "gpu": gpu, "profile": None, "top_k": 4, "spearman_k": 8,
                "no_autotune": False, "no_compile": False, "retune": False, "reps": 50, "warmup": 10}
        device, records, gpu_dir = suite.orchestrate(points, out, child_args=args)
        from .bench import report as report_mod

        rep = report_mod.generate(gpu_dir)
        typer.echo(f"{len(records)} points on {device.get('name', '?')}; JSON, plots and {rep.markdown} in {gpu_dir}")
        return
    sizes = {n: int(a.size) for n, a in diagram.axes.items() if n in {x for v in diagram.inputs
                                                                        for x in v.axis_names}}
    fam = family_of(diagram)
    labels = {"causal": True} if "causal" in name else {}
    point = suite.Point(fam, name, sizes, dtype, labels)
    cfg = suite.config_from_args(_SweepDefaults(gpu))
    rec = suite.run_point(point, cfg)
    if json_out:
        print_json(rec)
        return
    from rich.table import Table

    metric = point.metric
    unit = "GB/s" if metric == "gbps" else "TFLOP/s"
    t = Table(title=f"{name} {dtype} {format_sizes(sizes)}", title_justify="left")
    for c in ("kernel", "median ms", unit, "napkin ×"):
        t.add_column(c)
    if rec.get("napkin_s"):
        t.add_row("napkin", f"{rec['napkin_s'] * 1e3:.3f}", f"{rec['rates'].get('napkin', 0) or 0:.1f}", "1.00")
    for b, v in rec.get("baselines", {}).items():
        if isinstance(v, (int, float)):
            rate = rec["rates"].get(b)
            t.add_row(b, f"{v * 1e3:.3f}", f"{rate:.1f}" if rate else "—",
                      f"{v / rec['napkin_s']:.2f}" if rec.get("napkin_s") else "—")
        else:
            t.add_row(b, "—", "—", str(v)[:60])
    console().print(t)
    kernels = (rec.get("napkin") or {}).get("kernels") or []
    if kernels:
        slow = kernels.count("fallback")
        console().print(f"napkin ran {len(kernels)} kernel(s): {', '.join(kernels)}"
                        + (f"; {slow} on the scalar fallback (a slow path)" if slow else ""))
    if rec.get("pred_s"):
        err = rec.get("pred_err")
        console().print(f"model: predicted {rec['pred_s'] * 1e3:.3f} ms"
                        + (f", |pred − meas|/meas = {abs(err) * 100:.0f}%" if err is not None else ""))
    for k, v in rec.get("errors", {}).items():
        console().print(f"[red]{k}: {v}[/red]")


class _SweepDefaults:
    """The sweep options bench passes to the suite for a single point."""

    def __init__(self, gpu):
        self.gpu, self.profile, self.no_compile, self.no_autotune = gpu, None, False, False
        self.top_k, self.spearman_k, self.retune, self.reps, self.warmup = 4, 8, False, 50, 10


@app.command()
@handle_errors
def calibrate(gpu: Annotated[Optional[str], typer.Option("--gpu", metavar="GPU",
                             help="Datasheet profile to start from (default: matched to this device).")] = None,
              output: Annotated[Optional[Path], typer.Option("--output", "-o", metavar="FILE",
                                help="Where to write the calibrated profile JSON ('-' for stdout); default: "
                                "calibrated.json.", show_default=False)] = None
              ) -> None:
    """Measure copy bandwidth, GEMM rate and exp rate on this GPU and write a profile that overrides
    the datasheet values (use it with --gpu FILE)."""
    target = output_path("calibrate", "-o", output, Path("calibrated.json"))  # before minutes of measuring
    _require_gpu("calibrate")
    from .perfmodel.calibrate import calibrate as run_calibrate

    prof = run_calibrate(gpu, target if target is not None else "-")
    say = typer.echo if target is not None else (lambda line: typer.echo(line, err=True))  # stdout: the JSON
    say(str(prof))
    units = {"copy_bandwidth": ("TB/s", 1e12), "gemm_bf16": ("TFLOP/s", 1e12), "gemm_fp16": ("TFLOP/s", 1e12),
             "sfu_rate": ("Gexp/s", 1e9), "hbm_bytes": ("GiB", 2**30), "l2_bytes": ("MiB", 2**20)}
    for key, value in sorted(prof.measured.items()):
        unit, scale = units.get(key, ("", 1))
        say(f"  measured {key}: {value / scale:,.2f} {unit}".rstrip())
    if target is not None:
        typer.echo(f"wrote {target}")


# ----------------------------------------------------------------------------- entry point

def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``napkin``) and ``python -m napkin``: runs the command line and
    exits with its status (:class:`~napkin.cli_common.NapkinGroup` handles every failure)."""
    app(args=argv, prog_name="napkin")


if __name__ == "__main__":  # pragma: no cover
    main()
