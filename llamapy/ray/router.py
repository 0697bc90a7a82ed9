"""Ray Serve request routers for llamapy replicas: prefix-cache-aware (the default) and round-robin.

Each replica method is called with a *route* dict first: ``tokens`` (the request's token ids, as the
ingress tokenized them), ``session`` (a ``session_id``/``user`` affinity hint) and ``pin`` (a replica's
unique id: health and metrics calls address one replica). The router sends a request to the replica whose
recorded blocks (:class:`~llamapy.ray.prefix.PrefixIndex`) match the longest prefix of its tokens, unless
that replica is saturated or far busier than the least loaded one; else to the session's last replica;
else to the least loaded (ties: the replica with the smallest recorded cache, so that new conversations
spread). A replica that dies, restarts or is scaled away is forgotten.

Ray Serve builds one router per deployment handle, in the process that holds the handle (the ingress);
:func:`llamapy.ray.registry.router_for` finds it there, for ``/health``, ``/metrics`` and the tests.
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from . import registry
from .prefix import BLOCK, PrefixIndex


def route_of(pending_request: PendingRequest | None) -> dict[str, Any]:
    if pending_request is None or not pending_request.args:
        return {}
    first = pending_request.args[0]
    return first if isinstance(first, dict) else {}


class LlamapyRouter(RequestRouter):
    """Prefix-aware (``policy="prefix"``) or round-robin (``policy="round_robin"``) routing."""

    def initialize_state(
        self,
        policy: str = "prefix",
        block: int = BLOCK,
        max_blocks_per_replica: int = 8192,
        min_match_ratio: float = 0.1,
        imbalance: int = 4,
        max_sessions: int = 10000,
    ) -> None:
        if policy not in ("prefix", "round_robin"):
            raise ValueError(f"unknown routing policy {policy!r} (prefix or round_robin)")
        self.policy = policy
        self.index = PrefixIndex(block, max_blocks_per_replica)
        self.min_match_ratio = min_match_ratio
        self.imbalance = imbalance
        self.max_sessions = max_sessions
        self.sessions: OrderedDict[str, ReplicaID] = OrderedDict()
        self.counts: Counter[str] = Counter()
        self._reasons: dict[str, str] = {}
        self._rr = 0
        registry.ROUTERS[(self._deployment_id.app_name, self._deployment_id.name)] = self

    # -- what the ingress reads --------------------------------------------------------------------

    def replica_ids(self) -> list[str]:
        return [r.replica_id.unique_id for r in self._replicas_list]

    def snapshot(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "replicas": {
                rid.unique_id: {"blocks": self.index.n_blocks(rid), "queue": self._queue_len(rid)}
                for rid in list(self._replicas)
            },
            "routed": dict(self.counts),
        }

    # -- routing -------------------------------------------------------------------------------------

    def _queue_len(self, replica_id: ReplicaID) -> int:
        q = self._replica_queue_len_cache.get(replica_id)
        return 0 if q is None else int(q)

    def _saturated(self, r: RunningReplica, least: int) -> bool:
        q = self._queue_len(r.replica_id)
        return q >= r.max_ongoing_requests or q - least > self.imbalance

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # all full: back off, never spin
        if not candidate_replicas:
            return []
        route = route_of(pending_request)
        rid = pending_request.metadata.internal_request_id if pending_request is not None else ""
        pin = route.get("pin")
        if pin:
            return [[r for r in candidate_replicas if r.replica_id.unique_id == pin]]
        if self.policy == "round_robin":
            i = self._rr % len(candidate_replicas)
            self._rr += 1
            ordered = candidate_replicas[i:] + candidate_replicas[:i]
            self._reasons[rid] = "round_robin"
            return [[ordered[0]], ordered[1:]]
        # least loaded first; ties: the smallest recorded cache, then chance
        ordered = sorted(
            candidate_replicas,
            key=lambda r: (self._queue_len(r.replica_id), self.index.n_blocks(r.replica_id), random.random()),
        )
        least = self._queue_len(ordered[0].replica_id)
        by_id = {r.replica_id: r for r in candidate_replicas}
        preferred, reason = None, "least_loaded"
        tokens = route.get("tokens") or []
        if tokens:
            depth = self.index.match(tokens, by_id)
            if depth:
                best = max(depth, key=lambda x: (depth[x], -self._queue_len(x)))
                enough = depth[best] >= max(self.index.block, self.min_match_ratio * len(tokens))
                if enough and not self._saturated(by_id[best], least):
                    preferred, reason = by_id[best], "prefix"
        session = route.get("session")
        if preferred is None and session and self.sessions.get(session) in by_id:
            r = by_id[self.sessions[session]]
            if not self._saturated(r, least):
                preferred, reason = r, "session"
        self._reasons[rid] = reason
        if preferred is None:
            return [ordered]
        return [[preferred], [r for r in ordered if r is not preferred]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        route = route_of(pending_request)
        if route.get("pin"):
            return
        self.counts[self._reasons.pop(pending_request.metadata.internal_request_id, "least_loaded")] += 1
        if route.get("tokens"):
            self.index.insert(replica_id, route["tokens"])
        session = route.get("session")
        if session:
            self.sessions[session] = replica_id
            self.sessions.move_to_end(session)
            while len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)

    # -- replicas coming and going ---------------------------------------------------------------------

    def _forget(self, replica_id: ReplicaID) -> None:
        self.index.forget(replica_id)
        for s in [s for s, r in self.sessions.items() if r == replica_id]:
            del self.sessions[s]

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        before = set(self._replicas)
        super().update_replicas(replicas)
        for gone in before - set(self._replicas):
            self._forget(gone)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget(replica_id)
