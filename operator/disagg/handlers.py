"""Kopf handlers: decorators only, everything else is delegated.

Watches (no polling): DisaggDeployments, and the Deployments and Pods that
carry the `disagg.dev/deployment` label. Every event goes to disagg.controller:
it feeds the watch cache (which the autoscaler loop reads instead of listing)
and queues a reconcile of the owning DisaggDeployment when one can change
something (level-triggered, idempotent: see disagg.reconcile); the operator's
own status writes reconcile nothing.
With a shard selector (disagg.shard) only the events of this shard's
DisaggDeployments and of their children reach a handler.

Only watch-event handlers are used. They store no progress annotations and add
no finalizer, so deleting a DisaggDeployment never waits for the operator, and
restarting the operator writes nothing to unchanged objects. The autoscaling
loop is a task of the operator (disagg.loop), not a Kopf timer, for the same
reason: Kopf timers put a finalizer on every object.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import kopf

from disagg import api, health, loop, names, shard
from disagg.controller import Controller
from disagg.health import Health
from disagg.kube import Kube, login_settings
from disagg.leader import LeaderElector, ShardOverlapCheck

log = logging.getLogger("disagg.handlers")


class State:
    kube: Kube | None = None
    # This operator's shard (`disagg run --shard-selector`); empty: every DisaggDeployment.
    shard: shard.Selector = shard.Selector()
    # The DisaggDeployments of this shard seen so far (namespace, name): child events of
    # other shards' objects are ignored without a read.
    owned: set[tuple[str, str]] = set()
    tasks: list[asyncio.Task] = []
    options: dict[str, Any] = {}
    health = Health()
    health_runner: Any = None
    controller: Controller | None = None


def kube() -> Kube:
    assert State.kube is not None, "operator not started"
    return State.kube


@kopf.on.login(retries=3, backoff=1.0)
async def login(**_: Any) -> kopf.ConnectionInfo:
    """Kopf's watches use exactly the credentials of the operator's own client (disagg.kube).

    Defining this handler replaces Kopf's default login, which reads ~/.kube/config or
    $KUBECONFIG on its own and could watch another cluster than the one the operator writes to.
    Kopf calls it again when the API server answers 401 (e.g. a rotated service-account token).
    """
    return kopf.ConnectionInfo(**await login_settings(State.options.get("kubeconfig")))


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.peering.standalone = True
    # No cluster-wide scanning of CRDs and namespaces: the resources are known (API discovery at
    # start-up) and the namespaces are given exactly, so the chart grants no list on either.
    settings.scanning.disabled = True
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 30
    port = State.options.get("health_port")
    if port and State.health_runner is None:
        # Before anything that can wait (the Lease): a standby must answer its liveness probe.
        State.health_runner = await health.serve(State.health, State.options.get("bind", "127.0.0.1"), port)
    State.kube = await Kube.connect(State.options.get("kubeconfig"))
    State.controller = Controller(kube, on_deleted=loop.forget)
    State.tasks.append(asyncio.create_task(State.controller.queue.run(), name="disagg-reconciles"))
    election = State.options.get("leader_election")
    if election:
        # Watches start only after this handler returns: a standby does nothing at all.
        # The Lease records what this shard owns; the shards compare their scopes (disjoint?).
        scope = shard.Scope(election[1], State.shard, frozenset(State.options.get("namespaces") or ()))
        elector = LeaderElector(
            State.kube,
            namespace=election[0],
            name=election[1],
            annotations={shard.SCOPE_ANNOTATION: scope.to_annotation()},
        )
        await elector.acquire()
        State.tasks.append(asyncio.create_task(elector.hold(lambda: os._exit(1)), name="disagg-leader"))
        check = ShardOverlapCheck(
            State.kube, election[0], scope, owned=State.controller.cache.disagg_deployments
        )
        State.tasks.append(asyncio.create_task(check.run_forever(), name="disagg-shard-check"))
    hook = State.options.get("on_startup")
    if hook:
        await hook(State)
    State.health.leading = True  # readiness: this replica acts (holds the Lease, or no election)


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    for t in State.tasks:
        t.cancel()
    await asyncio.gather(*State.tasks, return_exceptions=True)
    State.tasks.clear()
    if State.kube:
        await State.kube.close()
        State.kube = None
    State.health.leading = False
    if State.health_runner is not None:
        await State.health_runner.cleanup()
        State.health_runner = None


def controller() -> Controller:
    assert State.controller is not None, "operator not started"
    return State.controller


def _mine_or_was(body: kopf.Body, namespace: str | None, name: str | None, **_: Any) -> bool:
    """A DisaggDeployment event concerns this operator when the object is in its shard, or was
    (relabelled into another shard: this operator lets go of it). Filtered before the handler,
    so another shard's objects cost no handler call at all."""
    return State.shard.matches(body.get("metadata", {}).get("labels")) or (namespace, name) in State.owned


def _owner_mine(labels: kopf.Labels, namespace: str | None, **_: Any) -> bool:
    """A pool Deployment's or Pod's event concerns this operator when its owner is in its shard."""
    return not State.shard or (namespace, labels.get(names.LABEL_DEPLOYMENT)) in State.owned


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL, when=_mine_or_was)
async def on_disaggdeployment(event: dict, body: kopf.Body, namespace: str, name: str, **_: Any) -> None:
    key = (namespace, name)
    kind = event.get("type")
    if kind != "DELETED" and not State.shard.matches(body["metadata"].get("labels")):
        # Relabelled out of the shard: the owning shard's operator takes over; here it is gone
        # (the controller drops it from the cache and the autoscaler forgets it).
        kind = "DELETED"
    if kind == "DELETED":
        State.owned.discard(key)
    else:
        State.owned.add(key)
    controller().on_event(api.KIND, kind, event["object"])


@kopf.on.event("apps", "v1", "deployments", labels={names.LABEL_DEPLOYMENT: kopf.PRESENT}, when=_owner_mine)
async def on_pool_deployment(event: dict, **_: Any) -> None:
    controller().on_event("Deployment", event.get("type"), event["object"])


@kopf.on.event("", "v1", "pods", labels={names.LABEL_DEPLOYMENT: kopf.PRESENT}, when=_owner_mine)
async def on_pool_pod(event: dict, **_: Any) -> None:
    controller().on_event("Pod", event.get("type"), event["object"])


# The pools' Services and PodDisruptionBudgets: reconcile reads them from the watch cache (no
# LIST per reconcile); one deleted by hand brings its owner's reconcile, which recreates it.
@kopf.on.event("", "v1", "services", labels={names.LABEL_DEPLOYMENT: kopf.PRESENT}, when=_owner_mine)
async def on_pool_service(event: dict, **_: Any) -> None:
    controller().on_event("Service", event.get("type"), event["object"])


@kopf.on.event(
    "policy", "v1", "poddisruptionbudgets", labels={names.LABEL_DEPLOYMENT: kopf.PRESENT}, when=_owner_mine
)
async def on_pool_pdb(event: dict, **_: Any) -> None:
    controller().on_event("PodDisruptionBudget", event.get("type"), event["object"])
