"""The resource types the simulator serves, and the discovery documents that describe them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SERVER_VERSION = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.5-kubesim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.24.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}

_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    kind: str
    plural: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    # Writes to the main resource ignore status, as the real server does for these types.
    has_status: bool = False
    subresources: tuple[str, ...] = ()
    # Served only when the cluster has its CustomResourceDefinition (SimCluster(crds=...)), as a CRD's API appears in
    # discovery and answers only once the CRD is installed.
    crd: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """How the server names the resource in messages: ``daemonsets.apps``, ``pods``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def base_path(self, namespace: str | None = None) -> str:
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            return f"{prefix}/namespaces/{namespace}/{self.plural}"
        return f"{prefix}/{self.plural}"


RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "Namespace", "namespaces", "namespace", False, ("ns",), True, ("status",)),
    ResourceType("", "v1", "Node", "nodes", "node", False, ("no",), True, ("status",)),
    ResourceType("", "v1", "Pod", "pods", "pod", True, ("po",), True, ("status", "log", "eviction")),
    ResourceType("", "v1", "ConfigMap", "configmaps", "configmap", True, ("cm",)),
    ResourceType("", "v1", "Event", "events", "event", True, ("ev",)),
    ResourceType("apps", "v1", "DaemonSet", "daemonsets", "daemonset", True, ("ds",), True, ("status",)),
    ResourceType("node.k8s.io", "v1", "RuntimeClass", "runtimeclasses", "runtimeclass", False),
    ResourceType("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", "priorityclass", False, ("pc",)),
    ResourceType(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        True,
        ("pdb",),
        True,
        ("status",),
    ),
    ResourceType("", "v1", "Service", "services", "service", True, ("svc",), True, ("status",)),
    # The Prometheus Operator's CRD (monitoring.coreos.com/v1): only with SimCluster(crds=["servicemonitors"]).
    ResourceType("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors", "servicemonitor", True, crd=True),
)

# How discovery describes a subresource: (kind, group, version, verbs). kubectl drain looks for pods/eviction with
# kind Eviction and a group and version before it evicts (otherwise it deletes pods instead).
_SUBRESOURCE_DISCOVERY: dict[str, tuple[str, str, str, list[str]]] = {
    "log": ("Pod", "", "", ["get"]),
    "eviction": ("Eviction", "policy", "v1", ["create"]),
}

BY_PATH: dict[tuple[str, str, str], ResourceType] = {(r.group, r.version, r.plural): r for r in RESOURCES}
BY_KIND: dict[str, ResourceType] = {r.kind.lower(): r for r in RESOURCES}
BY_PLURAL: dict[str, ResourceType] = {r.plural: r for r in RESOURCES}


def resource_for(name: str) -> ResourceType:
    """Look a type up by plural, singular, kind or short name (for the Python API)."""
    key = name.lower()
    for rtype in RESOURCES:
        if key in (rtype.plural, rtype.singular, rtype.kind.lower()) or key in rtype.short_names:
            return rtype
    raise KeyError(f"kubesim does not simulate {name!r}")


def served(rtype: ResourceType, crds: frozenset[str] | set[str] = frozenset()) -> bool:
    """Whether the cluster serves the type: always, or for a CRD's type only once the CRD is installed."""
    return not rtype.crd or rtype.plural in crds


def groups(crds: frozenset[str] | set[str] = frozenset()) -> dict[str, list[str]]:
    """Group name -> its versions, core group excluded."""
    found: dict[str, list[str]] = {}
    for rtype in RESOURCES:
        if not served(rtype, crds):
            continue
        if rtype.group and rtype.version not in found.setdefault(rtype.group, []):
            found[rtype.group].append(rtype.version)
    return found


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _group_doc(name: str, versions: list[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": entries, "preferredVersion": entries[0]}


def api_group_list(crds: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group_doc(name, versions) for name, versions in groups(crds).items()],
    }


def api_group(name: str, crds: frozenset[str] | set[str] = frozenset()) -> dict[str, Any] | None:
    versions = groups(crds).get(name)
    if versions is None:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(name, versions)}


def api_resource_list(group: str, version: str, crds: frozenset[str] | set[str] = frozenset()) -> dict[str, Any] | None:
    members = [r for r in RESOURCES if r.group == group and r.version == version and served(r, crds)]
    if not members:
        return None
    entries: list[dict[str, Any]] = []
    for rtype in members:
        entry: dict[str, Any] = {
            "name": rtype.plural,
            "singularName": rtype.singular,
            "namespaced": rtype.namespaced,
            "kind": rtype.kind,
            "verbs": list(_VERBS),
        }
        if rtype.short_names:
            entry["shortNames"] = list(rtype.short_names)
        entries.append(entry)
        for sub in rtype.subresources:
            kind, sub_group, sub_version, verbs = _SUBRESOURCE_DISCOVERY.get(
                sub, (rtype.kind, "", "", ["get", "patch", "update"])
            )
            sub_entry: dict[str, Any] = {
                "name": f"{rtype.plural}/{sub}",
                "singularName": "",
                "namespaced": rtype.namespaced,
                "kind": kind,
                "verbs": verbs,
            }
            if sub_group:
                sub_entry["group"], sub_entry["version"] = sub_group, sub_version
            entries.append(sub_entry)
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": entries,
    }


def _openapi_path(rtype: ResourceType) -> str:
    base = rtype.base_path("{namespace}") if rtype.namespaced else rtype.base_path()
    return base + "/{name}"


def openapi_v3_root(crds: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    versions = {("", "v1")} | {(r.group, r.version) for r in RESOURCES if served(r, crds)}
    for group, version in sorted(versions):
        key = f"apis/{group}/{version}" if group else f"api/{version}"
        paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash=kubesim1"}
    return {"paths": paths}


def openapi_v3_document(
    group: str, version: str, crds: frozenset[str] | set[str] = frozenset()
) -> dict[str, Any] | None:
    """A minimal OpenAPI v3 document: enough for kubectl to learn that the server validates fields itself.

    kubectl looks for the ``fieldValidation`` query parameter on the resource's PATCH operation; when it finds it,
    it sends ``fieldValidation=Strict`` and leaves the checking to the server instead of validating client-side.
    """
    members = [r for r in RESOURCES if r.group == group and r.version == version and served(r, crds)]
    if not members:
        return None
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for rtype in members:
        gvk = {"group": rtype.group, "version": rtype.version, "kind": rtype.kind}
        schema_name = f"io.k8s.kubesim.{rtype.group or 'core'}.{rtype.version}.{rtype.kind}"
        schemas[schema_name] = {
            "type": "object",
            "x-kubernetes-group-version-kind": [gvk],
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"type": "object"},
                "spec": {"type": "object"},
                "status": {"type": "object"},
                "data": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        }
        ref = {"$ref": f"#/components/schemas/{schema_name}"}
        params = [
            {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
        ]
        operation = {
            "x-kubernetes-group-version-kind": gvk,
            "parameters": params,
            "responses": {"200": {"content": {"application/json": {"schema": ref}}}},
        }
        paths[_openapi_path(rtype)] = {
            "get": {**operation, "x-kubernetes-action": "get"},
            "put": {**operation, "x-kubernetes-action": "put"},
            "patch": {**operation, "x-kubernetes-action": "patch"},
            "delete": {**operation, "x-kubernetes-action": "delete"},
        }
        list_base = rtype.base_path("{namespace}") if rtype.namespaced else rtype.base_path()
        paths[list_base] = {
            "get": {**operation, "x-kubernetes-action": "list"},
            "post": {**operation, "x-kubernetes-action": "post"},
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (kubesim)", "version": SERVER_VERSION["gitVersion"]},
        "paths": paths,
        "components": {"schemas": schemas},
    }
