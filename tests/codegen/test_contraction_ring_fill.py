"""The mma.sync contraction template runs one output tile a block: the block issues its first
``STAGES - 1`` chunks at once, waits for them, and multiplies its last chunks after its last load.
Its neighbours on the SM started with it and do the same, so in a loop of few steps nothing hides
the fill: the family states ``fill_share = min(1, (STAGES - 1) / steps)`` and the model adds that
share of the smaller of the loop's compute and HBM times to the larger (all of it up to two blocks
an SM, then divided among them). The fp32 template, which stages one chunk through registers, and
the persistent wgmma template state none.

Measured on an H200 (bf16, 512 products of 128 x 128 x 128): the mma.sync 128 x 128 tile (two
steps of 64, three stages) ran 18.3 us of kernel where the overlapped roofline said 10.7; the
persistent wgmma tile, whose producer loads the next tile behind the current one, 12.8.
"""

from __future__ import annotations

import pytest
from napkin_test_support import contraction_prediction

from napkin.codegen import select
from napkin.codegen.families.contraction import (FAMILY, MMA_CONFIGS, TF32X3_SMALL_CONFIGS, WGMMA_CONFIGS,
                                                 MatmulConfig)
from napkin.diagrams import library
from napkin.perfmodel.predict import exposed_fill_share


def _shape_and_kernel(bd, cfg):
    return contraction_prediction(bd, cfg, "h200")


def _bmm(k: int, n: int = 512):
    return library.get("batched_matmul").with_dtype("bf16").bind(n=n, a=128, b=k, c=128)


@pytest.mark.parametrize("k, steps", [(128, 2), (192, 3), (4096, 64), (100, 2)])
def test_the_mma_sync_tile_states_the_share_of_its_fill(k, steps):
    cfg = MatmulConfig(False, *MMA_CONFIGS[4])  # 128 x 128 x 64, three stages: two chunks ahead
    shape, kp = _shape_and_kernel(_bmm(k), cfg)
    assert shape.fill_share == pytest.approx(min(1.0, 2 / steps))
    r = kp.roofline
    # two blocks an SM fill in step: the whole share is exposed
    assert kp.blocks_per_sm == 2 and r.fill_share == pytest.approx(shape.fill_share)
    small = min(r.compute_time_s, r.transfer_s["HBM"])  # the fill waits on HBM
    assert r.tail_body_s == pytest.approx(max(r.compute_time_s, r.memory_time_s) + r.fill_share * small)


def test_more_blocks_an_sm_hide_part_of_the_fill():
    d = library.get("batched_matmul").with_dtype("bf16").bind(n=2048, a=64, b=64, c=64)
    cfg = MatmulConfig(False, *MMA_CONFIGS[7])  # 64 x 64 x 32, four stages, four blocks an SM
    shape, kp = _shape_and_kernel(d, cfg)
    assert shape.fill_share == 1.0 and kp.blocks_per_sm == 4
    assert kp.roofline.fill_share == pytest.approx(exposed_fill_share(1.0, 4)) == pytest.approx(0.5)


def test_a_split_loop_counts_the_steps_of_one_split():
    d = library.get("matmul").with_dtype("bf16").bind(a=64, b=65536, c=64)
    cfg = MatmulConfig(False, *MMA_CONFIGS[6], splits=8)  # BK 32, four stages: three chunks ahead
    shape, _ = _shape_and_kernel(d, cfg)
    assert shape.fill_share == pytest.approx(3 / (65536 // 32 // 8))


def test_the_persistent_wgmma_tile_and_the_fp32_template_state_none():
    shape, kp = _shape_and_kernel(_bmm(128), MatmulConfig(False, *WGMMA_CONFIGS[3], wgmma=True))
    assert shape.fill_share == 0.0 and kp.roofline.fill_share == 0.0
    fp32 = library.get("batched_matmul").with_dtype("fp32").bind(n=4096, a=32, b=64, c=32)
    shape, kp = _shape_and_kernel(fp32, MatmulConfig(True, *TF32X3_SMALL_CONFIGS[0], tf32x3=True))
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
