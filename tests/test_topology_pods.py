"""A three-level fat tree: pods of leaves under their spines, joined by an oversubscribed core."""

from __future__ import annotations

import pytest
import simpy

from sim.api import simulate
from sim.engine.network import Network
from sim.hardware.topology import Topology
from sim.scenario.load import load_scenario
from tests.helpers import INTER, INTRA

BW = INTER.bandwidth_Bps


def pods(nodes: int = 8, nodes_per_leaf: int = 2, nodes_per_pod: int | None = 4, pod_over: float = 1.0,
         over: float = 1.0) -> Topology:
    return Topology(nodes, 1, INTRA, INTER, 1, nodes_per_leaf=nodes_per_leaf, oversubscription=over,
                    nodes_per_pod=nodes_per_pod, pod_oversubscription=pod_over)


def test_routes_cross_the_core_only_between_pods() -> None:
    t = pods()
    assert t.pods == 2 and t.leaves == 4 and t.leaves_per_pod == 2
    # same leaf: NICs only; same pod, other leaf: through the pod's spine; other pod: through the core too
    assert len(t.route_links(0, 1)) == 2
    same_pod = t.route_links(0, 2)
    assert len(same_pod) == 4 and not set(same_pod) & set(t.pod_up + t.pod_down)
    across = t.route_links(0, 4)
    assert across == (t.nic_up[0][0], t.leaf_up[0], t.pod_up[0], t.pod_down[1], t.leaf_down[2], t.nic_down[4][0])


def test_core_capacity_is_the_pods_uplinks_over_both_ratios() -> None:
    """A pod of 4 one-NIC nodes under leaves at 2:1 sends up 4·BW/2 and reaches the core with 1/3 of that."""
    t = pods(over=2.0, pod_over=3.0)
    assert t.capacity_Bps[t.pod_up[0]] == pytest.approx(4 * BW / 2 / 3)
    assert t.capacity_Bps[t.leaf_up[0]] == pytest.approx(2 * BW / 2)
    # a last pod with fewer nodes gets its own share: 6 nodes in pods of 4 leave 2
    t6 = pods(nodes=6, pod_over=3.0)
    assert t6.pods == 2 and t6.capacity_Bps[t6.pod_up[1]] == pytest.approx(2 * BW / 3)


def test_no_pods_keeps_the_two_level_tree() -> None:
    two, three = pods(nodes_per_pod=None), pods(nodes_per_pod=8)
    assert two.pods == three.pods == 1 and not two.pod_up and not three.pod_up
    assert two.route_links(0, 7) == three.route_links(0, 7)
    assert len(two.capacity_Bps) == len(three.capacity_Bps)


def _finish_times(t: Topology, pairs: list[tuple[int, int]], size: float) -> list[float]:
    """When each of ``size``-byte transfers started together over ``pairs`` arrives (no latency)."""
    env = simpy.Environment()
    net = Network(env, t.capacity_Bps)
    done: list[float] = [0.0] * len(pairs)
    for i, (a, b) in enumerate(pairs):
        ev = net.transfer_event([(t.route_links(a, b), 1.0)], size, 0.0)
        ev.callbacks.append(lambda _e, i=i: done.__setitem__(i, env.now))
    env.run()
    return done


def test_flows_between_pods_share_the_core_link() -> None:
    """Four flows from pod 0 to pod 1 at once: the core link of 4·BW/4 = BW carries them at BW/4 each, so
    they end at 4·size/BW; inside a pod the same four flows run at line rate (size/BW)."""
    size = 1e9
    cross = [(0, 4), (1, 5), (2, 6), (3, 7)]
    inside = [(0, 2), (1, 3), (2, 0), (3, 1)]
    t = pods(pod_over=4.0)
    assert _finish_times(t, cross, size) == pytest.approx([4 * size / BW] * 4)
    assert _finish_times(t, inside, size) == pytest.approx([size / BW] * 4)
    assert _finish_times(pods(pod_over=1.0), cross, size) == pytest.approx([size / BW] * 4)


def _job(topology: str, symmetry: str = "off", *overrides: str) -> dict:
    """GPT-3 1.3B over 8 nodes of 2 GPUs with ``topology``; TP 2 × DP 8 unless ``overrides`` say otherwise."""
    sc = load_scenario("scenarios/gpt3-1.3b-16xa100.yaml", [
        "cluster.nodes=8", "cluster.gpus_per_node=2", "cluster.nics_per_node=2", "parallel.data=8",
        "parallel.tensor=2", "parallel.pipeline=1", "training.global_batch=16", *overrides,
        f"cluster.topology={topology}", f"simulation.symmetry={symmetry}"])
    return simulate(sc).summary


# PP 2 × DP 8 with identical GPUs: two stages, each of whose sends may cross the tree's top
TWO_STAGES = ("parallel.tensor=1", "parallel.pipeline=2", "cluster.gpu_speed_spread=0")


PODS = "{{kind: fat-tree, nodes_per_leaf: 2, nodes_per_pod: 4, pod_oversubscription: {}}}"


def test_an_oversubscribed_core_slows_a_ring_that_crosses_it() -> None:
    """TP 2 × DP 8: each of the two gradient rings crosses from one half of the nodes to the other twice."""
    fast, slow = _job(PODS.format(1.0)), _job(PODS.format(16.0))
    assert slow["step_time_s"] > fast["step_time_s"]
    assert slow["exposed_comm_s"] > fast["exposed_comm_s"]
    # Pods of 4 nodes with non-blocking leaves and a 16:1 core are, for this traffic, a two-level tree with
    # leaves of 4 nodes at 16:1: the same bottleneck, the same step to the last bit.
    two_level = _job("{kind: fat-tree, nodes_per_leaf: 4, oversubscription: 16}")
    assert slow["step_time_s"] == two_level["step_time_s"]
    # The symmetric run simulates one tensor rank and still sees the other's ring on the core link (within
    # the 0.2 % the README gives symmetry on shared links; 0.07 % here, as on the two-level tree).
    assert _job(PODS.format(16.0), "on")["step_time_s"] == pytest.approx(slow["step_time_s"], rel=2e-3)


@pytest.mark.parametrize("topology", ["{kind: fat-tree, nodes_per_leaf: 4, oversubscription: 16}",
                                      PODS.format(16.0)])
def test_symmetry_sees_every_node_of_a_stage_on_an_oversubscribed_tree(topology: str) -> None:
    """Two stages on two leaves: the eight pipelines' sends all cross the 16:1 spine. A symmetric run
    simulates one GPU per stage; the sends of the other nodes' GPUs of its stage must load the spine too
    (they did not before December 2026: the run was 41 % fast). With identical GPUs it equals the run of
    every GPU."""
    def step(symmetry: str) -> float:
        return _job(topology, symmetry, *TWO_STAGES)["step_time_s"]

    assert step("on") == pytest.approx(step("off"), rel=1e-9)


@pytest.mark.parametrize("zero", [1, 2, 3])
@pytest.mark.parametrize("extra", [(), TWO_STAGES[:2], (*TWO_STAGES[:2], "parallel.order=tp-pp-dp")],
                         ids=["tp2-dp8", "pp2-dp8", "pp2-dp8-meta"])
def test_sharded_data_parallelism_routes_rings_only_and_stays_exact(zero: int, extra: tuple[str, ...]) -> None:
    """Under ZeRO 1–3 every data-parallel collective that moves data is a ring (reduce-scatter, all-gather),
    so the symmetry analysis routes ring neighbours only (``Symmetry.ring_routes``), not every edge a double
    binary tree could use; on the 16:1 tree a symmetric run still equals the run of every GPU."""
    topology = "{kind: fat-tree, nodes_per_leaf: 4, oversubscription: 16}"
    ov = ("cluster.gpu_speed_spread=0", f"parallel.zero={zero}", *extra)
    assert _job(topology, "on", *ov)["step_time_s"] == pytest.approx(_job(topology, "off", *ov)["step_time_s"],
                                                                    rel=1e-9)


def test_metas_rank_order_as_its_paper_draws_it() -> None:
    """Llama 3 paper §3.3.2: 16 GPUs as [TP, CP, PP, DP] = 2 each: GPU0 and GPU1 share a TP group, GPU0 and
    GPU2 a CP group, GPU0 and GPU4 a PP group, GPU0 and GPU8 a DP group (dtsim's data group holds the CP
    ranks too: gradients are summed over both)."""
    from sim.parallel.layout import Layout

    lay = Layout(dp=4, tp=2, pp=2, cp=2, order="tp-pp-dp")
    assert lay.tp_group(0) == [0, 1] and lay.cp_group(0) == [0, 2] and lay.stage_peer(0, 1) == 4
    assert lay.dp_group(0) == [0, 2, 8, 10]
    mega = Layout(dp=4, tp=2, pp=2, cp=2)
    for layout in (lay, mega):
        assert sorted(layout.rank(*layout.coords(r)) for r in range(16)) == list(range(16))
        assert all(layout.coords(layout.rank(d, t, p)) == (d, t, p)
                   for d in range(4) for t in range(2) for p in range(2))
    assert mega.stage_peer(0, 1) == 8  # Megatron's order: a stage is a block of T·D ranks


def _ordered(order: str, symmetry: str, topology: str = PODS.format(16.0)) -> float:
    return _job(topology, symmetry, *TWO_STAGES, f"parallel.order={order}")["step_time_s"]


def test_replicas_kept_together_send_between_stages_inside_a_pod() -> None:
    """Megatron's order puts stage 0 in one pod and stage 1 in the other, so every pipeline send crosses the
    16:1 core; Meta's keeps each replica in a pod and sends the gradient rings across instead. Symmetric runs
    equal the runs of every GPU in Meta's order too (Megatron's: the test above), including when a node holds
    both stages."""
    megatron, meta = _ordered("tp-dp-pp", "off"), _ordered("tp-pp-dp", "off")
    # here the gradient rings (≈ 2.6 GB of fp32 gradients per GPU) outweigh the pipeline sends (8 MB per
    # micro-batch each way): keeping the replicas together is the slower choice for this small model
    assert meta > 1.5 * megatron
    assert _ordered("tp-pp-dp", "on") == pytest.approx(meta, rel=1e-9)
    # one node holds both stages of a replica (TP 1 < 2 GPUs per node): the executor's shortcuts step aside
    flat = "{kind: fat-tree, nodes_per_leaf: 4, oversubscription: 1}"
    assert _ordered("tp-pp-dp", "on", flat) == pytest.approx(_ordered("tp-pp-dp", "off", flat), rel=1e-9)
