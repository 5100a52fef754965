"""One transformer layer's forward and backward, read off the timeline (summary ``layer_time_s``), against
the builder's priced blocks and the simulated TP collectives."""

from __future__ import annotations

import pytest

from sim.api import simulate
from sim.build import build_job, cost_model_for
from sim.cli import summary_table
from sim.engine.timeline import COMM_TP
from sim.outputs.report import _summary_rows
from sim.scenario import scenario_from_dict
from tests.test_training_sim import _tiny


def _blocking_tp(checkpointing: str) -> dict:
    """Megatron-LM 2021 (blocking TP collectives), TP 2 × DP 2 on one node, no pipeline, identical GPUs."""
    return _tiny(training__kernels="megatron-lm-2021", training__checkpointing=checkpointing,
                 parallel__data=2, parallel__tensor=2, parallel__pipeline=1, training__global_batch=8,
                 cluster__nodes=1, cluster__gpus_per_node=4, cluster__gpu_speed_spread=0.0,
                 simulation__symmetry="off")


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_layer_time_is_its_priced_blocks_plus_its_collectives(checkpointing):
    sc = scenario_from_dict(_blocking_tp(checkpointing))
    res = simulate(sc)
    lt = res.summary["layer_time_s"]
    job, _ = build_job(sc, cost_model_for(sc))
    layer = job.chunks[0].layers[lt["layer"]]
    assert lt["forward_compute_s"] == pytest.approx(sum(b.dur_s for b in layer.forward), rel=1e-9)
    # the input-gradient blocks, then the weight gradients and their accumulation into main_grad
    assert lt["backward_compute_s"] == pytest.approx(sum(b.dur_s for b in (*layer.backward, *layer.weight)),
                                                     rel=1e-9)
    assert lt["recompute_s"] == pytest.approx(sum(b.dur_s for b in layer.recompute), rel=1e-9)
    assert (lt["recompute_s"] > 0) == (checkpointing == "full")
    # Blocking collectives: the layer's wall time is its kernels and its all-reduces back to back.
    assert lt["forward_s"] == pytest.approx(lt["forward_compute_s"] + lt["tp_comm_forward_s"], rel=1e-9)
    assert lt["backward_s"] == pytest.approx(lt["backward_compute_s"] + lt["recompute_s"]
                                             + lt["tp_comm_backward_s"], rel=1e-9)
    # Two all-reduces forward (after attention, after the MLP), two backward, two more when recomputed.
    g, mb = lt["gpu"], lt["microbatch"]
    mine = [s for s in res.timeline.spans if s.gpu == g and s.category == COMM_TP
            and s.name.split(" ")[1] == f"L{lt['layer']}" and s.name[1:].split(" ")[0] == str(mb)]
    assert len(mine) == (6 if checkpointing == "full" else 4)
    assert lt["tp_comm_forward_s"] + lt["tp_comm_backward_s"] == pytest.approx(sum(s.dur_s for s in mine))
    assert "one layer" in summary_table(res.summary)
    assert any(label.startswith("one layer") for label, _ in _summary_rows(res.summary))


def test_no_layer_time_for_models_without_transformer_layers():
    res = simulate(scenario_from_dict({"name": "syn", "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "A100-80GB"},
                                       "model": {"kind": "synthetic", "layers": 2, "forward_ms": 1, "backward_ms": 2,
                                                 "params_per_layer": 1000},
                                       "parallel": {"data": 2}, "training": {"global_batch": 2}}))
    assert "layer_time_s" not in res.summary


def test_zero_bubble_weight_gradients_are_counted_apart():
    """ZB-H1 runs each layer's weight gradients apart from its backward: they are reported as
    weight_apart_s; 1F1B runs them inside the backward (weight_apart_s 0)."""
    def lt(schedule):
        spec = _blocking_tp("none")
        spec["parallel"].update(pipeline=2, data=1, schedule=schedule)
        return simulate(scenario_from_dict(spec)).summary["layer_time_s"]

    zb, f1 = lt("zb-h1"), lt("1f1b")
    assert zb["weight_apart_s"] > 0 and f1["weight_apart_s"] == 0
    assert zb["backward_compute_s"] < f1["backward_compute_s"]
