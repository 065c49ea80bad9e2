"""Change detection and diff over objects as the API server returns them."""

from __future__ import annotations

import copy

from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.apply import (
    apply_object,
    changed_paths,
    comparable,
    delete_object,
    diff_entry,
    summary,
)
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.errors import KubeApiError

CONFIG_MAP = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "cfg", "namespace": "kube-system", "labels": {"app.kubernetes.io/managed-by": "kubegpu.node"}},
    "data": {"config.yaml": "a"},
}


def served(obj, version="100", generation=1):
    result = copy.deepcopy(obj)
    result["metadata"].update(
        resourceVersion=version,
        uid="u-1",
        generation=generation,
        creationTimestamp="2026-11-20T09:00:00Z",
        managedFields=[{"manager": "kubegpu.node", "operation": "Apply"}],
    )
    result["status"] = {"numberReady": 1}
    return result


class FakeClient:
    def __init__(self, existing=None, answer=None):
        self.existing = existing
        self.answer = answer
        self.calls = []

    def get_or_none(self, path, query=None):
        self.calls.append(("GET", path, query))
        return copy.deepcopy(self.existing)

    def request(self, method, path, query=None, body=None, content_type=None, timeout=30.0):
        self.calls.append((method, path, query, content_type))
        return copy.deepcopy(self.answer)


def test_comparable_drops_server_bookkeeping():
    obj = served(CONFIG_MAP)
    obj["metadata"]["annotations"] = {"deprecated.daemonset.template.generation": "3"}
    assert comparable(obj) == CONFIG_MAP
    assert comparable(None) is None


def test_changed_paths():
    before = {"spec": {"a": 1, "b": [1, 2]}, "metadata": {"name": "x"}}
    after = {"spec": {"a": 2, "b": [1, 2], "c": 3}, "metadata": {"name": "x"}}
    assert changed_paths(before, after) == ["spec.a", "spec.c"]
    assert changed_paths(before, before) == []


def test_apply_creates():
    client = FakeClient(existing=None, answer=served(CONFIG_MAP))
    result = apply_object(client, CONFIG_MAP, "kubegpu.node", force=False, dry_run=False)
    assert (result["action"], result["changed"]) == ("created", True)
    method, path, query, content_type = client.calls[1]
    assert (method, path) == ("PATCH", "/api/v1/namespaces/kube-system/configmaps/cfg")
    assert query == {"fieldManager": "kubegpu.node", "force": "false"}
    assert content_type == "application/apply-patch+yaml"


def test_apply_unchanged_when_only_bookkeeping_moves():
    client = FakeClient(existing=served(CONFIG_MAP, "100"), answer=served(CONFIG_MAP, "101", generation=2))
    result = apply_object(client, CONFIG_MAP, "kubegpu.node", force=True, dry_run=False)
    assert (result["action"], result["changed"], result["changed_fields"]) == ("unchanged", False, [])
    assert client.calls[1][2]["force"] == "true"


def test_apply_updated_in_check_mode_uses_dry_run():
    changed = copy.deepcopy(CONFIG_MAP)
    changed["data"]["config.yaml"] = "b"
    client = FakeClient(existing=served(CONFIG_MAP), answer=served(changed, "101"))
    result = apply_object(client, changed, "kubegpu.node", force=False, dry_run=True)
    assert client.calls[1][2]["dryRun"] == "All"
    assert result["changed_fields"] == ["data.config.yaml"]
    diff = diff_entry(result)
    assert diff["before_header"] == "ConfigMap kube-system/cfg"
    assert diff["before"]["data"] == {"config.yaml": "a"}
    assert diff["after"]["data"] == {"config.yaml": "b"}
    assert summary(result) == {
        "kind": "ConfigMap",
        "name": "cfg",
        "namespace": "kube-system",
        "action": "updated",
        "changed": True,
        "changed_fields": ["data.config.yaml"],
    }


def test_delete_only_objects_we_manage():
    ours = FakeClient(existing=served(CONFIG_MAP), answer={})
    result = delete_object(ours, CONFIG_MAP, dry_run=True)
    assert (result["action"], result["changed"]) == ("deleted", True)
    assert ours.calls[1][0] == "DELETE"
    assert ours.calls[1][2]["dryRun"] == "All"

    foreign = copy.deepcopy(CONFIG_MAP)
    foreign["metadata"]["labels"] = {}
    theirs = FakeClient(existing=served(foreign), answer={})
    result = delete_object(theirs, CONFIG_MAP, dry_run=False)
    assert (result["action"], result["changed"]) == ("kept", False)
    assert "not created by kubegpu.node" in result["warning"]
    assert [call[0] for call in theirs.calls] == ["GET"]

    gone = FakeClient(existing=None)
    assert delete_object(gone, CONFIG_MAP, dry_run=False)["action"] == "absent"


def test_api_error_message_has_status_and_reason():
    error = KubeApiError(
        403,
        "Forbidden",
        "PATCH",
        "/apis/apps/v1/namespaces/kube-system/daemonsets/x",
        b'{"kind":"Status","status":"Failure","message":"daemonsets.apps \\"x\\" is forbidden: User \\"dev\\" cannot '
        b'patch resource","reason":"Forbidden","code":403}',
    )
    assert error.msg.startswith("PATCH /apis/apps/v1/namespaces/kube-system/daemonsets/x failed: HTTP 403 Forbidden")
    assert 'User "dev" cannot patch resource' in error.msg
    assert "RBAC" in error.msg
    assert error.details["status"] == 403
    assert error.details["reason"] == "Forbidden"
