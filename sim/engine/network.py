"""Fluid network: transfers share link bandwidth max-min fairly, recomputed incrementally at every change.

A transfer waits its route's latency, then its bytes flow at a rate set by progressive filling over the
active flows (each link's capacity split fairly among the flows crossing it; flows limited elsewhere
leave their share to others). Rates change only when a flow starts or ends, so the network is itself a
discrete-event process on the SimPy clock: one wake-up per batch of simultaneous changes.

Incremental: max-min fairness decomposes over the connected components of the flows that share
*binding* links, a link being binding when the flows crossing it could together exceed it (flows whose
routes share a bottleneck link b carry at most b's capacity together, so a link's load is bounded by the
capacities of its flows' distinct bottlenecks; the bottleneck is the lowest capacity, ties to the lowest
link id, so no bound leans on itself). Solving each component on its own is then exact: the union of
the solutions fits every non-binding link. A very large component (a tree all-reduce over a thousand
ranks) switches the network to dense mode: all flows in arrays, re-solved vectorised at every change. A batch of changes recomputes only the components of the flows that
share a binding link with a flow that started or ended; a flow alone on its binding links just takes
its route's bottleneck. Each flow keeps its bytes left at its last rate change and its finish time sits
in a heap, so a wake-up touches only the flows that finish. ``max_min_rates`` is the from-scratch,
vectorised allocation (used for large components; tests hold the incremental rates to it). A transfer
may be split over several routes (NCCL channels over several NICs); it completes when all its parts have.

Over 500 lines: one state machine in two representations (per-flow tables, dense arrays) that hand the
same flows to each other.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from operator import attrgetter
from typing import Protocol

import numpy as np
import simpy

from sim.engine.max_min import component_rates, max_min_rates
from sim.errors import ScenarioError

MAX_TRANSFER_S = 1e12  # ~31,700 years: beyond this, float time has no resolution left for the rest of a run
BINDING_TOL = 1e-9  # relative: a link whose flows' bottlenecks sum to within this of its capacity counts as binding
# One component this large (a 1,024-rank tree all-reduce): the network switches to dense mode, where all
# flows live in arrays and every change re-solves them all vectorised (cheaper than per-flow Python at that
# size), until no more than SPARSE_MAX_FLOWS are left.
DENSE_MIN_FLOWS = 1024
SPARSE_MAX_FLOWS = 128


_BY_SEQ = attrgetter("seq")


class TransferOwner(Protocol):
    def transfer_done(self, tag: int) -> None: ...


class _Flow:
    __slots__ = ("links", "size", "parent", "owner", "tag", "seq", "rem", "t0", "rate", "finish", "top", "bott",
                 "ver")

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
        self.bott = -1  # its route's bottleneck link (the lowest capacity, then the lowest id)
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
        # The most a link's flows can carry together: the capacity of each distinct bottleneck link among
        # them (flows that share a bottleneck b carry at most cap_b together), and the link's own capacity
        # once per flow whose bottleneck it is itself. Above its capacity, the link is binding.
        self._bound = [0.0] * n_links
        self._bn: defaultdict[int, dict[int, int]] = defaultdict(dict)  # link -> bottleneck -> its flows here
        self._bind_at: list[float] = (self.capacity_Bps * (1.0 + BINDING_TOL)).tolist()
        self._n_active = 0
        self._seq = 0
        self._heap: list[tuple[float, int, int, _Flow]] = []  # (finish, seq, ver, flow)
        self._new: list[_Flow] = []
        self._seed_links: list[int] = []  # binding links that flows left since the last recompute
        self._tops: dict[tuple[int, ...], tuple[float, int]] = {}  # route -> its bottleneck (capacity, link)
        self._recompute_due = False
        self._pending: dict[float, list[_Flow]] = {}
        self._version = 0
        self._wake_at = math.inf
        self._wake_pending = False
        self._dense = False  # dense mode: the flows in the arrays below
        self._obj = np.empty(0, dtype=object)
        self._rem = np.zeros(0)
        self._rate = np.zeros(0)
        self._el = np.zeros(0, dtype=np.int64)  # entry -> link id
        self._ef = np.zeros(0, dtype=np.int64)  # entry -> flow index
        self._due = np.zeros(0, dtype=bool)
        self._last_t = 0.0
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
        env = self.env
        t = env.now + latency_s
        flows = self._pending.get(t)
        if flows is None:
            flows = self._pending[t] = []
            env.timeout(latency_s).callbacks.append(lambda _e, at=t: self._activate(at))  # type: ignore[misc]
        if len(routes) == 1:
            flows.append(_Flow(routes[0][0], size_bytes, None, owner, tag))
        else:
            tr = _Transfer(len(routes), owner, tag)
            flows.extend(_Flow(links, size_bytes * frac, tr, None, 0) for links, frac in routes)

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
        return (len(self._obj) if self._dense else self._n_active) + len(self._new)

    def rates(self) -> list[tuple[tuple[int, ...], float]]:
        """(links, rate) of every flowing flow, in activation order (tests compare them to max_min_rates)."""
        if self._dense:
            return [(f.links, r) for f, r in zip(self._obj, self._rate.tolist(), strict=True)]
        return [(f.links, f.rate) for f in self._active()]

    def _active(self) -> list[_Flow]:
        seen: dict[int, _Flow] = {}
        for flows in self._on.values():
            seen.update(flows)
        return [f for _, f in sorted(seen.items())]

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
        seq = self._seq
        for f in new:
            f.seq = seq
            f.t0 = now
            seq += 1
        self._seq = seq
        self._register(new)
        return new

    def _register(self, flows: list[_Flow]) -> None:
        """Enter flows in the per-link tables (sparse mode)."""
        cap, on, bound, bn, tops = self._cap, self._on, self._bound, self._bn, self._tops
        for f in flows:
            seq = f.seq
            links = f.links
            tb = tops.get(links)
            if tb is None:
                tb = tops[links] = min((cap[link], link) for link in links)
            top, b = f.top, f.bott = tb
            for link in links:
                on[link][seq] = f
                if link == b:
                    bound[link] += top
                else:
                    d = bn[link]
                    c = d.get(b, 0)
                    if not c:
                        bound[link] += top
                    d[b] = c + 1
        self._n_active += len(flows)

    def _affected(self, new: list[_Flow]) -> tuple[list[_Flow], dict[int, _Flow]]:
        """The flows whose rate the changes since the last recompute may alter: new flows with no binding
        link (alone: each takes its route's bottleneck), and the components, over binding links, of the
        other new flows and of the flows on binding links that flows left."""
        on, bound, bind_at = self._on, self._bound, self._bind_at
        # A link a new flow crosses binds now if it ever will in this batch, and the search below goes
        # through it; a link a flow left bound, if at all, before (``_seed_links``).
        comp: dict[int, _Flow] = {}
        stack: list[_Flow] = []
        lone: list[_Flow] = []
        for f in new:
            for link in f.links:
                if bound[link] > bind_at[link]:
                    comp[f.seq] = f
                    stack.append(f)
                    break
            else:
                lone.append(f)
        if not stack and not self._seed_links:
            return lone, comp
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
                if link in done_links or bound[link] <= bind_at[link]:
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
        if self._dense:
            self._recompute_dense(now)
            return
        self._solve(now, self._merge_new(now) if self._new else [])

    def _solve(self, now: float, new: list[_Flow]) -> None:
        if not self._n_active:
            self._seed_links = []
            self._version += 1  # nothing left to finish
            self._wake_pending = False
            return
        lone, comp = self._affected(new)
        if len(comp) >= DENSE_MIN_FLOWS:
            self._to_dense(now)
            self._recompute_dense(now)
            return
        heap = self._heap
        push = heapq.heappush
        for f in lone:  # just started (t0 = now), alone on every link that could bind
            r = f.rate = f.top
            ver = f.ver = f.ver + 1
            finish = f.finish = now + f.rem / r if r > 0 else math.inf
            push(heap, (finish, f.seq, ver, f))
        if comp:
            flows = sorted(comp.items())
            rates = component_rates([f.links for _, f in flows], self._cap, self.capacity_Bps)
            for (_, f), r in zip(flows, rates, strict=True):
                if f.t0 != now:
                    f.rem -= f.rate * (now - f.t0)
                    f.t0 = now
                f.rate = r
                ver = f.ver = f.ver + 1
                finish = f.finish = now + f.rem / r if r > 0 else math.inf
                push(heap, (finish, f.seq, ver, f))
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
        heap, due, pop = self._heap, self._wake_at, heapq.heappop
        finished: list[_Flow] = []
        while heap:
            finish, _, ver, f = heap[0]
            if f.seq < 0 or ver != f.ver:
                pop(heap)
                continue
            if finish <= due or f.rem - f.rate * (now - f.t0) <= f.rate * tick_s + 1e-9:
                pop(heap)
                finished.append(f)
            else:
                break
        if len(finished) > 1:
            finished.sort(key=_BY_SEQ)
        on, bound, bn, bind_at = self._on, self._bound, self._bn, self._bind_at
        lb, seeds = self._link_bytes, self._seed_links
        for f in finished:
            top, b, size, seq = f.top, f.bott, f.size, f.seq
            for link in f.links:
                if bound[link] > bind_at[link]:
                    seeds.append(link)
                flows = on[link]
                del flows[seq]
                if link != b:
                    d = bn[link]
                    c = d[b] - 1
                    if c:
                        d[b] = c
                    else:
                        del d[b]
                        bound[link] -= top
                else:
                    bound[link] -= top
                if not flows:
                    bound[link] = 0.0  # no float residue left behind
                lb[link] += size
            f.seq = -2
        self._n_active -= len(finished)
        self._finish(finished)

    def _finish(self, finished: list) -> None:
        """Count finished flows, ask for a re-solve, and tell each owner (a transfer whose last part ends)."""
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

    # ---- dense mode: every flow in arrays, re-solved from scratch at each change --------------------
    def _to_dense(self, now: float) -> None:
        """Move every flow into arrays (each flow's bytes left brought up to now); drop the link tables."""
        flows = self._active()
        for f in flows:
            if f.t0 != now:
                f.rem -= f.rate * (now - f.t0)
                f.t0 = now
        k = len(flows)
        self._obj = np.empty(k, dtype=object)
        self._obj[:] = flows
        self._rem = np.fromiter((f.rem for f in flows), float, k)
        self._rate = np.zeros(k)
        lens = np.fromiter((len(f.links) for f in flows), np.int64, k)
        self._el = np.fromiter((link for f in flows for link in f.links), np.int64, int(lens.sum()))
        self._ef = np.repeat(np.arange(k), lens)
        self._due = np.zeros(k, dtype=bool)
        self._last_t = now
        self._on = defaultdict(dict)
        self._bn = defaultdict(dict)
        self._bound = [0.0] * len(self._cap)
        self._heap = []
        self._seed_links = []
        self._n_active = 0
        self._dense = True
        self._wake_pending = False

    def _to_sparse(self, now: float) -> None:
        """Back from the arrays to per-flow state and link tables, then solve them all."""
        flows: list[_Flow] = self._obj.tolist()
        for f, rem in zip(flows, self._rem.tolist(), strict=True):
            f.rem = rem
            f.t0 = now
            f.rate = 0.0
        self._obj = np.empty(0, dtype=object)
        self._rem = self._rate = np.zeros(0)
        self._el = self._ef = np.zeros(0, dtype=np.int64)
        self._due = np.zeros(0, dtype=bool)
        self._dense = False
        self._version += 1  # the dense wake-up on the clock no longer applies
        self._register(flows)
        self._solve(now, flows)

    def _recompute_dense(self, now: float) -> None:
        dt = now - self._last_t
        if dt > 0 and len(self._rem):
            self._rem -= self._rate * dt
        self._last_t = now
        if self._new:
            new, self._new = self._new, []
            for f in new:
                f.seq = self._seq
                self._seq += 1
                f.t0 = now
            k = len(new)
            base = len(self._obj)
            obj = np.empty(k, dtype=object)
            obj[:] = new
            sizes = np.fromiter((f.size for f in new), float, k)
            lens = np.fromiter((len(f.links) for f in new), np.int64, k)
            links = np.fromiter((link for f in new for link in f.links), np.int64, int(lens.sum()))
            self._obj = np.concatenate([self._obj, obj])
            self._rem = np.concatenate([self._rem, sizes])
            self._rate = np.concatenate([self._rate, np.zeros(k)])
            self._el = np.concatenate([self._el, links])
            self._ef = np.concatenate([self._ef, base + np.repeat(np.arange(k), lens)])
        self._version += 1
        n = len(self._obj)
        if n <= SPARSE_MAX_FLOWS:
            self._to_sparse(now)
            return
        self._rate = max_min_rates(self._el, self._ef, n, self.capacity_Bps)
        self.rate_updates += 1
        with np.errstate(divide="ignore", invalid="ignore"):
            finish_s = self._rem / self._rate
        dt = float(np.min(finish_s))
        if not dt < MAX_TRANSFER_S:  # also NaN: a zero, negative or NaN rate never finishes
            raise ScenarioError(
                f"a transfer would take {dt:.3g} s at {float(np.min(self._rate)):.3g} B/s (more than "
                f"{MAX_TRANSFER_S:.0e} s); give the links (or the calibration profile's fitted bandwidth) a real rate",
                "network",
            )
        self._due = finish_s <= dt
        v = self._version
        self.env.timeout(max(dt, 0.0)).callbacks.append(lambda _e: self._wake_dense(v))


    def _wake_dense(self, version: int) -> None:
        if version != self._version:
            return
        now = self.env.now
        dt = now - self._last_t
        if dt > 0:
            self._rem -= self._rate * dt
        self._last_t = now
        tick_s = max(1e-12, 4.0 * math.ulp(now))
        done = self._due | (self._rem <= self._rate * tick_s + 1e-9)
        finished: list[_Flow] = self._obj[done].tolist()
        keep = ~done
        e_keep = keep[self._ef]
        renumber = np.cumsum(keep) - 1
        self._el = self._el[e_keep]
        self._ef = renumber[self._ef[e_keep]]
        self._obj = self._obj[keep]
        self._rem = self._rem[keep]
        self._rate = self._rate[keep]
        self._due = self._due[keep]
        lb = self._link_bytes
        for f in finished:
            for link in f.links:
                lb[link] += f.size
            f.seq = -2
        self._finish(finished)
