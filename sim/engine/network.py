"""Fluid network: transfers share link bandwidth max-min fairly, recomputed incrementally at every change.

A transfer waits its route's latency, then its bytes flow at a rate set by progressive filling over the
active flows (each link's capacity split fairly among the flows crossing it; flows limited elsewhere
leave their share to others). Rates change only when a flow starts or ends, so the network is itself a
discrete-event process on the SimPy clock: one wake-up per batch of simultaneous changes.

Incremental: max-min fairness decomposes over the connected components of the flows that share
*binding* links, a link being binding when the flows crossing it could together exceed it (the sum of
their routes' bottleneck capacities is above its capacity; a link that cannot fill never limits anyone,
so dropping it changes no rate). A batch of changes recomputes only the components of the flows that
share a binding link with a flow that started or ended; a flow alone on its binding links just takes
its route's bottleneck. Each flow keeps its bytes left at its last rate change and its finish time sits
in a heap, so a wake-up touches only the flows that finish. ``max_min_rates`` is the from-scratch,
vectorised allocation (used for large components; tests hold the incremental rates to it). A transfer
may be split over several routes (NCCL channels over several NICs); it completes when all its parts have.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from typing import Protocol

import numpy as np
import simpy

from sim.errors import ScenarioError

MAX_TRANSFER_S = 1e12  # ~31,700 years: beyond this, float time has no resolution left for the rest of a run
LEVEL_TOL = 1e-12  # relative: links whose fair share is this close to the lowest fill at the same level
BINDING_TOL = 1e-9  # relative: a link whose flows' bottlenecks sum to within this of its capacity counts as binding
NUMPY_MIN_FLOWS = 64  # components at least this large are solved with the vectorised max_min_rates


class TransferOwner(Protocol):
    def transfer_done(self, tag: int) -> None: ...


class _Flow:
    __slots__ = ("links", "size", "parent", "owner", "tag", "seq", "rem", "t0", "rate", "finish", "top", "ver")

    def __init__(self, links: tuple[int, ...], size: float, parent: _Transfer | None, owner, tag: int):
        self.links = links
        self.size = size
        self.parent = parent  # set when the transfer is split over several routes
        self.owner = owner
        self.tag = tag
        self.seq = -1  # activation order (set when it starts to flow); -1 before, -2 once finished
        self.rem = size  # bytes left at time t0
        self.t0 = 0.0
        self.rate = 0.0
        self.finish = math.inf
        self.top = 0.0  # its route's bottleneck capacity
        self.ver = 0  # bumped at every rate change: older heap entries are stale


class _Transfer:
    __slots__ = ("parts", "owner", "tag")

    def __init__(self, parts: int, owner: TransferOwner, tag: int):
        self.parts = parts
        self.owner = owner
        self.tag = tag


class _EventOwner:
    """Adapter so processes can wait on a SimPy event for a transfer."""

    __slots__ = ("event",)

    def __init__(self, event: simpy.Event):
        self.event = event

    def transfer_done(self, tag: int) -> None:
        self.event.succeed()


class Network:
    def __init__(self, env: simpy.Environment, capacity_Bps: np.ndarray):
        self.env = env
        self.capacity_Bps = np.asarray(capacity_Bps, dtype=float)
        self._cap: list[float] = self.capacity_Bps.tolist()
        n_links = len(self._cap)
        self._link_bytes = [0.0] * n_links
        # link -> active flows (by activation order; insertion-ordered, so every run iterates alike)
        self._on: defaultdict[int, dict[int, _Flow]] = defaultdict(dict)
        self._demand = [0.0] * n_links  # link -> sum of its flows' route bottlenecks
        self._bind_at: list[float] = (self.capacity_Bps * (1.0 - BINDING_TOL)).tolist()  # demand above: binding
        self._n_active = 0
        self._seq = 0
        self._heap: list[tuple[float, int, int, _Flow]] = []  # (finish, seq, ver, flow)
        self._new: list[_Flow] = []
        self._seed_links: list[int] = []  # binding links that flows left since the last recompute
        self._tops: dict[tuple[int, ...], float] = {}  # route -> its bottleneck capacity
        self._wake_pending = False
        self._pending: dict[float, list[_Flow]] = {}
        self._version = 0
        self._wake_at = math.inf
        self._recompute_due = False
        self.transfers = 0  # transfers started (statistics)
        self.flow_events = 0  # flow starts + completions (statistics)
        self.rate_updates = 0

    # ---- public --------------------------------------------------------------------------------
    def transfer(
        self,
        routes: list[tuple[tuple[int, ...], float]],
        size_bytes: float,
        latency_s: float,
        owner: TransferOwner,
        tag: int = 0,
    ) -> None:
        """Send ``size_bytes`` split over ``routes`` ((links, fraction) pairs); call
        ``owner.transfer_done(tag)`` when every part has arrived."""
        self.transfers += 1
        if size_bytes <= 0 or not routes:
            ev = self.env.timeout(latency_s)
            ev.callbacks.append(lambda _e: owner.transfer_done(tag))
            return
        if len(routes) == 1:
            flows = [_Flow(routes[0][0], size_bytes, None, owner, tag)]
        else:
            tr = _Transfer(len(routes), owner, tag)
            flows = [_Flow(links, size_bytes * frac, tr, None, 0) for links, frac in routes]
        t = self.env.now + latency_s
        lst = self._pending.get(t)
        if lst is None:
            self._pending[t] = flows
            ev = self.env.timeout(latency_s)
            ev.callbacks.append(lambda _e, t=t: self._activate(t))
        else:
            lst.extend(flows)

    def transfer_event(
        self, routes: list[tuple[tuple[int, ...], float]], size_bytes: float, latency_s: float
    ) -> simpy.Event:
        ev = self.env.event()
        self.transfer(routes, size_bytes, latency_s, _EventOwner(ev))
        return ev

    @property
    def link_bytes(self) -> np.ndarray:
        """Bytes that have crossed each link (finished flows)."""
        return np.asarray(self._link_bytes)

    @property
    def active_flows(self) -> int:
        return self._n_active + len(self._new)

    def rates(self) -> list[tuple[tuple[int, ...], float]]:
        """(links, rate) of every flowing flow, in activation order (tests compare them to max_min_rates)."""
        seen: dict[int, _Flow] = {}
        for flows in self._on.values():
            seen.update(flows)
        return [(f.links, f.rate) for _, f in sorted(seen.items())]

    # ---- internals -----------------------------------------------------------------------------
    def _activate(self, t: float) -> None:
        flows = self._pending.pop(t)
        self._new.extend(flows)
        self.flow_events += len(flows)
        self._request_recompute()

    def _request_recompute(self) -> None:
        if not self._recompute_due:
            self._recompute_due = True
            self.env.timeout(0).callbacks.append(self._recompute)

    def _merge_new(self, now: float) -> list[_Flow]:
        new, self._new = self._new, []
        cap, on, demand, tops = self._cap, self._on, self._demand, self._tops
        seq = self._seq
        for f in new:
            f.seq = seq
            f.t0 = now
            links = f.links
            top = tops.get(links)
            if top is None:
                top = tops[links] = min(cap[link] for link in links)
            f.top = top
            for link in links:
                on[link][seq] = f
                demand[link] += top
            seq += 1
        self._seq = seq
        self._n_active += len(new)
        return new

    def _affected(self, new: list[_Flow]) -> tuple[list[_Flow], dict[int, _Flow]]:
        """The flows whose rate the changes since the last recompute may alter: new flows with no binding
        link (alone: each takes its route's bottleneck), and the components, over binding links, of the
        other new flows and of the flows on binding links that flows left."""
        on, demand, bind_at = self._on, self._demand, self._bind_at
        # A link a new flow crosses binds now if it ever will in this batch, and the search below goes
        # through it; a link a flow left bound, if at all, before (``_seed_links``).
        comp: dict[int, _Flow] = {}
        stack: list[_Flow] = []
        lone: list[_Flow] = []
        for f in new:
            for link in f.links:
                if demand[link] > bind_at[link]:
                    comp[f.seq] = f
                    stack.append(f)
                    break
            else:
                lone.append(f)
        done_links: set[int] = set()
        for link in self._seed_links:
            if link not in done_links:
                done_links.add(link)
                for s, g in on[link].items():
                    if s not in comp:
                        comp[s] = g
                        stack.append(g)
        self._seed_links = []
        while stack:
            f = stack.pop()
            for link in f.links:
                if link in done_links or demand[link] <= bind_at[link]:
                    continue
                done_links.add(link)
                for s, g in on[link].items():
                    if s not in comp:
                        comp[s] = g
                        stack.append(g)
        return lone, comp

    def _recompute(self, _ev: simpy.Event | None = None) -> None:
        self._recompute_due = False
        now = self.env.now
        new = self._merge_new(now) if self._new else []
        if not self._n_active:
            self._seed_links = []
            self._version += 1  # nothing left to finish
            self._wake_pending = False
            return
        lone, comp = self._affected(new)
        heap = self._heap
        push = heapq.heappush
        for f in lone:  # just started (t0 = now), alone on every link that could bind
            r = f.rate = f.top
            f.ver += 1
            f.finish = now + f.rem / r if r > 0 else math.inf
            push(heap, (f.finish, f.seq, f.ver, f))
        if comp:
            flows = sorted(comp.items())
            rates = component_rates([f.links for _, f in flows], self._cap, self.capacity_Bps)
            for (_, f), r in zip(flows, rates, strict=True):
                if f.t0 != now:
                    f.rem -= f.rate * (now - f.t0)
                    f.t0 = now
                f.rate = r
                f.ver += 1
                f.finish = now + f.rem / r if r > 0 else math.inf
                push(heap, (f.finish, f.seq, f.ver, f))
        self.rate_updates += 1
        while heap and (heap[0][3].seq < 0 or heap[0][2] != heap[0][3].ver):
            heapq.heappop(heap)
        top = heap[0][3]
        dt = top.finish - now
        if not dt < MAX_TRANSFER_S:  # also NaN: a zero, negative or NaN rate never finishes
            raise ScenarioError(
                f"a transfer would take {dt:.3g} s at {top.rate:.3g} B/s (more than "
                f"{MAX_TRANSFER_S:.0e} s); give the links (or the calibration profile's fitted bandwidth) a real rate",
                "network",
            )
        # The flows finishing first are done at that wake-up whatever float residue the clock leaves:
        # each wake-up completes at least one flow, so the clock always moves on.
        if self._wake_pending and top.finish == self._wake_at:
            return  # the wake-up already on the clock is the right one
        self._wake_at = top.finish
        self._wake_pending = True
        self._version += 1
        v = self._version
        self.env.timeout(max(dt, 0.0)).callbacks.append(lambda _e: self._wake(v))

    def _wake(self, version: int) -> None:
        if version != self._version:
            return
        self._wake_pending = False
        now = self.env.now
        # A flow is done when it was due now, or when what is left would take under a picosecond or a
        # few ticks of the clock at this time (float residue).
        tick_s = max(1e-12, 4.0 * math.ulp(now))
        heap, due = self._heap, self._wake_at
        finished: list[_Flow] = []
        while heap:
            finish, _, ver, f = heap[0]
            if f.seq < 0 or ver != f.ver:
                heapq.heappop(heap)
                continue
            if finish <= due or f.rem - f.rate * (now - f.t0) <= f.rate * tick_s + 1e-9:
                heapq.heappop(heap)
                finished.append(f)
            else:
                break
        finished.sort(key=lambda f: f.seq)
        on, demand, bind_at, lb, seeds = self._on, self._demand, self._bind_at, self._link_bytes, self._seed_links
        for f in finished:
            top, size, seq = f.top, f.size, f.seq
            for link in f.links:
                if demand[link] > bind_at[link]:
                    seeds.append(link)
                del on[link][seq]
                demand[link] -= top
                lb[link] += size
            f.seq = -2
        self._n_active -= len(finished)
        self.flow_events += len(finished)
        self._request_recompute()
        for f in finished:
            tr = f.parent
            if tr is None:
                f.owner.transfer_done(f.tag)
            else:
                tr.parts -= 1
                if tr.parts == 0:
                    tr.owner.transfer_done(tr.tag)


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
