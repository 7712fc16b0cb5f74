"""The attention family's Hopper template (wgmma + TMA) against its mma.sync tiles and PyTorch's
SDPA flash and cuDNN backends, on the sweep of issue #13: batch x 16 heads x seq with 16k tokens a
batch, head dims 64 and 128 (``--dims 80 96 192 256`` too), causal and not, bf16. Prints one line a
point (TFLOP/s: 4·B·H·N²·d, half of it causal) with the model's prediction of each napkin kernel;
``--json`` writes them. ``--gqa 4`` times grouped-query attention instead (16 query heads, 4 of them
a K/V head; SDPA with ``enable_gqa``), with the best packed and unpacked wgmma tiles the model ranks.

    PYTHONPATH=. python3 benchmarks/attention_wgmma.py --seqs 1024 4096 16384 --json out.json
    PYTHONPATH=. python3 benchmarks/attention_wgmma.py --dims 128 --gqa 4 --seqs 2048 8192
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics


def timed(fn, warmup: int, reps: int) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(times)


def main() -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from napkin.codegen.api import CompiledDiagram
    from napkin.codegen.api import compile as compile_diagram
    from napkin.codegen.families import attention_wgmma
    from napkin.codegen.families.attention import FAMILY
    from napkin.codegen.select import rank
    from napkin.diagrams import Axis, Diagram, array, library
    from napkin.diagrams.library import attention_core

    def gqa(causal: bool) -> Diagram:
        if causal:
            return library.get("gqa")
        Q = array("Q", Axis("h"), Axis("j"), Axis("q"), Axis("d"))
        K, V = array("K", Axis("h"), Axis("x"), Axis("d")), array("V", Axis("h"), Axis("x"), Axis("d"))
        return Diagram("gqa_full", attention_core(Q, K, V))

    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--all-configs", action="store_true", help="time every wgmma configuration")
    ap.add_argument("--variants", action="store_true",
                    help="time the model's best wgmma configuration one chunk at a time and in two stages, "
                         "each one tile a block and persistent (and in two stages with ping-pong: --pingpong)")
    ap.add_argument("--pingpong", action="store_true", help="with --variants: the ping-pong variant too")
    ap.add_argument("--sections", type=float, nargs="*", default=[],
                    help="with --variants: the persistent variant again with each of these L2 budgets (MiB) "
                         "for its tile order's sections of heads (attention_wgmma.L2_SECTION_BYTES)")
    ap.add_argument("--extra", nargs="*", default=[],
                    help="more configurations to time, each D,consumers,s_x,stages,two_stages[,persistent"
                         "[,pingpong[,one_p]]] (1 or 0; persistent defaults to the table, "
                         "attention_wgmma.PERSISTENT; ping-pong and one P buffer to 0)")
    ap.add_argument("--gqa", type=int, default=0, help="query heads per K/V head (16 query heads in all)")
    ap.add_argument("--json")
    a = ap.parse_args()
    gpu = torch.cuda.get_device_name()
    rows = []
    for causal in (False, True):
        for D in a.dims:
            for n in a.seqs:
                b = max(1, a.tokens // n)
                flops = 4 * b * 16 * n * n * D / (2 if causal else 1)
                J = a.gqa or 1
                kvh = 16 // J
                q = torch.randn(b, 16, n, D, device="cuda", dtype=torch.bfloat16)
                k, v = (torch.randn(b, kvh, n, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                if a.gqa:
                    d = gqa(causal).bind(h=kvh * b, j=J, q=n, x=n, d=D)
                    ins = {"Q": q.view(kvh * b, J, n, D), "K": k.view(kvh * b, n, D), "V": v.view(kvh * b, n, D)}
                else:
                    d = library.get("attention_causal" if causal else "mha").bind(h=16 * b, q=n, x=n, d=D)
                    ins = {"Q": q.view(16 * b, n, D), "K": k.view(16 * b, n, D), "V": v.view(16 * b, n, D)}
                sdpa_kw = dict(is_causal=causal, enable_gqa=True) if a.gqa else dict(is_causal=causal)
                row = dict(gpu=gpu, causal=causal, d=D, seq=n, batch=b, gqa=J)
                for backend, key in ((SDPBackend.FLASH_ATTENTION, "flash"), (SDPBackend.CUDNN_ATTENTION, "cudnn")):
                    try:
                        with sdpa_kernel(backend):
                            f = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, **sdpa_kw)  # noqa: E731
                            row[key] = flops / timed(f, a.warmup, a.reps) / 1e12
                    except Exception as e:  # noqa: BLE001 - a backend that does not run here
                        row[key] = None
                        row[key + "_error"] = str(e)[:200]
                ranked = rank(d, FAMILY, "h100" if "H100" in gpu else "h200", "bf16")
                picks = {"planner": ranked[0].schedule}
                mma = next(r for r in ranked if r.schedule.kernels[0].options.engine != "wgmma")
                picks["mma.sync"] = mma.schedule
                wg = [r for r in ranked if r.schedule.kernels[0].options.engine == "wgmma"]
                if a.gqa:  # the model's best packed and unpacked wgmma tiles
                    for r in wg:
                        pk = attention_wgmma.config_of(FAMILY.problem(d), d, r.schedule).pack
                        picks.setdefault("wgmma_packed" if pk > 1 else "wgmma_unpacked", r.schedule)
                if a.all_configs:
                    for r in wg:
                        o = r.schedule.kernels[0].options
                        cfg = attention_wgmma.config_of(FAMILY.problem(d), d, r.schedule)
                        picks[f"wgmma_q{cfg.BQ}x{cfg.BX}s{o.stages}"] = r.schedule
                pred = {id(r.schedule): r.seconds for r in ranked}
                compiled = {key: compile_diagram(d, schedule=s) for key, s in picks.items()}
                if a.variants and wg:
                    best = attention_wgmma.config_of(FAMILY.problem(d), d, wg[0].schedule)
                    for ov, pp, pers in ((False, False, False), (False, False, True), (True, False, False),
                                         (True, False, True), (True, True, False)):
                        if pp and (best.consumers != 2 or not a.pingpong):
                            continue
                        cfg = dataclasses.replace(best, overlap=ov, pingpong=pp, persistent=pers)
                        key = (f"v_q{cfg.BQ}x{cfg.BX}s{cfg.stages}{'_2st' if ov else '_1st'}{'_pp' if pp else ''}"
                               f"{'_pers' if pers else ''}")
                        prog = attention_wgmma.lower_config(FAMILY, d, cfg)
                        picks[key] = prog.schedule
                        compiled[key] = CompiledDiagram(prog, arch="sm_90a")
                    default_l2 = attention_wgmma.L2_SECTION_BYTES
                    for mb in a.sections:
                        attention_wgmma.L2_SECTION_BYTES = int(mb * 2 ** 20)
                        cfg = dataclasses.replace(best, persistent=True)
                        prog = attention_wgmma.lower_config(FAMILY, d, cfg)
                        attention_wgmma.L2_SECTION_BYTES = default_l2
                        key = f"v_q{cfg.BQ}x{cfg.BX}s{cfg.stages}{'_2st' if cfg.overlap else '_1st'}_pers_l2_{mb:g}"
                        picks[key] = prog.schedule
                        compiled[key] = CompiledDiagram(prog, arch="sm_90a")
                for spec in a.extra:
                    dd, cons, bx, st, two, *more = (int(v) for v in spec.split(","))
                    if dd != D:
                        continue
                    pers = bool(more[0]) if more else bx in attention_wgmma.PERSISTENT.get(dd, ())
                    pp, one_p = (bool(v) for v in (*more[1:], 0, 0)[:2])
                    cfg = attention_wgmma.WgmmaAttentionConfig(dd, bx, cons, st, overlap=bool(two), persistent=pers,
                                                               pingpong=pp, one_p=one_p)
                    cfg = attention_wgmma.loop_for(cfg, *attention_wgmma.score_kinds(FAMILY.problem(d), d))
                    key = (f"x_q{cfg.BQ}x{bx}s{st}{'_2st' if cfg.overlap else '_1st'}{'_pp' if cfg.pingpong else ''}"
                           f"{'_1p' if cfg.one_p else ''}{'_pers' if pers else ''}")
                    prog = attention_wgmma.lower_config(FAMILY, d, cfg)
                    picks[key] = prog.schedule
                    compiled[key] = CompiledDiagram(prog, arch="sm_90a")
                for key, s in picks.items():
                    c = compiled[key]
                    out = c.empty_outputs(fill=float("nan"))
                    sec = timed(lambda: c(**ins, out=out), a.warmup, a.reps)
                    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, **sdpa_kw)
                    err = ((out["O"].view_as(ref).float() - ref.float()).norm() / ref.float().norm()).item()
                    row[key + "_pack"] = dict(c.program.launches[0].tunables).get("pack")
                    row[key] = flops / sec / 1e12
                    row[key + "_engine"] = s.kernels[0].options.engine
                    row[key + "_pred"] = flops / pred[id(s)] / 1e12 if id(s) in pred else None
                    row[key + "_err"] = err
                rows.append(row)
                extra = "  ".join(f"{k}={row[k]:.0f}" for k in row if k.startswith(("wgmma_", "v_q", "x_q"))
                                  and not k.endswith(("_engine", "_pred", "_err", "_pack")))
                print(f"{'causal' if causal else 'full  '} d={D:3d} seq={n:5d} b={b:2d} gqa={J}  flash={row['flash'] or 0:.0f} "
                      f"cudnn={row['cudnn'] or 0:.0f}  napkin={row['planner']:.0f} ({row['planner_engine']}, model "
                      f"{row['planner_pred']:.0f}, err {row['planner_err']:.1e})  mma.sync={row['mma.sync']:.0f}  "
                      f"x flash {row['planner'] / (row['flash'] or 1):.2f}  x cudnn {row['planner'] / (row['cudnn'] or 1):.2f}  {extra}",
                      flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
