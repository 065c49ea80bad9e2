"""Option checks that the argument spec cannot express."""

from __future__ import annotations

import pytest
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.args import (
    ARGUMENT_SPEC,
    check_options,
    expected_counts,
    image_reference,
    runtime_class_name,
)


def params(**overrides):
    values = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    values.update(overrides)
    return values


def test_defaults_are_valid():
    assert check_options(params()) == []


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"wait_timeout": 0}, "wait_timeout: must be a positive number"),
        ({"wait_timeout": -5}, "wait_timeout: must be a positive number"),
        ({"expected_gpus": {"gpu-1": -1}}, "expected_gpus[gpu-1]: GPU count must not be negative (-1)"),
        ({"expected_gpus": {"gpu-1": "many"}}, "expected_gpus[gpu-1]: 'many' is not a whole number"),
        ({"expected_gpus": {}}, "expected_gpus: must name at least one node"),
        ({"nodes": []}, "nodes: must name at least one node"),
        ({"name": "Bad_Name"}, "name: 'Bad_Name' is not a valid Kubernetes object name"),
        ({"namespace": "kube.system"}, "namespace: 'kube.system' is not a valid namespace name"),
        ({"runtime_class": "Nvidia Runtime"}, "runtime_class: 'Nvidia Runtime' is not a valid RuntimeClass name"),
        ({"runtime_class": 3}, "runtime_class: must be true, false or a RuntimeClass name"),
        ({"version": "0.20 beta"}, "version: '0.20 beta' is not a valid image tag"),
        ({"host": "https://k8s:6443"}, "host: needs credentials"),
        ({"api_key": "t0ken"}, "api_key: needs host"),
        ({"tolerations": [{"key": "a", "operator": "Maybe"}]}, "tolerations[0].operator: must be Equal or Exists"),
        ({"tolerations": [{"key": "a", "effect": "NoRun"}]}, "tolerations[0].effect: must be NoSchedule"),
        ({"tolerations": [{"keys": "a"}]}, "tolerations[0]: unknown keys keys"),
        ({"node_selector": {"gpu": True}}, "node_selector[gpu]: label values must be strings"),
        ({"state": "absent", "expected_gpus": {"a": 1}}, "expected_gpus: has no meaning with state=absent"),
    ],
)
def test_bad_options_are_reported(overrides, fragment):
    problems = check_options(params(**overrides))
    assert any(fragment in problem for problem in problems), problems


def test_host_with_client_certificate_is_enough():
    assert check_options(params(host="https://k8s:6443", client_cert="/c", client_key="/k")) == []


def test_expected_counts_accepts_numeric_strings():
    assert expected_counts(params(expected_gpus={"a": "8", "b": 0})) == {"a": 8, "b": 0}
    assert expected_counts(params()) is None


@pytest.mark.parametrize(
    ("value", "name"),
    [(True, "nvidia"), (False, None), (None, None), ("nvidia-cdi", "nvidia-cdi"), ("yes", "nvidia"), ("false", None)],
)
def test_runtime_class_name(value, name):
    assert runtime_class_name(value) == name


def test_image_reference():
    assert image_reference(params()) == "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    assert image_reference(params(version="v0.18.2")) == "nvcr.io/nvidia/k8s-device-plugin:v0.18.2"
    assert image_reference(params(image="mirror/dp:1")) == "mirror/dp:1"


def test_kubeconfig_secrets_finds_credentials_of_every_user():
    from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.args import kubeconfig_secrets

    kubeconfig = {
        "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443", "certificate-authority-data": "CA"}}],
        "users": [
            {"name": "admin", "user": {"token": "tok-123"}},
            {"name": "cert", "user": {"client-certificate-data": "CERT", "client-key-data": "KEY-456"}},
            {"name": "oidc", "user": {"auth-provider": {"config": {"id-token": "id-789", "client-id": "kubectl"}}}},
        ],
    }
    assert kubeconfig_secrets(kubeconfig) == {"tok-123", "KEY-456", "id-789"}
    assert kubeconfig_secrets({}) == set()
