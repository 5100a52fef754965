"""The closed forms against every seed numerical and hand-worked collective costs."""

from __future__ import annotations

import math

import pytest

from sim import analytic as an
from sim.errors import ScenarioError

# ------------------------------------------------------------------------------------- seed numericals


def test_seed_global_batch():
    assert an.global_batch(8, 32) == 256
    assert an.global_batch(16, 24) == 384


def test_seed_pipeline_s4_m8_t10ms():
    assert an.pipeline_time(4, 8, 10e-3) == pytest.approx(110e-3)
    assert an.pipeline_speedup(4, 8) == pytest.approx(2.91, abs=0.005)
    assert an.pipeline_speedup(4, 8) == pytest.approx(8 * 4 * 10 / 110)
    assert an.pipeline_utilisation(4, 8) == pytest.approx(0.727, abs=0.0005)


def test_seed_pipeline_s6_m18_t5ms():
    assert an.pipeline_time(6, 18, 5e-3) == pytest.approx(115e-3)
    assert an.pipeline_utilisation(6, 18) == pytest.approx(0.783, abs=0.0005)


def test_seed_training_run_480_over_75_minutes():
    assert an.speedup(480, 75) == pytest.approx(6.4)
    assert an.efficiency(480, 75, 8) == pytest.approx(0.8)
    assert an.overhead(480, 75, 8) == pytest.approx(120)


def test_seed_practice_900s_over_140s():
    assert an.speedup(900, 140) == pytest.approx(6.43, abs=0.005)
    assert an.efficiency(900, 140, 8) == pytest.approx(0.80, abs=0.005)
    assert an.overhead(900, 140, 8) == pytest.approx(220)


def test_seed_checkpoint_memory():
    assert an.full_activation_memory(48, 20e6) == pytest.approx(960e6)
    assert an.checkpoint_memory(8, 20e6) == pytest.approx(160e6)
    assert an.full_activation_memory(60, 12e6) == pytest.approx(720e6)
    assert an.checkpoint_memory(10, 12e6) == pytest.approx(120e6)


def test_seed_precision_memory():
    assert an.tensor_bytes(1e9, "fp32") == 4e9
    assert an.tensor_bytes(1e9, "fp16") == 2e9
    assert an.MIXED_ADAM_BYTES_PER_PARAM == 2 + 2 + 12


def test_seed_loss_scaling():
    scaled = an.scale_loss(3e-8, 1024)
    assert scaled == pytest.approx(3.072e-5, rel=1e-12)
    assert an.unscale(scaled, 1024) == pytest.approx(3e-8, rel=1e-12)


def test_dp_step_is_slowest_worker_plus_all_reduce():
    assert an.dp_step_time([0.10, 0.12, 0.11], 0.03) == pytest.approx(0.15)


# --------------------------------------------------------------------------------------------- bubbles


def test_bubble_fraction_is_one_minus_utilisation():
    for p, m in [(4, 8), (6, 18), (8, 64)]:
        assert an.bubble_fraction(p, m) == pytest.approx(1 - an.pipeline_utilisation(p, m))
    assert an.bubble_ratio(4, 8) == pytest.approx(3 / 8)


def test_interleaved_bubble_divides_by_v():
    assert an.bubble_ratio(8, 16, v=4) == pytest.approx(7 / 64)
    assert an.bubble_fraction(8, 16, v=4) == pytest.approx(7 / (64 + 7))


def test_zero_bubble_formulas():
    p, tf, tb, tw = 4, 1.0, 1.0, 1.0
    assert an.one_f_one_b_bubble_time(p, tf, tb, tw) == pytest.approx(9.0)
    assert an.zb_h1_bubble_time(p, tf, tb, tw) == pytest.approx(3.0)  # a third of 1F1B's
    assert an.zb_h2_bubble_time(p, tf, tb, tw) == 0.0
    assert an.zb_h2_bubble_time(p, 2.0, 2.0, 1.0) == pytest.approx(6.0)


# ----------------------------------------------------------------------------------------- collectives

ALPHA, BW, N = 5e-6, 100e9, 1e9


def test_ring_collectives():
    p = 8
    assert an.ring_all_reduce_time(p, N, ALPHA, BW) == pytest.approx(2 * 7 * (ALPHA + N / (8 * BW)))
    assert an.ring_reduce_scatter_time(p, N, ALPHA, BW) == pytest.approx(7 * (ALPHA + N / (8 * BW)))
    assert an.ring_all_gather_time(p, N, ALPHA, BW) == pytest.approx(7 * (ALPHA + N / (8 * BW)))
    # Bandwidth term alone: 2(p−1)/p · N/B = 1.75 × 10 ms.
    assert an.ring_all_reduce_time(p, N, 0.0, BW) == pytest.approx(17.5e-3)
    assert an.ring_all_reduce_time(1, N, ALPHA, BW) == 0.0


def test_all_reduce_is_reduce_scatter_plus_all_gather():
    p = 16
    rs_ag = an.ring_reduce_scatter_time(p, N, ALPHA, BW) + an.ring_all_gather_time(p, N, ALPHA, BW)
    assert an.ring_all_reduce_time(p, N, ALPHA, BW) == pytest.approx(rs_ag)


def test_tree_and_chain_broadcast():
    assert an.tree_broadcast_time(8, N, ALPHA, BW) == pytest.approx(3 * (ALPHA + N / BW))
    assert an.tree_broadcast_time(5, N, ALPHA, BW) == pytest.approx(3 * (ALPHA + N / BW))  # ⌈log2 5⌉
    assert an.tree_reduce_time(16, N, ALPHA, BW) == pytest.approx(4 * (ALPHA + N / BW))
    assert an.tree_broadcast_time(1, N, ALPHA, BW) == 0.0
    k = 10
    assert an.pipelined_chain_broadcast_time(8, N, ALPHA, BW, k) == pytest.approx(
        (7 + 9) * (ALPHA + N / (k * BW))
    )
    # One chunk degenerates to store-and-forward along the chain.
    assert an.pipelined_chain_broadcast_time(8, N, ALPHA, BW, 1) == pytest.approx(7 * (ALPHA + N / BW))


def test_parameter_server_root_link_shared():
    assert an.parameter_server_time(8, N, ALPHA, BW) == pytest.approx(2 * (ALPHA + 7 * N / BW))


def test_hierarchical_all_reduce():
    nodes, g = 4, 8
    a_i, b_i, a_e, b_e = 2e-6, 300e9, 10e-6, 50e9
    expected = 2 * (g - 1) * (a_i + N / (g * b_i)) + 2 * (nodes - 1) * (a_e + N / (g * nodes * b_e))
    assert an.hierarchical_all_reduce_time(nodes, g, N, a_i, b_i, a_e, b_e) == pytest.approx(expected)


def test_send_recv():
    assert an.send_recv_time(N, ALPHA, BW) == pytest.approx(ALPHA + 10e-3)


def test_nccl_tests_busbw_factors():
    p = 8
    assert an.busbw_factor("all_reduce", p) == pytest.approx(1.75)
    for c in ("all_gather", "reduce_scatter", "all_to_all"):
        assert an.busbw_factor(c, p) == pytest.approx(0.875)
    for c in ("broadcast", "reduce", "send_recv"):
        assert an.busbw_factor(c, p) == 1.0
    t = an.ring_all_reduce_time(p, N, 0.0, BW)
    assert an.algbw(N, t) == pytest.approx(N / t)
    # A bandwidth-bound ring all-reduce reports busbw equal to the link bandwidth.
    assert an.busbw("all_reduce", p, N, t) == pytest.approx(BW)
    with pytest.raises(ScenarioError):
        an.busbw_factor("gossip", p)


# ------------------------------------------------------------------------------------------------- ZeRO


def test_zero_memory_closed_forms():
    psi, nd = 7.5e9, 64
    got = [an.zero_memory_bytes(psi, s, nd) / 1e9 for s in range(4)]
    assert got == pytest.approx([120.0, 31.40625, 16.640625, 1.875])
    assert round(got[1], 2) == 31.41 and round(got[2], 2) == 16.64


def test_zero_comm():
    psi = 1e9
    assert [an.zero_comm_volume(psi, s) for s in range(4)] == [2 * psi, 2 * psi, 2 * psi, 3 * psi]
    assert an.zero_comm_bytes(psi, 3) / an.zero_comm_bytes(psi, 0) == pytest.approx(1.5)
    assert an.zero_comm_bytes(psi, 0, bytes_per_elem=2) == 4 * psi


# ------------------------------------------------------------------------------------------------ FLOPs


def test_korthikanti_forms_and_mfu():
    B, L, s, h, V = 1, 1, 6, 1, 12
    # 72·1·1·6·1·(1 + 1 + 1) = 1296; with full recompute 96·6·(1 + 1 + 0.75) = 1584.
    assert an.korthikanti_model_flops(B, L, s, h, V) == pytest.approx(1296)
    assert an.korthikanti_hardware_flops_full_recompute(B, L, s, h, V) == pytest.approx(1584)
    assert an.mfu(1e18, 10.0, 2e17) == pytest.approx(0.5)
    assert math.isclose(an.efficiency(100, 25, 4), 1.0)
