"""Fluid network: transfers share link bandwidth max-min fairly, recomputed at every change.

A transfer waits its route's latency, then its bytes flow at a rate set by progressive filling over all
active flows (each link's capacity split fairly among the flows crossing it; flows limited elsewhere
leave their share to others). Rates change only when a flow starts or ends, so the network is itself a
discrete-event process on the SimPy clock: one wake-up per batch of simultaneous changes, however many
flows are active. A transfer may be split over several routes (NCCL channels over several NICs); it
completes when all its parts have.
"""

from __future__ import annotations

from itertools import chain
from typing import Protocol

import numpy as np
import simpy

from sim.errors import ScenarioError

MAX_TRANSFER_S = 1e12  # ~31,700 years: beyond this, float time has no resolution left for the rest of a run


class TransferOwner(Protocol):
    def transfer_done(self, tag: int) -> None: ...


class _Flow:
    __slots__ = ("links", "size", "parent", "owner", "tag")

    def __init__(self, links: tuple[int, ...], size: float, parent: _Transfer | None, owner, tag: int):
        self.links = links
        self.size = size
        self.parent = parent  # set when the transfer is split over several routes
        self.owner = owner
        self.tag = tag


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
        self.link_bytes = np.zeros_like(self.capacity_Bps)
        # Active flows, as parallel arrays (flow index f) and a flat link-entry list (entry e).
        self._obj = np.empty(0, dtype=object)
        self._rem = np.zeros(0)
        self._size = np.zeros(0)
        self._rate = np.zeros(0)
        self._el = np.zeros(0, dtype=np.int64)  # entry -> link id
        self._ef = np.zeros(0, dtype=np.int64)  # entry -> flow index
        self._new: list[_Flow] = []
        self._pending: dict[float, list[_Flow]] = {}
        self._last_t = 0.0
        self._version = 0
        self._recompute_due = False
        self._due = np.zeros(0, dtype=bool)  # flows the pending wake-up finishes (by arithmetic)
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
    def active_flows(self) -> int:
        return len(self._obj) + len(self._new)

    # ---- internals -----------------------------------------------------------------------------
    def _advance(self) -> None:
        now = self.env.now
        dt = now - self._last_t
        if dt > 0 and len(self._rem):
            self._rem -= self._rate * dt
        self._last_t = now

    def _activate(self, t: float) -> None:
        flows = self._pending.pop(t)
        self._advance()
        self._new.extend(flows)
        self.flow_events += len(flows)
        self._request_recompute()

    def _request_recompute(self) -> None:
        if not self._recompute_due:
            self._recompute_due = True
            self.env.timeout(0).callbacks.append(self._recompute)

    def _merge_new(self) -> None:
        new = self._new
        self._new = []
        k = len(new)
        base = len(self._obj)
        obj = np.empty(k, dtype=object)
        obj[:] = new
        sizes = np.fromiter((f.size for f in new), float, k)
        lens = np.fromiter((len(f.links) for f in new), np.int64, k)
        links = np.fromiter(chain.from_iterable(f.links for f in new), np.int64, int(lens.sum()))
        self._obj = np.concatenate([self._obj, obj])
        self._rem = np.concatenate([self._rem, sizes])
        self._size = np.concatenate([self._size, sizes])
        self._el = np.concatenate([self._el, links])
        self._ef = np.concatenate([self._ef, base + np.repeat(np.arange(k), lens)])

    def _recompute(self, _ev: simpy.Event | None = None) -> None:
        self._recompute_due = False
        self._advance()
        if self._new:
            self._merge_new()
        self._version += 1
        if not len(self._obj):
            self._rate = np.zeros(0)
            return
        self._rate = self._max_min_rates()
        self.rate_updates += 1
        finish_s = self._rem / self._rate
        dt = float(np.min(finish_s))
        if not dt < MAX_TRANSFER_S:  # also NaN: a zero, negative or NaN rate never finishes
            raise ScenarioError(
                f"a transfer would take {dt:.3g} s at {float(np.min(self._rate)):.3g} B/s (more than "
                f"{MAX_TRANSFER_S:.0e} s); give the links (or the calibration profile's fitted bandwidth) a real rate",
                "network",
            )
        # The flows finishing first are done at that wake-up whatever float residue the clock leaves:
        # each wake-up completes at least one flow, so the clock always moves on.
        self._due = finish_s <= dt
        v = self._version
        self.env.timeout(max(dt, 0.0)).callbacks.append(lambda _e: self._wake(v))

    def _wake(self, version: int) -> None:
        if version != self._version:
            return
        self._advance()
        # A flow is done when it was due now, or when what is left would take under a picosecond or a
        # few ticks of the clock at this time (float residue).
        tick_s = max(1e-12, 4.0 * float(np.spacing(self.env.now)))
        done = self._due | (self._rem <= self._rate * tick_s + 1e-9)
        finished = self._obj[done]
        keep = ~done
        e_done = done[self._ef]
        self.link_bytes += np.bincount(
            self._el[e_done], weights=self._size[self._ef[e_done]], minlength=len(self.link_bytes)
        )
        renumber = np.cumsum(keep) - 1
        e_keep = ~e_done
        self._el = self._el[e_keep]
        self._ef = renumber[self._ef[e_keep]]
        self._obj = self._obj[keep]
        self._rem = self._rem[keep]
        self._size = self._size[keep]
        self._rate = self._rate[keep]
        self._due = self._due[keep]
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

    def _max_min_rates(self) -> np.ndarray:
        """Progressive filling: raise all rates together; freeze flows at the first saturated link."""
        n = len(self._obj)
        flat_flow = self._ef
        n_links = len(self.capacity_Bps)
        if n_links <= 4 * len(self._el) + 4096:
            inv, cap, u = self._el, self.capacity_Bps, n_links  # index links directly: no sort needed
        else:
            uniq, inv = np.unique(self._el, return_inverse=True)
            cap, u = self.capacity_Bps[uniq], len(uniq)
        rate = np.empty(n)
        cnt = np.bincount(inv, minlength=u)
        used = cnt > 0
        share = np.full(u, np.inf)
        share[used] = cap[used] / cnt[used]
        s = share.min()
        if share[used].max() <= s * (1 + 1e-12):  # one level: every flow gets the same share
            rate[:] = s
            return rate
        # Fast exact path: give each flow the fair share of its tightest link; that is the max-min
        # allocation when every flow then has a link on which all flows run at that same share
        # (the link is full and the flow is among its largest). Otherwise, progressive filling.
        share_e = share[inv]
        starts = np.flatnonzero(np.r_[True, flat_flow[1:] != flat_flow[:-1]])
        r = np.minimum.reduceat(share_e, starts)
        r_e = r[flat_flow]
        at_share = r_e >= share_e * (1 - 1e-12)
        tight = np.bincount(inv[at_share], minlength=u) == cnt
        ok = np.add.reduceat((tight[inv] & at_share).astype(np.int64), starts) > 0
        if ok.all():
            return r
        unfrozen = np.ones(n, dtype=bool)
        active_e = np.ones(len(flat_flow), dtype=bool)
        cap = cap.astype(float, copy=True)
        while True:
            bott = share <= s * (1 + 1e-12)
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
