"""The mma.sync and SIMT contraction templates run one output tile a block: the block issues its
first ``STAGES - 1`` chunks at once, waits for them, and multiplies its last chunks after its last
load. Its neighbours on the SM started with it and do the same, so in a loop of few steps nothing
hides the fill: the family states ``fill_share = min(1, (STAGES - 1) / steps)`` and the model adds
that share of the loop's smaller time (compute or memory) to the larger.

Measured on an H200 (bf16, 512 products of 128 x 128 x 128): the mma.sync 128 x 128 tile (two
steps of 64, three stages) ran 18.3 us of kernel where the overlapped roofline said 10.7; the
persistent wgmma tile, whose producer loads the next tile behind the current one, 12.8.
"""

from __future__ import annotations

import pytest

from napkin.codegen import select
from napkin.codegen.families.contraction import FAMILY, MMA_CONFIGS, WGMMA_CONFIGS, MatmulConfig
from napkin.diagrams import library


def _shape_and_kernel(bd, cfg, gpu="h200"):
    from napkin.perfmodel.predict import predict_schedule

    s = FAMILY.schedule(bd, cfg, gpu=gpu).padded_view()
    shape = select.launch_shape(bd, FAMILY, s, gpu)
    return shape, predict_schedule(s, gpu, launch=shape, family="contraction").kernels[0]


def _bmm(k: int, n: int = 512):
    return library.get("batched_matmul").with_dtype("bf16").bind(n=n, a=128, b=k, c=128)


@pytest.mark.parametrize("k, steps", [(128, 2), (192, 3), (4096, 64), (100, 2)])
def test_the_mma_sync_tile_states_the_share_of_its_fill(k, steps):
    cfg = MatmulConfig(False, *MMA_CONFIGS[4])  # 128 x 128 x 64, three stages: two chunks ahead
    shape, kp = _shape_and_kernel(_bmm(k), cfg)
    assert shape.fill_share == pytest.approx(min(1.0, 2 / steps))
    r = kp.roofline
    small, large = sorted((r.compute_time_s, r.memory_time_s))
    assert r.tail_body_s == pytest.approx(large + shape.fill_share * small)  # both after the tail


def test_a_split_loop_counts_the_steps_of_one_split():
    d = library.get("matmul").with_dtype("bf16").bind(a=64, b=65536, c=64)
    cfg = MatmulConfig(False, *MMA_CONFIGS[6], splits=8)  # BK 32, four stages: three chunks ahead
    shape, _ = _shape_and_kernel(d, cfg)
    assert shape.fill_share == pytest.approx(3 / (65536 // 32 // 8))


def test_the_persistent_wgmma_tile_states_none():
    shape, kp = _shape_and_kernel(_bmm(128), MatmulConfig(False, *WGMMA_CONFIGS[3], wgmma=True))
    assert shape.fill_share == 0.0 and kp.roofline.fill_share == 0.0


def test_a_short_sum_over_many_products_is_planned_on_wgmma():
    """The measured case: with the fill priced, the planner's first candidate on the H200 profile is
    the wgmma tile, and the mma.sync tile it used to pick is predicted slower than it."""
    ranked = select.rank(_bmm(128), FAMILY, select.resolve_gpu("h200"), "bf16")
    assert ranked[0].schedule.kernels[0].options.engine == "wgmma"
    mma = MatmulConfig(False, *MMA_CONFIGS[4])
    _, kp_mma = _shape_and_kernel(_bmm(128), mma)
    _, kp_wg = _shape_and_kernel(_bmm(128), MatmulConfig(False, *WGMMA_CONFIGS[3], wgmma=True))
    assert kp_mma.seconds > kp_wg.seconds
    # a long sum keeps its ring full: the fill is a small share there
    shape, _ = _shape_and_kernel(_bmm(4096, n=8), mma)
    assert shape.fill_share < 0.05
