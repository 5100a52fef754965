"""Context parallelism: ring attention K/V bytes, activation memory / N, overlap, symmetry, bad input."""

from __future__ import annotations

import pytest

from sim.api import simulate
from sim.cost.reference import reference_profile
from sim.engine.timeline import BACKWARD, COMM_CP, FORWARD
from sim.errors import ScenarioError
from sim.hardware.gpu import GPU_PRESETS
from sim.hardware.links import INTRA_PRESETS
from sim.hardware.nccl import base_latency_s
from sim.scenario import scenario_from_dict


def _llama(cp: int, algorithm: str = "ring", symmetry: str = "off", **model) -> dict:
    """Llama-3 8B shapes, 2 layers, 32K tokens, TP 2 on one 8-GPU node; data fills the rest."""
    par = {"data": 8 // (2 * cp), "tensor": 2}
    if cp > 1:
        par.update(context=cp, context_attention=algorithm)
    return {"name": "cp", "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "H100-SXM", "gpu_speed_spread": 0.0},
            "model": {"kind": "transformer", "preset": "llama3-8b", "layers": 2, "seq_len": 32768, **model},
            "parallel": par, "training": {"global_batch": 2 * par["data"]},
            "simulation": {"symmetry": symmetry}}


@pytest.mark.parametrize("cp", [2, 4])
def test_kv_bytes_per_ring_step(cp):
    """Forward: K and V of s/cp tokens, b·(s/cp)·2·kv_dim/t·2 bytes, cp − 1 exchanges per attention;
    backward: K, V and their gradients, twice that."""
    res = simulate(scenario_from_dict(_llama(cp)))
    kv_dim, t, s, b = 8 * 128, 2, 32768, 1
    block = b * (s // cp) * 2 * kv_dim // t * 2
    spans = [x for x in res.timeline.spans if x.category == COMM_CP and x.gpu == 0]
    fwd = [x for x in spans if x.name.startswith("F")]
    bwd = [x for x in spans if x.name.startswith("B")]
    layers, mbs = 2, 2
    assert len(fwd) == len(bwd) == layers * mbs * (cp - 1)
    assert all(x.args["bytes"] == block for x in fwd) and all(x.args["bytes"] == 2 * block for x in bwd)
    # Each exchange moves its block over the GPU's NVLink (both ways at once for cp = 2).
    link = INTRA_PRESETS["nvlink4"]
    one = (block / (link.bandwidth_GBps * 1e9 * link.efficiency) + link.latency_us * 1e-6
           + base_latency_s("direct", "Simple"))  # NCCL's per-operation launch
    assert min(x.dur_s for x in fwd) == pytest.approx(one, rel=0.02)


def test_activation_memory_divides_by_n_and_flops_do_not():
    runs = {cp: simulate(scenario_from_dict(_llama(cp))).summary for cp in (1, 2, 4)}
    a1 = runs[1]["memory_by_stage"][0]["activations"]
    for cp in (2, 4):
        assert runs[cp]["memory_by_stage"][0]["activations"] == pytest.approx(a1 / cp, rel=1e-12)
    # Same tokens per GPU-step work: model FLOPs per sequence unchanged, the step about 1/cp as long.
    per_seq = {cp: runs[cp]["model_tflops_per_gpu"] * runs[cp]["step_time_s"] * 8 / runs[cp]["global_batch"]
               for cp in runs}
    assert per_seq[2] == pytest.approx(per_seq[1], rel=1e-12) and per_seq[4] == pytest.approx(per_seq[1], rel=1e-12)
    assert runs[4]["step_time_s"] < 0.6 * runs[2]["step_time_s"] < 0.6 * runs[1]["step_time_s"]


def test_ring_exchange_hides_behind_attention():
    """At 32K tokens the attention of one block outlasts its K/V transfer, so the ring adds almost nothing
    exposed, unlike gathering all K/V first."""
    res = simulate(scenario_from_dict(_llama(4)))
    attn = [x for x in res.timeline.spans if x.gpu == 0 and x.category == FORWARD and " attention " in x.name]
    kv = [x for x in res.timeline.spans if x.gpu == 0 and x.category == COMM_CP and x.name.startswith("F")]
    assert min(a.dur_s for a in attn) > max(k.dur_s for k in kv)
    ring = res.summary["exposed_comm_s"]
    gathered = simulate(scenario_from_dict(_llama(4, "all_gather"))).summary["exposed_comm_s"]
    assert ring < gathered


def test_symmetric_matches_every_gpu():
    d = _llama(2)
    d["cluster"] = {"nodes": 2, "gpus_per_node": 8, "gpu": "H100-SXM", "gpu_speed_spread": 0.0}
    d["parallel"]["data"] = 4
    d["training"]["global_batch"] = 8
    on = simulate(scenario_from_dict({**d, "simulation": {"symmetry": "on"}})).summary
    off = simulate(scenario_from_dict({**d, "simulation": {"symmetry": "off"}})).summary
    # Not exact since the NCCL protocol/launch model came in: the representative's K/V exchanges and the
    # TP collectives around them interleave slightly differently from the full run's (0.2 %).
    assert on["step_time_s"] == pytest.approx(off["step_time_s"], rel=5e-3)


@pytest.mark.parametrize("cp", [2, 4])
def test_ring_bookkeeping_kernels_on_the_timeline(cp):
    """Transformer Engine's kernels around the ring, by hand: Q/O/dQ hold E = b·(s/cp)·h/t elements and K
    (or V) Ekv = b·(s/cp)·kv_dim/t, 2 bytes each. Forward: the K/V pack reads and writes K and V (8·Ekv
    bytes); step 0's output rescale reads one tensor and writes one (4E), each later step's reads two and
    writes one (6E), each with the fp32 log-sum-exp (4·E/d bytes), and cp − 1 log-sum-exp merges (3 × that).
    Backward: the pack again, then per step dQ, dK and dV copied (step 0: 4 bytes per element) or added (6).
    Every kernel streams at the H100 reference profile's bandwidth and pays one launch."""
    res = simulate(scenario_from_dict(_llama(cp)))
    gpu = GPU_PRESETS["H100-SXM"]
    bw = gpu.memory_bw_Bps * reference_profile("H100-SXM").memory_fraction
    launch = gpu.kernel_launch_s
    t, s, b, h, kv_dim, hd = 2, 32768, 1, 4096, 8 * 128, 128
    e_q, e_kv = b * (s // cp) * h // t, b * (s // cp) * kv_dim // t
    lse = 4 * e_q / hd
    pack = 8 * e_kv / bw + launch
    out = (4 * e_q + lse + (cp - 1) * (6 * e_q + lse) + (cp - 1) * 3 * lse) / bw + (2 * cp - 1) * launch
    grads = (4 + 6 * (cp - 1)) * (e_q + 2 * e_kv) / bw + 3 * cp * launch
    spans = [x for x in res.timeline.spans if x.gpu == 0 and " cp." in x.name]
    layers, mbs = 2, 2
    by = {}
    for x in spans:
        by.setdefault((x.category, x.name.split(" ", 2)[2]), []).append(x.dur_s)
    assert sorted(by) == sorted([(FORWARD, "cp.kv_pack"), (FORWARD, f"cp.out_correction +{2 * cp - 2}"),
                                 (BACKWARD, "cp.kv_pack"), (BACKWARD, f"cp.dq_correction +{3 * cp - 1}")])
    assert all(len(v) == layers * mbs for v in by.values())
    assert by[(FORWARD, "cp.kv_pack")][0] == pytest.approx(pack, rel=1e-9)
    assert by[(FORWARD, f"cp.out_correction +{2 * cp - 2}")][0] == pytest.approx(out, rel=1e-9)
    assert by[(BACKWARD, f"cp.dq_correction +{3 * cp - 1}")][0] == pytest.approx(grads, rel=1e-9)


def test_selective_recompute_reruns_the_ring_bookkeeping():
    """Selective recomputation re-runs the attention's forward, ring and bookkeeping kernels with it."""
    d = _llama(2)
    d["training"]["checkpointing"] = "selective"
    res = simulate(scenario_from_dict(d))
    rec = [x for x in res.timeline.spans if x.gpu == 0 and x.category == "recompute"]
    fwd = [x for x in res.timeline.spans if x.gpu == 0 and x.category == FORWARD and x.name.startswith("F0 L0 ")]
    ring = sum(x.dur_s for x in fwd if " attention" in x.name) + sum(x.dur_s for x in fwd if " cp." in x.name)
    assert rec and rec[0].dur_s == pytest.approx(ring, rel=1e-6)


@pytest.mark.parametrize("change, expect", [
    ({"model": {"seq_len": 32769}}, "seq_len"),
    ({"parallel": {"data": 4, "context": 1, "context_attention": "ring"}}, "applies to context parallelism"),
    ({"parallel": {"data": 4, "tensor": 2, "context": 2}}, "data×tensor×pipeline×context"),
    ({"model": {"attention": "standard"}}, "needs fused (flash) attention"),
])
def test_bad_context_input(change, expect):
    d = _llama(2)
    for key, value in change.items():
        d[key] = {**d[key], **value}
    with pytest.raises(ScenarioError) as e:
        scenario_from_dict(d)
    assert expect in str(e.value) and "\n" not in str(e.value)
