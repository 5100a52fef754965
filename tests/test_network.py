"""The fluid network: latency then bandwidth, max-min fair sharing, rates updated as flows come and go."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.max_min import max_min_rates
from sim.engine.network import Network


class Rec:
    def __init__(self, env):
        self.env = env
        self.done: dict[int, float] = {}

    def transfer_done(self, tag: int) -> None:
        self.done[tag] = self.env.now


def net(*caps: float) -> tuple[simpy.Environment, Network, Rec]:
    env = simpy.Environment()
    return env, Network(env, np.asarray(caps, dtype=float)), Rec(env)


def test_single_flow_is_latency_plus_size_over_bandwidth() -> None:
    env, n, r = net(100.0)
    n.transfer([((0,), 1.0)], 50.0, 0.25, r, 1)
    env.run()
    assert r.done[1] == pytest.approx(0.25 + 0.5)


def test_equal_flows_share_a_link() -> None:
    env, n, r = net(100.0, 1000.0)
    for t in range(4):
        n.transfer([((0, 1), 1.0)], 100.0, 0.0, r, t)
    env.run()
    assert all(v == pytest.approx(4.0) for v in r.done.values())


def test_max_min_fair_with_two_bottleneck_levels() -> None:
    """A uses link 0; B uses 0 and 1; C uses 1. cap0 = 10, cap1 = 4: B and C get 2, A gets 8."""
    env, n, r = net(10.0, 4.0)
    n.transfer([((0,), 1.0)], 80.0, 0.0, r, 0)  # A
    n.transfer([((0, 1), 1.0)], 20.0, 0.0, r, 1)  # B
    n.transfer([((1,), 1.0)], 20.0, 0.0, r, 2)  # C
    env.run()
    assert r.done[1] == pytest.approx(10.0)  # 20 bytes at 2 B/s
    assert r.done[2] == pytest.approx(10.0)
    assert r.done[0] == pytest.approx(10.0)  # 80 bytes at 8 B/s
    assert n.link_bytes[0] == pytest.approx(100.0) and n.link_bytes[1] == pytest.approx(40.0)


def test_rates_recomputed_when_a_flow_leaves() -> None:
    """Two flows share 10 B/s; the short one leaves at t=2 and the long one speeds up to 10 B/s."""
    env, n, r = net(10.0)
    n.transfer([((0,), 1.0)], 10.0, 0.0, r, 0)
    n.transfer([((0,), 1.0)], 30.0, 0.0, r, 1)
    env.run()
    assert r.done[0] == pytest.approx(2.0)
    assert r.done[1] == pytest.approx(2.0 + 20.0 / 10.0)


def test_late_arrival_slows_the_first() -> None:
    env, n, r = net(10.0)
    n.transfer([((0,), 1.0)], 20.0, 0.0, r, 0)
    n.transfer([((0,), 1.0)], 10.0, 1.0, r, 1)  # arrives at t=1 when 10 bytes of flow 0 remain
    env.run()
    # t in [1, 3]: both at 5 B/s → flow 1 done at 3, flow 0 has 0 left at 3 as well.
    assert r.done[1] == pytest.approx(3.0)
    assert r.done[0] == pytest.approx(3.0)


def test_split_transfer_completes_when_all_parts_have() -> None:
    env, n, r = net(10.0, 30.0)
    n.transfer([((0,), 0.5), ((1,), 0.5)], 60.0, 0.0, r, 7)
    env.run()
    assert r.done[7] == pytest.approx(3.0)  # the slow half: 30 bytes at 10 B/s


def test_random_allocations_are_feasible_and_max_min_fair() -> None:
    """For random flow sets, compare the engine's rates with a plain progressive-filling reference."""
    rng = np.random.default_rng(0)
    for _ in range(30):
        caps = rng.uniform(1, 10, size=6)
        env = simpy.Environment()
        n = Network(env, caps)
        paths = [tuple(sorted(rng.choice(6, size=rng.integers(1, 4), replace=False).tolist())) for _ in range(8)]
        for i, p in enumerate(paths):
            n.transfer([(p, 1.0)], 1e9, 0.0, Rec(env), i)
        env.run(until=1e-9)
        rates = [r for _, r in n.rates()]
        # Reference progressive filling.
        ref = np.zeros(len(paths))
        frozen = np.zeros(len(paths), bool)
        cap = caps.copy()
        while not frozen.all():
            cnt = np.zeros(6)
            for i, p in enumerate(paths):
                if not frozen[i]:
                    cnt[list(p)] += 1
            share = np.where(cnt > 0, cap / np.maximum(cnt, 1), np.inf)
            s = share.min()
            for i, p in enumerate(paths):
                if not frozen[i] and any(share[k] <= s * (1 + 1e-12) for k in p):
                    ref[i] = s
                    frozen[i] = True
                    cap[list(p)] -= s
        assert rates == pytest.approx(ref, rel=1e-9)


def _reference_rates(paths: list[tuple[int, ...]], caps: list[float]) -> list[float]:
    """Plain progressive filling over every flow, from scratch (independent of the engine's code)."""
    ref = [0.0] * len(paths)
    frozen = [False] * len(paths)
    cap = list(caps)
    while not all(frozen):
        cnt = [0] * len(cap)
        for i, p in enumerate(paths):
            if not frozen[i]:
                for k in p:
                    cnt[k] += 1
        share = [cap[k] / cnt[k] if cnt[k] else float("inf") for k in range(len(cap))]
        s = min(share)
        hit = [i for i, p in enumerate(paths) if not frozen[i] and any(share[k] <= s * (1 + 1e-12) for k in p)]
        for i in hit:
            ref[i] = s
            frozen[i] = True
            for k in paths[i]:
                cap[k] -= s
    return ref


_flow = st.tuples(
    st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True).map(lambda x: tuple(sorted(x))),
    st.floats(1.0, 100.0),  # bytes
    st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.5]),  # latency: many flows start together
)


@settings(max_examples=60, deadline=None)
@given(caps=st.lists(st.sampled_from([1.0, 2.0, 3.0, 5.0, 8.0, 100.0]), min_size=6, max_size=6),
       flows=st.lists(_flow, min_size=1, max_size=12))
def test_incremental_rates_equal_max_min_from_scratch(caps: list[float], flows) -> None:
    """As flows start and finish at random, the incrementally updated rates of the active flows always
    equal a from-scratch max-min allocation over all of them (and the vectorised one agrees)."""
    _check_rates_as_flows_come_and_go(caps, flows)


@settings(max_examples=30, deadline=None)
@given(caps=st.lists(st.sampled_from([1.0, 2.0, 5.0, 100.0]), min_size=6, max_size=6),
       flows=st.lists(_flow, min_size=4, max_size=12))
def test_dense_mode_and_back_keep_the_rates_exact(caps: list[float], flows) -> None:
    """The same with a tiny dense-mode threshold: the network moves to arrays and back as it fills and
    drains, and the rates stay the from-scratch max-min ones."""
    import sim.engine.network as net_mod

    old = (net_mod.DENSE_MIN_FLOWS, net_mod.SPARSE_MAX_FLOWS)
    net_mod.DENSE_MIN_FLOWS, net_mod.SPARSE_MAX_FLOWS = 3, 1
    try:
        _check_rates_as_flows_come_and_go(caps, flows)
    finally:
        net_mod.DENSE_MIN_FLOWS, net_mod.SPARSE_MAX_FLOWS = old


def _check_rates_as_flows_come_and_go(caps: list[float], flows) -> int:
    """Run the flows, comparing the rates with the references at probe instants; returns how many probes
    compared (an example whose flows all finish before the first probe compares none)."""
    env = simpy.Environment()
    n = Network(env, np.asarray(caps))
    rec = Rec(env)
    for i, (path, size, lat) in enumerate(flows):
        n.transfer([(path, 1.0)], size, lat, rec, i)
    checks = []

    def probe():
        while len(rec.done) < len(flows):
            yield env.timeout(0.29031)  # between events: every batch of changes has been applied
            active = n.rates()
            if not active or n._recompute_due:  # an instant with changes still to apply: not settled
                continue
            paths = [p for p, _ in active]
            got = [r for _, r in active]
            assert got == pytest.approx(_reference_rates(paths, caps), rel=1e-9)
            el = np.asarray([k for p in paths for k in p])
            ef = np.repeat(np.arange(len(paths)), [len(p) for p in paths])
            assert got == pytest.approx(max_min_rates(el, ef, len(paths), np.asarray(caps)).tolist(), rel=1e-9)
            checks.append(len(active))

    env.process(probe())
    env.run()
    assert len(rec.done) == len(flows)
    assert sum(n.link_bytes) == pytest.approx(sum(size * len(p) for p, size, _ in flows))
    return len(checks)


@pytest.mark.parametrize("dense", [False, True])
def test_rate_probes_compare_on_a_network_that_stays_busy(dense: bool) -> None:
    """A fixed case long enough for the probes to compare at many instants, sparse and dense mode: the
    random examples above may finish before the first probe."""
    import sim.engine.network as net_mod

    old = (net_mod.DENSE_MIN_FLOWS, net_mod.SPARSE_MAX_FLOWS)
    if dense:
        net_mod.DENSE_MIN_FLOWS, net_mod.SPARSE_MAX_FLOWS = 3, 1
    try:
        flows = [((0, 1), 5.0, 0.0), ((1, 2), 5.0, 0.0), ((0, 2), 3.0, 0.1), ((3,), 8.0, 0.2), ((2, 3), 4.0, 0.0)]
        assert _check_rates_as_flows_come_and_go([1.0, 2.0, 1.0, 3.0, 1.0, 1.0], flows) >= 10
    finally:
        net_mod.DENSE_MIN_FLOWS, net_mod.SPARSE_MAX_FLOWS = old


def test_processor_sharing_on_one_link_matches_the_closed_form() -> None:
    """n flows of sizes s1 ≤ … ≤ sn start together on one link of capacity C: flow k finishes at
    (s1 + … + s(k-1) + (n-k+1)·sk) / C (the k-1 smaller ones left before it, sharing equally)."""
    sizes = [3.0, 7.0, 7.5, 20.0, 41.0]
    env, n, r = net(4.0)
    for i, s in enumerate(sizes):
        n.transfer([((0,), 1.0)], s, 0.0, r, i)
    env.run()
    for k, s in enumerate(sizes):
        assert r.done[k] == pytest.approx((sum(sizes[:k]) + (len(sizes) - k) * s) / 4.0, rel=1e-12)


def test_a_link_that_cannot_fill_couples_nobody() -> None:
    """Flows on private 1-10 B/s links that all cross one 1000 B/s link: each goes at its own link's
    speed (size / cap), whatever the others do; the shared link is never binding."""
    caps = [1000.0, 1.0, 2.0, 5.0, 10.0]
    env, n, r = net(*caps)
    for i in range(1, 5):
        n.transfer([((0, i), 1.0)], 10.0, 0.1 * i, r, i)
    env.run()
    for i in range(1, 5):
        assert r.done[i] == pytest.approx(0.1 * i + 10.0 / caps[i], rel=1e-12)
