"""The API verbs over the store: create, get, list, server-side apply, patch, update, delete, with validation."""

from __future__ import annotations

import datetime
import random
import re
import uuid
from collections.abc import Callable
from typing import Any

from . import admission, fields
from .defaults import apply_defaults
from .errors import ApiError, already_exists, invalid, not_found
from .resources import BY_PLURAL, ResourceType
from .store import Entry, Store, clone

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SUBDOMAIN_HELP = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_HELP = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end "
    "with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# The status a new object starts with: the real types' non-optional fields (the Python client insists on them).
_INITIAL_STATUS: dict[str, dict[str, Any]] = {
    "daemonsets": {"currentNumberScheduled": 0, "desiredNumberScheduled": 0, "numberMisscheduled": 0, "numberReady": 0},
    "namespaces": {"phase": "Active"},
    "pods": {"phase": "Pending", "qosClass": "BestEffort"},
}
PATCH_TYPES = {
    "application/apply-patch+yaml": "apply",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/json-patch+json": "json",
}


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def random_suffix(length: int = 5) -> str:
    return "".join(random.choice(_SUFFIX_ALPHABET) for _index in range(length))


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal apart from the resourceVersion: such a write changes nothing and must not bump it."""
    a_meta = {k: v for k, v in a.get("metadata", {}).items() if k != "resourceVersion"}
    b_meta = {k: v for k, v in b.get("metadata", {}).items() if k != "resourceVersion"}
    return a_meta == b_meta and {k: v for k, v in a.items() if k != "metadata"} == {
        k: v for k, v in b.items() if k != "metadata"
    }


def _spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


class Api:
    def __init__(self, store: Store) -> None:
        self.store = store
        # Every object created, in order (kind, namespace, name, labels, manager): tests count pod creations.
        self.creations: list[dict[str, Any]] = []

    # ----- reading ----------------------------------------------------------------------------------------------

    def get(self, rtype: ResourceType, namespace: str | None, name: str) -> Entry:
        entry = self.store.get(rtype.plural, namespace if rtype.namespaced else None, name)
        if entry is None:
            raise not_found(rtype.qualified, name, rtype.group, rtype.plural)
        return entry

    def list(
        self,
        rtype: ResourceType,
        namespace: str | None,
        predicate: Callable[[dict[str, Any]], bool] | None = None,
    ) -> tuple[list[Entry], int]:
        entries, rv = self.store.list(rtype.plural, namespace if rtype.namespaced else None)
        if predicate is not None:
            entries = [e for e in entries if predicate(e.obj)]
        entries.sort(key=lambda e: (e.obj["metadata"].get("namespace", ""), e.obj["metadata"]["name"]))
        return entries, rv

    # ----- writing ----------------------------------------------------------------------------------------------

    def create(
        self,
        rtype: ResourceType,
        namespace: str | None,
        body: dict[str, Any],
        manager: str,
        dry_run: bool = False,
        keep_status: bool = False,
    ) -> dict[str, Any]:
        """Create an object; ``keep_status`` lets the simulated kubelet and controllers set status from the start."""
        self._check_body(rtype, body, namespace, None)
        obj = clone(body)
        meta = obj.setdefault("metadata", {})
        generated = not meta.get("name") and bool(meta.get("generateName"))
        if generated:
            meta["name"] = meta["generateName"] + random_suffix()
        if not meta.get("name"):
            raise invalid(
                rtype.kind, rtype.group, "", [("metadata.name", "Required value: name or generateName is required")]
            )
        with self.store.lock:
            self._check_namespace(rtype, namespace)
            scope = namespace if rtype.namespaced else None
            # Five random characters collide among thousands of pods: the server retries generated names.
            while generated and self.store.get(rtype.plural, scope, meta["name"]):
                meta["name"] = meta["generateName"] + random_suffix()
            if self.store.get(rtype.plural, scope, meta["name"]):
                raise already_exists(rtype.qualified, meta["name"], rtype.group, rtype.plural)
            self._initialise(rtype, obj, namespace)
            if rtype.has_status:
                obj["status"] = clone(body.get("status") if keep_status else _INITIAL_STATUS.get(rtype.plural, {}))
            fields.record_update(None, obj, manager, rtype.has_status, rtype.api_version, now())
            apply_defaults(rtype.plural, obj)
            self.validate(rtype, obj, None)
            self._admit(rtype, obj)
            if dry_run:
                return obj
            created = self.store.put(rtype, obj).obj
            self._note_creation(rtype, created, manager)
            return created

    def apply(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: dict[str, Any],
        manager: str,
        force: bool,
        dry_run: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """Server-side apply; returns (object, whether it was created)."""
        if not manager:
            raise ApiError(400, "PATCH, PUT failed: fieldManager is required for apply requests")
        self._check_body(rtype, body, namespace, name)
        with self.store.lock:
            live = self.store.get(rtype.plural, namespace if rtype.namespaced else None, name)
            if live is None:
                self._check_namespace(rtype, namespace)
            new = fields.apply(
                live.obj if live else None, body, manager, force, rtype.has_status, rtype.api_version, now()
            )
            new["apiVersion"], new["kind"] = rtype.api_version, rtype.kind
            if live is None:
                new["metadata"]["name"] = name
                self._initialise(rtype, new, namespace)
                if rtype.has_status:
                    new["status"] = clone(_INITIAL_STATUS.get(rtype.plural, {}))
                apply_defaults(rtype.plural, new)
                self._admit(rtype, new)
            committed = self._commit(rtype, live, new, dry_run)
            if live is None and not dry_run:
                self._note_creation(rtype, committed, manager)
            return committed, live is None

    def patch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        patch_type: str,
        manager: str,
        dry_run: bool = False,
        subresource: str = "",
    ) -> dict[str, Any]:
        with self.store.lock:
            live = self.get(rtype, namespace, name)
            if patch_type == "merge":
                patched = fields.merge_patch(live.obj, body)
            elif patch_type == "strategic":
                patched = fields.strategic_merge_patch(live.obj, body)
            elif patch_type == "json":
                patched = fields.json_patch(live.obj, body)
            else:
                raise ApiError(415, f"unsupported patch type {patch_type}")
            if not isinstance(patched, dict):
                raise ApiError(400, "the patch did not produce an object")
            return self._replace(rtype, live, patched, manager, dry_run, subresource)

    def update(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: dict[str, Any],
        manager: str,
        dry_run: bool = False,
        subresource: str = "",
    ) -> dict[str, Any]:
        self._check_body(rtype, body, namespace, name)
        with self.store.lock:
            live = self.get(rtype, namespace, name)
            return self._replace(rtype, live, clone(body), manager, dry_run, subresource)

    def mutate(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        change: Callable[[dict[str, Any]], None],
        manager: str,
        subresource: str = "",
    ) -> dict[str, Any] | None:
        """Change an object in place (for the simulated controllers); None when it does not exist."""
        with self.store.lock:
            live = self.store.get(rtype.plural, namespace if rtype.namespaced else None, name)
            if live is None:
                return None
            new = clone(live.obj)
            change(new)
            return self._replace(rtype, live, new, manager, False, subresource, trusted=True)

    def _replace(
        self,
        rtype: ResourceType,
        live: Entry,
        new: dict[str, Any],
        manager: str,
        dry_run: bool,
        subresource: str,
        trusted: bool = False,
    ) -> dict[str, Any]:
        old = live.obj
        wanted_rv = (new.get("metadata") or {}).get("resourceVersion")
        if not trusted and wanted_rv and wanted_rv != old["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                f'Operation cannot be fulfilled on {rtype.qualified} "{old["metadata"]["name"]}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                details={"name": old["metadata"]["name"], "group": rtype.group, "kind": rtype.plural},
            )
        if subresource == "status":
            merged = clone(old)
            merged["status"] = new.get("status", {})
            if trusted and "annotations" in new.get("metadata", {}):
                # The simulated kubelet stamps when it reported capacity in the same write as the capacity.
                merged["metadata"]["annotations"] = new["metadata"]["annotations"]
            new = merged
        else:
            meta = new.setdefault("metadata", {})
            for key in ("name", "namespace", "uid", "creationTimestamp", "generation", "deletionTimestamp"):
                if key in old["metadata"]:
                    meta[key] = old["metadata"][key]
            meta.pop("managedFields", None)
            if rtype.has_status and not trusted:
                new["status"] = clone(old.get("status", {}))
        new["apiVersion"], new["kind"] = rtype.api_version, rtype.kind
        new["metadata"]["managedFields"] = clone(old["metadata"].get("managedFields", []))
        fields.record_update(old, new, manager, rtype.has_status, rtype.api_version, now(), subresource)
        return self._commit(rtype, live, new, dry_run)

    def _commit(self, rtype: ResourceType, live: Entry | None, new: dict[str, Any], dry_run: bool) -> dict[str, Any]:
        old = live.obj if live else None
        apply_defaults(rtype.plural, new)
        self.validate(rtype, new, old)
        if old is not None:
            if _same(new, old):
                return old
            if _spec_part(new) != _spec_part(old):
                new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        if dry_run:
            return new
        return self.store.put(rtype, new).obj

    def delete(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        propagation: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        with self.store.lock:
            live = self.get(rtype, namespace, name)
            uid = live.obj["metadata"].get("uid")
            if dry_run:
                return live.obj if rtype.plural == "pods" else self._deleted_status(rtype, live.obj)
            if rtype.plural == "namespaces":
                self._empty_namespace(name)
            if propagation == "Orphan":
                self._orphan(uid, namespace)
            elif propagation == "Foreground":
                for dep in self.dependents(uid, namespace):
                    self.store.remove(BY_PLURAL["pods"], namespace, dep.obj["metadata"]["name"])
            # Background (the default) leaves dependents to the garbage collector, as the real server does.
            final = self.store.remove(rtype, namespace, name)
            assert final is not None
            return final.obj if rtype.plural == "pods" else self._deleted_status(rtype, final.obj)

    def dependents(self, owner_uid: str | None, namespace: str | None) -> list[Entry]:
        pods, _rv = self.store.list("pods", namespace)
        return [
            p
            for p in pods
            if any(ref.get("uid") == owner_uid for ref in p.obj["metadata"].get("ownerReferences") or [])
        ]

    def _orphan(self, owner_uid: str | None, namespace: str | None) -> None:
        for dep in self.dependents(owner_uid, namespace):
            obj = clone(dep.obj)
            refs = [r for r in obj["metadata"].get("ownerReferences", []) if r.get("uid") != owner_uid]
            obj["metadata"]["ownerReferences"] = refs
            if not refs:
                del obj["metadata"]["ownerReferences"]
            self.store.put(BY_PLURAL["pods"], obj)

    def _empty_namespace(self, namespace: str) -> None:
        for rtype in BY_PLURAL.values():
            if rtype.namespaced:
                entries, _rv = self.store.list(rtype.plural, namespace)
                for entry in entries:
                    self.store.remove(rtype, namespace, entry.obj["metadata"]["name"])

    @staticmethod
    def _deleted_status(rtype: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": obj["metadata"]["name"],
                "group": rtype.group,
                "kind": rtype.plural,
                "uid": obj["metadata"].get("uid"),
            },
        }

    # ----- admission --------------------------------------------------------------------------------------------

    def _admit(self, rtype: ResourceType, obj: dict[str, Any]) -> None:
        """The admission plugins that act on new pods: Priority, then Pod Security (see admission.py)."""
        if rtype.plural != "pods":
            return
        classes = {e.obj["metadata"]["name"]: e.obj for e in self.store.list("priorityclasses", None)[0]}
        admission.resolve_priority(classes, obj)
        namespace = self.store.get("namespaces", None, obj["metadata"].get("namespace", ""))
        admission.enforce_pod_security(namespace.obj if namespace else None, obj)

    def _note_creation(self, rtype: ResourceType, obj: dict[str, Any], manager: str) -> None:
        meta = obj["metadata"]
        self.creations.append(
            {
                "kind": rtype.kind,
                "namespace": meta.get("namespace"),
                "name": meta["name"],
                "labels": dict(meta.get("labels") or {}),
                "node": (obj.get("spec") or {}).get("nodeName") if rtype.plural == "pods" else None,
                "manager": manager,
            }
        )

    # ----- checks -----------------------------------------------------------------------------------------------

    def _check_namespace(self, rtype: ResourceType, namespace: str | None) -> None:
        if rtype.namespaced and not self.store.get("namespaces", None, namespace or ""):
            raise not_found("namespaces", namespace or "", "", "namespaces")

    @staticmethod
    def _check_body(rtype: ResourceType, body: Any, namespace: str | None, name: str | None) -> None:
        if not isinstance(body, dict):
            raise ApiError(
                400,
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json, application/yaml",
            )
        if body.get("apiVersion") and body["apiVersion"] != rtype.api_version:
            raise ApiError(
                400,
                f"the API version in the data ({body['apiVersion']}) does not match the expected API version "
                f"({rtype.api_version})",
            )
        if body.get("kind") and body["kind"] != rtype.kind:
            raise ApiError(
                400, f"the kind in the data ({body['kind']}) does not match the expected kind ({rtype.kind})"
            )
        meta = body.get("metadata") or {}
        if not isinstance(meta, dict):
            raise ApiError(400, "metadata must be an object")
        if name is not None and meta.get("name") and meta["name"] != name:
            raise ApiError(400, f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
        if rtype.namespaced and namespace and meta.get("namespace") and meta["namespace"] != namespace:
            raise ApiError(400, "the namespace of the provided object does not match the namespace sent on the request")
        for section in ("labels", "annotations"):
            for key, value in (meta.get(section) or {}).items():
                if not isinstance(value, str):
                    raise ApiError(
                        400,
                        f"json: cannot unmarshal {type(value).__name__} into Go struct field "
                        f"ObjectMeta.metadata.{section} of type string ({key})",
                    )
        if rtype.plural == "configmaps":
            for key, value in (body.get("data") or {}).items():
                if not isinstance(value, str):
                    raise ApiError(
                        400,
                        f"json: cannot unmarshal {type(value).__name__} into Go struct field ConfigMap.data of type "
                        f"string ({key})",
                    )

    def _initialise(self, rtype: ResourceType, obj: dict[str, Any], namespace: str | None) -> None:
        meta = obj["metadata"]
        if rtype.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        else:
            meta.pop("namespace", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now()
        meta["generation"] = 1
        meta.pop("resourceVersion", None)
        obj["apiVersion"], obj["kind"] = rtype.api_version, rtype.kind

    def validate(self, rtype: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        meta = obj.get("metadata", {})
        name = meta.get("name", "")
        causes: list[tuple[str, str]] = []
        pattern, help_text = (_LABEL, _LABEL_HELP) if rtype.plural == "namespaces" else (_SUBDOMAIN, _SUBDOMAIN_HELP)
        if not pattern.match(name) or len(name) > 253:
            causes.append(("metadata.name", f'Invalid value: "{name}": {help_text}'))
        for key, value in (meta.get("labels") or {}).items():
            if not _LABEL_VALUE.match(value) or len(value) > 63:
                causes.append(("metadata.labels", f'Invalid value: "{value}": label value for {key} is not valid'))
        if rtype.plural == "daemonsets":
            causes += _daemonset_problems(obj, old)
        elif rtype.plural == "pods":
            if not (obj.get("spec") or {}).get("containers"):
                causes.append(("spec.containers", "Required value"))
        elif rtype.plural == "runtimeclasses":
            handler = obj.get("handler")
            if not handler:
                causes.append(("handler", "Required value"))
            elif not _LABEL.match(str(handler)):
                causes.append(("handler", f'Invalid value: "{handler}": {_LABEL_HELP}'))
            if old is not None and old.get("handler") != handler:
                causes.append(("handler", "Invalid value: field is immutable"))
        elif rtype.plural == "priorityclasses":
            causes += admission.priority_class_problems(obj, old)
        if causes:
            raise invalid(rtype.kind, rtype.group, name, causes)


def _daemonset_problems(obj: dict[str, Any], old: dict[str, Any] | None) -> list[tuple[str, str]]:
    from .selectors import selector_from_label_selector

    causes: list[tuple[str, str]] = []
    spec = obj.get("spec") or {}
    selector = spec.get("selector")
    template = spec.get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    if not selector or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        causes.append(("spec.selector", "Required value"))
    elif not selector_from_label_selector(selector)(labels):
        causes.append(
            ("spec.template.metadata.labels", f"Invalid value: {labels!r}: `selector` does not match template `labels`")
        )
    containers = (template.get("spec") or {}).get("containers") or []
    if not containers:
        causes.append(("spec.template.spec.containers", "Required value"))
    for index, container in enumerate(containers):
        if not container.get("name"):
            causes.append((f"spec.template.spec.containers[{index}].name", "Required value"))
        if not container.get("image"):
            causes.append((f"spec.template.spec.containers[{index}].image", "Required value"))
    if old is not None and (old.get("spec") or {}).get("selector") != selector:
        causes.append(("spec.selector", "Invalid value: field is immutable"))
    return causes
