"""Max-min fair rates of flows over capacitated links, by progressive filling (raise every rate
together; freeze the flows of each link that fills). ``component_rates`` solves one connected component
of the network's flows (plain Python when small); ``max_min_rates`` solves any flow set from scratch,
vectorised (large components, the network's dense mode, and tests)."""

from __future__ import annotations

import numpy as np

LEVEL_TOL = 1e-12  # relative: links whose fair share is this close to the lowest fill at the same level
NUMPY_MIN_FLOWS = 64  # components at least this large are solved with the vectorised max_min_rates


def component_rates(routes: list[tuple[int, ...]], capacity: list[float], capacity_Bps: np.ndarray) -> list[float]:
    """Max-min fair rates of flows with these routes (link ids into ``capacity``): progressive filling.
    Small components in plain Python, large ones with the vectorised ``max_min_rates`` (``capacity_Bps``:
    the same capacities as an array)."""
    n = len(routes)
    if n == 1:
        return [min(capacity[link] for link in routes[0])]
    if n >= NUMPY_MIN_FLOWS:
        lens = [len(r) for r in routes]
        el = np.fromiter((link for r in routes for link in r), np.int64, sum(lens))
        ef = np.repeat(np.arange(n), lens)
        return max_min_rates(el, ef, n, capacity_Bps).tolist()
    cnt: dict[int, int] = {}
    for r in routes:
        for link in r:
            cnt[link] = cnt.get(link, 0) + 1
    left = {link: capacity[link] for link in cnt}
    rate = [0.0] * n
    todo = list(range(n))
    while True:
        s = min(left[link] / c for link, c in cnt.items() if c)
        lim = s * (1 + LEVEL_TOL)
        full = {link for link, c in cnt.items() if c and left[link] / c <= lim}
        rest = []
        for i in todo:
            r = routes[i]
            if any(link in full for link in r):
                rate[i] = s
                for link in r:
                    left[link] -= s
                    cnt[link] -= 1
            else:
                rest.append(i)
        if not rest:
            return rate
        todo = rest


def max_min_rates(el: np.ndarray, ef: np.ndarray, n: int, capacity_Bps: np.ndarray) -> np.ndarray:
    """From scratch, vectorised: max-min rates of ``n`` flows whose link entries are ``el`` (link id)
    and ``ef`` (flow index, non-decreasing). Progressive filling: raise all rates together; freeze flows
    at the first saturated link."""
    flat_flow = ef
    n_links = len(capacity_Bps)
    if n_links <= 4 * len(el) + 4096:
        inv, cap, u = el, capacity_Bps, n_links  # index links directly: no sort needed
    else:
        uniq, inv = np.unique(el, return_inverse=True)
        cap, u = capacity_Bps[uniq], len(uniq)
    rate = np.empty(n)
    cnt = np.bincount(inv, minlength=u)
    used = cnt > 0
    share = np.full(u, np.inf)
    share[used] = cap[used] / cnt[used]
    s = share.min()
    if share[used].max() <= s * (1 + LEVEL_TOL):  # one level: every flow gets the same share
        rate[:] = s
        return rate
    # Fast exact path: give each flow the fair share of its tightest link; that is the max-min
    # allocation when every flow then has a link on which all flows run at that same share
    # (the link is full and the flow is among its largest). Otherwise, progressive filling.
    share_e = share[inv]
    starts = np.flatnonzero(np.r_[True, flat_flow[1:] != flat_flow[:-1]])
    r = np.minimum.reduceat(share_e, starts)
    r_e = r[flat_flow]
    at_share = r_e >= share_e * (1 - LEVEL_TOL)
    tight = np.bincount(inv[at_share], minlength=u) == cnt
    ok = np.add.reduceat((tight[inv] & at_share).astype(np.int64), starts) > 0
    if ok.all():
        return r
    unfrozen = np.ones(n, dtype=bool)
    active_e = np.ones(len(flat_flow), dtype=bool)
    cap = cap.astype(float, copy=True)
    while True:
        bott = share <= s * (1 + LEVEL_TOL)
        hit = bott[inv] & active_e
        newly = np.zeros(n, dtype=bool)
        newly[flat_flow[hit]] = True
        rate[newly] = s
        unfrozen &= ~newly
        e_new = newly[flat_flow]
        cap -= s * np.bincount(inv[e_new], minlength=u)
        active_e &= ~e_new
        if not unfrozen.any():
            return rate
        cnt = np.bincount(inv[active_e], minlength=u)
        used = cnt > 0
        share = np.full(u, np.inf)
        share[used] = cap[used] / cnt[used]
        s = share.min()
