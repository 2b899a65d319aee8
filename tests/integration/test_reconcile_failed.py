"""A write the API server refuses reaches the object, with the server's own words.

A ResourceQuota allows no Services in the namespace: the operator's server-side apply of a
pool Service is refused (403, "exceeded quota"). The DisaggDeployment must say so in a
`ReconcileFailed=True` condition and a Warning Event, not only in the operator's log; once
the quota is lifted, the operator's own retry (no event needed) creates the Services and
clears the condition.
"""

from __future__ import annotations

import json

import pytest
from samples import fixed

pytestmark = pytest.mark.cluster


def condition(cluster, namespace: str, name: str, ctype: str) -> dict | None:
    obj = cluster.get_json("disaggdeployment", name, "-n", namespace)
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == ctype), None)


def test_refused_write_sets_reconcile_failed_with_the_servers_message(cluster, namespace, operator_factory):
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-services", "namespace": namespace},
        "spec": {"hard": {"services": "0"}},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(quota))
    cluster.wait_for(
        lambda: (cluster.get_json("resourcequota", "no-services", "-n", namespace).get("status") or {}).get(
            "hard"
        ),
        timeout=30,
        what="the quota in force",
    )
    obj = fixed()
    name = obj["metadata"]["name"]
    operator_factory([namespace])
    cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=json.dumps(obj))

    failed = cluster.wait_for(
        lambda: (c := condition(cluster, namespace, name, "ReconcileFailed")) and c["status"] == "True" and c,
        timeout=60,
        what="ReconcileFailed=True",
    )
    assert "exceeded quota" in failed["message"], failed
    events = cluster.get_json(
        "events", "-n", namespace, "--field-selector", f"involvedObject.name={name},reason=ReconcileFailed"
    )["items"]
    assert events and events[0]["type"] == "Warning" and "exceeded quota" in events[0]["message"]

    cluster.kubectl("delete", "resourcequota", "no-services", "-n", namespace)
    # Nothing touches the object: the operator retries the failed reconcile on its own (with
    # backoff) until the API server accepts the Services.
    cluster.wait_for(
        lambda: (c := condition(cluster, namespace, name, "ReconcileFailed")) and c["status"] == "False",
        timeout=60,
        what="ReconcileFailed cleared",
    )
    services = cluster.get_json("services", "-n", namespace, "-l", f"disagg.dev/deployment={name}")["items"]
    assert len(services) == 2
