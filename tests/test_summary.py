"""The typed Summary: summary.json written from it reads back into an equal Summary, byte for byte."""

from __future__ import annotations

import json

import pytest

from sim.api import simulate, write_results
from sim.outputs.writers import summary_json
from sim.scenario.load import scenario_from_dict
from sim.summary import Summary

# A small data-parallel run with the optional blocks a summary can carry: jitter and stragglers
# (percentiles), fp16 loss scaling (skipped steps), a run length (time and cost to train) and failures.
RUN = {
    "name": "summary-run",
    "cluster": {"nodes": 2, "gpus_per_node": 2, "gpu": "A100-80GB", "jitter": {"sigma": 0.05},
                "random_stragglers": {"probability": 0.2, "slowdown": 1.5}},
    "model": {"kind": "synthetic", "layers": 4, "forward_ms": 5, "params_per_layer": 50_000_000},
    "parallel": {"data": 4},
    "training": {"global_batch": 8, "train_steps": 100_000, "precision": "fp16",
                 "loss_scaling": {"kind": "dynamic", "overflow_steps": [1]}},
    "reliability": {"gpu_mtbf_hours": 2000, "checkpoint": {"interval": "auto", "write_GBps": 1.0},
                    "restart_s": 300, "monte_carlo_trials": 20},
    "simulation": {"steps": 3, "seed": 1},
}
COLLECTIVE = {
    "name": "summary-collective",
    "cluster": {"nodes": 1, "gpus_per_node": 4, "gpu": "A100-80GB"},
    "model": {"kind": "collective", "op": "all_reduce", "size_bytes": [1_000_000, 8_000_000]},
}


@pytest.mark.parametrize("data", [RUN, COLLECTIVE], ids=["training", "collective"])
def test_summary_json_round_trips_byte_identically(tmp_path, data):
    result = simulate(scenario_from_dict(data))
    write_results(result, tmp_path, charts=False, trace=False)
    text = (tmp_path / "summary.json").read_text(encoding="utf-8")
    back = Summary.from_dict(json.loads(text))
    assert summary_json(back) == text
    assert back == Summary.from_dict(result.summary.to_dict())  # the file lost nothing the run had


def test_training_summary_fields_and_mapping_view_agree():
    s = simulate(scenario_from_dict(RUN)).summary
    # The optional blocks this run has are present, as attributes and as keys.
    assert s.step_times_s is not None and len(s.step_times_s) == 3
    assert s.step_time_p50_s is not None and s.skipped_steps == 1
    assert s.reliability is not None and s.time_to_train_s == pytest.approx(100_000 * s.step_time_s)
    assert dict(s) == s.to_dict() and s["step_time_s"] == s.step_time_s and s.get("mfu") == s.mfu
    # A collective has no tokens: the key is absent, not null.
    c = simulate(scenario_from_dict(COLLECTIVE)).summary
    assert c.tokens_per_s is None and "tokens_per_s" not in c and "tokens_per_s" not in json.loads(summary_json(c))
    assert c.time_s == [r["time_s"] for r in c.collectives or []]


def test_an_unknown_summary_key_is_refused():
    s = simulate(scenario_from_dict(COLLECTIVE)).summary
    with pytest.raises(TypeError, match="no_such_figure"):
        Summary.from_dict({**s.to_dict(), "no_such_figure": 1.0})


def test_per_gpu_breakdown_by_hand():
    """GPU 0 computes [0, 2] and [3, 5] with a collective in flight over [1, 4]: busy 4 s, communication
    3 s of which 2 s overlap compute, so 1 s exposed, and 1 s idle in a 6 s window. GPU 1 computes [0, 1],
    communicates over [1, 3] (all exposed) and idles 3 s. A zero-length span and a communication span on
    the compute stream that is no compute category count as what their category says."""
    from sim.engine.timeline import COMM_TP, FORWARD, STREAM_COMM, STREAM_COMPUTE, Span, Timeline
    from sim.metrics import breakdown_by_gpu

    tl = Timeline(gpus=[0, 1])
    for gpu, stream, cat, start, dur in [(0, STREAM_COMPUTE, FORWARD, 0, 2), (0, STREAM_COMPUTE, FORWARD, 3, 2),
                                         (0, STREAM_COMM, COMM_TP, 1, 3), (0, STREAM_COMPUTE, FORWARD, 5.5, 0),
                                         (1, STREAM_COMPUTE, FORWARD, 0, 1), (1, STREAM_COMPUTE, COMM_TP, 1, 2)]:
        tl.add(Span(gpu, stream, "x", cat, float(start), float(dur), {}))
    out = breakdown_by_gpu(tl, [0, 1], 0.0, 6.0)
    assert out[0] == pytest.approx({"compute_s": 4.0, "exposed_comm_s": 1.0, "comm_s": 3.0, "idle_s": 1.0})
    assert out[1] == pytest.approx({"compute_s": 1.0, "exposed_comm_s": 2.0, "comm_s": 2.0, "idle_s": 3.0})
    clipped = breakdown_by_gpu(tl, [0], 1.5, 3.5)[0]  # the window cuts the spans
    assert clipped == pytest.approx({"compute_s": 1.0, "exposed_comm_s": 1.0, "comm_s": 2.0, "idle_s": 0.0})
