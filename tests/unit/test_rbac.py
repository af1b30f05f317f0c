"""The RBAC of manifests/base (the chart with default values) against the calls the code makes.

Least privilege, both ways: every API call of the provider and of the companion is allowed, every
rule is a call the code makes, and a rule names its objects (resourceNames) wherever the code's
calls name them and Kubernetes RBAC can restrict the verb (everything but create, list, watch
and deletecollection). The e2e tests run both processes on these ServiceAccounts' tokens, so a
rule too narrow fails there as well; this test is what fails when a rule is too wide.

The names come from the code (settings defaults, the Lease path helpers), so a renamed Lease
fails here before it fails in a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_chart_parity import template
from vkprovider.config import LeaderElectionSettings, NodeSettings
from vkprovider.descheduler.service import companion_lease_name
from vkprovider.node.lease import LEASE_NAMESPACE
from vkprovider.node.spend import spend_lease_path
from vkprovider.node.virtualnode import decommission_marker_path
from vkprovider.testing.harness import MANIFESTS_NODE, node_rbac

BASE = Path(__file__).resolve().parents[2] / "manifests" / "base"
NS = "vkprovider-system"  # the kustomize install's namespace (render-manifests.sh)
NODE = NodeSettings().name
PROVIDER, COMPANION = "vkprovider", "vkprovider-companion"
ANY = None  # a namespace or a name the code does not know in advance
UNNAMEABLE = {"create", "list", "watch", "deletecollection"}  # resourceNames cannot restrict


@dataclass(frozen=True)
class Call:
    verb: str
    group: str
    resource: str
    namespace: str | None  # None: any namespace (or cluster-scoped)
    name: str | None  # None: any name


def calls(group: str, resource: str, verbs: str, *, namespace: str | None = ANY,
          names: tuple[str, ...] = ()) -> list[Call]:
    return [Call(v, group, resource, namespace, n) for v in verbs.split()
            for n in (names or (ANY,))]


LEADER_LEASE = LeaderElectionSettings(namespace=NS).lease(node_name=NODE)
SPEND_LEASE = spend_lease_path(namespace=NS, node=NODE).rsplit("/", 1)[1]
MARKER_LEASE = decommission_marker_path(namespace=NS, node=NODE).rsplit("/", 1)[1]
COORD = "coordination.k8s.io"

#: What `vkprovider run` calls (vkprovider/node, vkprovider/kube, vkprovider/api).
PROVIDER_CALLS = [
    *calls("", "nodes", "create"),  # virtualnode.py: register
    *calls("", "nodes", "get patch", names=(NODE,)),  # virtualnode.py, spend.py (legacy record)
    *calls("", "nodes/status", "patch", names=(NODE,)),  # virtualnode.py
    *calls("", "pods", "get list watch patch delete"),  # node/pods.py, kube/watching.py
    *calls("", "pods/status", "patch update"),  # kube/podstatus_write.py
    *calls("", "namespaces", "get"),  # node/policygate.py
    *calls("", "secrets", "get"),  # kube/refs.py (pod env), providerset.py (GPUProvider key)
    *calls("", "configmaps", "get"),  # kube/refs.py
    *calls("", "events", "create patch"),  # kube/events.py
    *calls("", "services", "get list watch"),  # node/endpointslices.py
    *calls("", "services/finalizers", "update"),  # the Slices' blockOwnerDeletion
    *calls("discovery.k8s.io", "endpointslices", "get list watch create update patch delete"),
    *calls("authentication.k8s.io", "tokenreviews", "create"),  # kube/authn.py
    *calls("authorization.k8s.io", "subjectaccessreviews", "create"),
    *calls("vkprovider.io", "gpuproviders/status", "patch"),  # node/providerset.py
    *calls("vkprovider.io", "gpuproviders", "get list watch"),
    *calls("vkprovider.io", "overflowpolicies", "get list watch"),
    *calls(COORD, "leases", "create", namespace=LEASE_NAMESPACE),  # node/lease.py
    *calls(COORD, "leases", "patch", namespace=LEASE_NAMESPACE, names=(NODE,)),
    *calls(COORD, "leases", "create", namespace=NS),  # kube/leader.py, node/spend.py
    *calls(COORD, "leases", "get patch", namespace=NS, names=(LEADER_LEASE, SPEND_LEASE)),
    *calls(COORD, "leases", "get", namespace=NS, names=(MARKER_LEASE,)),  # node/virtualnode.py
]

#: What `vkprovider descheduler` calls (vkprovider/descheduler).
COMPANION_CALLS = [
    *calls("", "pods", "get list watch patch"),
    *calls("", "namespaces", "list watch"),
    *calls("apps", "replicasets", "list watch"),  # an informer; never a GET per pod
    *calls("apps", "deployments", "list watch patch"),
    *calls("apps", "deployments/scale", "patch"),
    *calls("autoscaling", "horizontalpodautoscalers", "list watch patch"),
    *calls("", "nodes", "list watch"),
    *calls("vkprovider.io", "overflowpolicies/status", "patch"),
    *calls("vkprovider.io", "gpuproviders/status", "patch"),
    *calls("vkprovider.io", "gpuproviders", "get list watch"),
    *calls("vkprovider.io", "overflowpolicies", "get list watch"),
    *(c for r in ("workloads", "admissionchecks", "resourceflavors", "clusterqueues",
                  "localqueues") for c in calls("kueue.x-k8s.io", r, "get list watch")),
    *calls("kueue.x-k8s.io", "workloads/status", "patch"),
    *calls("kueue.x-k8s.io", "admissionchecks/status", "patch"),
    *calls("", "events", "create patch list watch"),
    *calls(COORD, "leases", "create", namespace=NS),  # kube/leader.py
    *calls(COORD, "leases", "get patch", namespace=NS, names=(companion_lease_name([NODE]),)),
]


@dataclass(frozen=True)
class Grant:
    """One rule, as it applies to one ServiceAccount."""

    rule: dict[str, Any]
    namespace: str | None  # a Role's namespace; None: a ClusterRole (everywhere)
    role: str

    def allows(self, call: Call) -> bool:
        r = self.rule
        return (call.group in r.get("apiGroups", []) and call.resource in r.get("resources", [])
                and call.verb in r.get("verbs", [])
                and (self.namespace is None or self.namespace == call.namespace)
                and (not r.get("resourceNames") or call.name in r["resourceNames"]))


def grants(objs: list[dict[str, Any]], account: str) -> list[Grant]:
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objs if o["kind"] in ("Role", "ClusterRole")}
    out = []
    for binding in (o for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        if not any(s.get("kind") == "ServiceAccount" and s["name"] == account
                   and s.get("namespace") == NS for s in binding.get("subjects") or []):
            continue
        ref = binding["roleRef"]
        ns = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        role = roles[(ref["kind"], ns if ref["kind"] == "Role" else None, ref["name"])]
        out += [Grant(rule=rule, namespace=ns, role=ref["name"]) for rule in role["rules"]]
    return out


def rendered() -> list[dict[str, Any]]:
    return [o for name in ("rbac.yaml", "rbac-policies.yaml")
            for o in yaml.safe_load_all((BASE / name).read_text()) if o]


ACCOUNTS = [(PROVIDER, PROVIDER_CALLS), (COMPANION, COMPANION_CALLS)]


def test_the_names_the_code_uses_are_the_charts_defaults() -> None:
    assert NODE == MANIFESTS_NODE == "vk-gpu-burst"
    assert LeaderElectionSettings().namespace == NS


@pytest.mark.parametrize(("account", "made"), ACCOUNTS, ids=[a for a, _ in ACCOUNTS])
def test_every_call_the_code_makes_is_allowed(account: str, made: list[Call]) -> None:
    have = grants(rendered(), account)
    denied = [c for c in made if not any(g.allows(c) for g in have)]
    assert not denied, f"{account} may not make these calls: {denied}"


@pytest.mark.parametrize(("account", "made"), ACCOUNTS, ids=[a for a, _ in ACCOUNTS])
def test_every_rule_is_a_call_the_code_makes_named_where_rbac_allows(
        account: str, made: list[Call]) -> None:
    problems = []
    for grant in grants(rendered(), account):
        rule = grant.rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    mine = [c for c in made if (c.verb, c.group, c.resource) == (verb, group,
                                                                                resource)
                            and (grant.namespace is None or c.namespace == grant.namespace)]
                    where = f"{grant.role}: {verb} {group or 'core'}/{resource}"
                    if not mine:
                        problems.append(f"{where}: the code makes no such call")
                        continue
                    if grant.namespace is None and all(c.namespace is not ANY for c in mine):
                        problems.append(f"{where}: granted everywhere, the code calls it only "
                                        f"in {sorted({str(c.namespace) for c in mine})}")
                    names = {c.name for c in mine}
                    if verb in UNNAMEABLE or ANY in names:
                        continue
                    if sorted(rule.get("resourceNames") or []) != sorted(map(str, names)):
                        problems.append(f"{where}: resourceNames "
                                        f"{rule.get('resourceNames')} but the code names only "
                                        f"{sorted(map(str, names))}")
    assert not problems, "\n".join(problems)


def test_secrets_are_read_by_name_only() -> None:
    for account, _ in ACCOUNTS:
        for grant in grants(rendered(), account):
            if "secrets" in grant.rule["resources"]:
                assert set(grant.rule["verbs"]) == {"get"}, grant


def test_a_test_node_gets_the_same_named_rules_as_the_charts_node() -> None:
    """The e2e harness's per-node grant (harness.node_rbac) is the chart's rules renamed."""
    objs = rendered()
    named = sorted((o["kind"], o["metadata"].get("namespace"), r["verbs"], r["resourceNames"])
                   for o in objs if o["kind"] in ("Role", "ClusterRole")
                   for r in o["rules"] if r.get("resourceNames")
                   and any(MANIFESTS_NODE in n for n in r["resourceNames"]))
    copied = sorted((o["kind"], o["metadata"].get("namespace"), r["verbs"],
                     [n.replace("vk-test", MANIFESTS_NODE) for n in r["resourceNames"]])
                    for o in node_rbac("vk-test") if o["kind"] in ("Role", "ClusterRole")
                    for r in o["rules"])
    assert named and copied == named
    bound = {o["roleRef"]["name"] for o in node_rbac("vk-test") if "roleRef" in o}
    assert bound == {o["metadata"]["name"] for o in node_rbac("vk-test") if "rules" in o}


def test_the_chart_names_the_objects_its_settings_name() -> None:
    """Other values: the names follow node.name, a lease_name override and several nodes."""
    objs = template("node.name=n1", "provider.settings.leader_election.lease_name=my-lease",
                    "companion.settings.node_name={b-node,a-node}", namespace="ns1")

    def named(role: str) -> list[list[str]]:
        [obj] = [o for o in objs if o["kind"] in ("Role", "ClusterRole")
                 and o["metadata"]["name"] == role]
        return [r["resourceNames"] for r in obj["rules"] if r.get("resourceNames")]

    assert named("vkprovider") == [["n1"], ["n1"]]
    assert named("vkprovider-node-lease") == [["n1"]]
    leases = [LeaderElectionSettings(lease_name="my-lease").lease(node_name="n1"),
              spend_lease_path(namespace="ns1", node="n1").rsplit("/", 1)[1]]
    assert named("vkprovider-leader-election") == [
        leases, [*leases, decommission_marker_path(namespace="ns1", node="n1").rsplit("/", 1)[1]]]
    assert named("vkprovider-companion-leader") == [[companion_lease_name(["b-node", "a-node"])]]
