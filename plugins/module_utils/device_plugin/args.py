# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Private to kubegpu.node.nvidia_device_plugin: the argument spec, shared by the module and its tests, and the checks
# that an argument spec cannot express (pure, before any API call); with the connection's options and the
# AnsibleModule of every module of the collection that talks to the API.

from __future__ import annotations

import re

from ansible.module_utils.basic import AnsibleModule, env_fallback

DEFAULT_VERSION = "v0.20.0"
DEFAULT_REGISTRY = "nvcr.io/nvidia"
IMAGE_REPOSITORY = "k8s-device-plugin"
DEFAULT_NAME = "nvidia-device-plugin-daemonset"
DEFAULT_NAMESPACE = "kube-system"
DEFAULT_CONFIG_MAP = "nvidia-device-plugin-config"
DEFAULT_RUNTIME_CLASS = "nvidia"
DEFAULT_FIELD_MANAGER = "kubegpu.node"

AUTH_ARG_SPEC = dict(
    kubeconfig=dict(type="raw", fallback=(env_fallback, ["K8S_AUTH_KUBECONFIG"])),
    context=dict(type="str", fallback=(env_fallback, ["K8S_AUTH_CONTEXT"])),
    host=dict(type="str", fallback=(env_fallback, ["K8S_AUTH_HOST"])),
    api_key=dict(type="str", no_log=True, fallback=(env_fallback, ["K8S_AUTH_API_KEY"])),
    # No default, as in kubernetes.core: unset keeps the kubeconfig's own insecure-skip-tls-verify.
    validate_certs=dict(type="bool", aliases=["verify_ssl"], fallback=(env_fallback, ["K8S_AUTH_VERIFY_SSL"])),
    ca_cert=dict(type="path", aliases=["ssl_ca_cert"], fallback=(env_fallback, ["K8S_AUTH_SSL_CA_CERT"])),
    client_cert=dict(type="path", aliases=["cert_file"], fallback=(env_fallback, ["K8S_AUTH_CERT_FILE"])),
    client_key=dict(type="path", aliases=["key_file"], no_log=False, fallback=(env_fallback, ["K8S_AUTH_KEY_FILE"])),
    proxy=dict(type="str", fallback=(env_fallback, ["K8S_AUTH_PROXY"])),
)

PLUGIN_ARG_SPEC = dict(
    state=dict(type="str", default="present", choices=["present", "absent"]),
    namespace=dict(type="str", default=DEFAULT_NAMESPACE),
    name=dict(type="str", default=DEFAULT_NAME),
    version=dict(type="str"),
    registry=dict(type="str"),
    image=dict(type="str"),
    image_pull_policy=dict(type="str", default="IfNotPresent", choices=["Always", "IfNotPresent", "Never"]),
    image_pull_secrets=dict(type="list", elements="str", default=[], no_log=False),
    node_selector=dict(type="dict", default={}),
    affinity=dict(type="dict"),
    tolerations=dict(type="list", elements="dict", default=[]),
    priority_class_name=dict(type="str", default="system-node-critical"),
    resources=dict(type="dict"),
    config=dict(type="dict"),
    config_map_name=dict(type="str", default=DEFAULT_CONFIG_MAP),
    runtime_class=dict(type="raw", default=False),
    force_conflicts=dict(type="bool", default=False),
    field_manager=dict(type="str", default=DEFAULT_FIELD_MANAGER),
    wait=dict(type="bool", default=True),
    wait_timeout=dict(type="int", default=300),
    expected_gpus=dict(type="dict"),
    expected_resources=dict(type="dict"),
    nodes=dict(type="list", elements="str"),
    # GPU health (kubegpu.node.gpu_health): node -> what is known to be wrong with its GPUs, for the diagnosis.
    known_unhealthy=dict(type="dict", default={}),
)

ARGUMENT_SPEC = dict(PLUGIN_ARG_SPEC, **AUTH_ARG_SPEC)

# The connection's options that exclude each other, and those that go together (as in kubernetes.core's modules).
AUTH_MUTUALLY_EXCLUSIVE = [("kubeconfig", "host"), ("kubeconfig", "api_key"), ("context", "host")]
REQUIRED_TOGETHER = [("client_cert", "client_key")]

MUTUALLY_EXCLUSIVE = [("image", "version"), ("image", "registry"), ("expected_gpus", "nodes"), *AUTH_MUTUALLY_EXCLUSIVE]


def kubernetes_module(
    argument_spec: dict,
    mutually_exclusive: list | None = None,
    required_if: list | None = None,
) -> AnsibleModule:
    """The AnsibleModule of each module of the collection that talks to the API (nvidia_device_plugin, node_cordon,
    gpu_health_node, dcgm_exporter): the connection's option rules, check mode supported."""
    return AnsibleModule(
        argument_spec=argument_spec,
        mutually_exclusive=mutually_exclusive or AUTH_MUTUALLY_EXCLUSIVE,
        required_together=REQUIRED_TOGETHER,
        required_if=required_if,
        supports_check_mode=True,
    )


_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}


def runtime_class_name(value) -> str | None:
    """The RuntimeClass to create and run under: None when disabled, 'nvidia' for true, else the given name."""
    if value is None or value is False:
        return None
    if value is True:
        return DEFAULT_RUNTIME_CLASS
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "yes", "on"):
            return DEFAULT_RUNTIME_CLASS
        if lowered in ("false", "no", "off", ""):
            return None
        return value.strip()
    return None


def image_of(params: dict, default_registry: str, repository: str, default_version: str) -> str:
    """The option ``image`` when given, else REGISTRY/REPOSITORY:VERSION from ``registry`` and ``version`` (or their
    defaults); the device plugin module and the DCGM exporter module share the options."""
    if params.get("image"):
        return params["image"]
    registry = (params.get("registry") or default_registry).rstrip("/")
    return f"{registry}/{repository}:{params.get('version') or default_version}"


def image_reference(params: dict) -> str:
    return image_of(params, DEFAULT_REGISTRY, IMAGE_REPOSITORY, DEFAULT_VERSION)


def image_tag(image: str) -> str:
    last = image.rsplit("/", 1)[-1]
    if "@" in last:
        return last.split("@", 1)[1][:63]
    return last.split(":", 1)[1] if ":" in last else "latest"


def image_version_label(image: str) -> str:
    """The image's tag (or digest) as a label value: [A-Za-z0-9_.-], at most 63 characters, alphanumeric at both
    ends."""
    return "".join(c if c.isalnum() or c in "_.-" else "-" for c in image_tag(image))[:63].strip("_.-")


def check_options(params: dict) -> list[str]:
    """Problems with the options that the argument spec cannot catch; empty when they are usable."""
    problems = []
    for option in ("name", "config_map_name"):
        value = params.get(option)
        if value is not None and (len(value) > 253 or not _DNS_SUBDOMAIN.match(value)):
            problems.append(f"{option}: {value!r} is not a valid Kubernetes object name")
    namespace = params.get("namespace")
    if namespace is not None and (len(namespace) > 63 or not _DNS_LABEL.match(namespace)):
        problems.append(f"namespace: {namespace!r} is not a valid namespace name")
    runtime_class = params.get("runtime_class")
    if runtime_class is not None and not isinstance(runtime_class, (bool, str)):
        problems.append("runtime_class: must be true, false or a RuntimeClass name")
    else:
        name = runtime_class_name(runtime_class)
        if name is not None and (len(name) > 253 or not _DNS_SUBDOMAIN.match(name)):
            problems.append(f"runtime_class: {name!r} is not a valid RuntimeClass name")
    version = params.get("version")
    if version is not None and not _TAG.match(version):
        problems.append(f"version: {version!r} is not a valid image tag (for example {DEFAULT_VERSION})")
    for option in ("image", "registry"):
        value = params.get(option)
        if value is not None and (not value.strip() or any(c.isspace() for c in value)):
            problems.append(f"{option}: {value!r} is not a valid image reference")
    timeout = params.get("wait_timeout")
    if timeout is not None and timeout <= 0:
        problems.append(f"wait_timeout: must be a positive number of seconds, not {timeout}")
    expected = params.get("expected_gpus")
    if expected is not None:
        if not expected:
            problems.append("expected_gpus: must name at least one node (or leave it out)")
        for node, count in expected.items():
            if isinstance(count, bool) or not isinstance(count, int):
                try:
                    count = int(str(count), 10)
                except ValueError:
                    problems.append(f"expected_gpus[{node}]: {count!r} is not a whole number of GPUs")
                    continue
            if count < 0:
                problems.append(f"expected_gpus[{node}]: GPU count must not be negative ({count})")
    nodes = params.get("nodes")
    if nodes is not None and not nodes:
        problems.append("nodes: must name at least one node (or leave it out to select nodes by node_selector)")
    for key, value in (params.get("node_selector") or {}).items():
        if not isinstance(value, str):
            problems.append(f"node_selector[{key}]: label values must be strings, not {value!r}")
    for position, toleration in enumerate(params.get("tolerations") or []):
        unknown = set(toleration) - _TOLERATION_KEYS
        if unknown:
            problems.append(f"tolerations[{position}]: unknown keys {', '.join(sorted(unknown))}")
        if toleration.get("operator", "Equal") not in ("Equal", "Exists"):
            problems.append(f"tolerations[{position}].operator: must be Equal or Exists")
        if toleration.get("effect") not in (None, "", "NoSchedule", "PreferNoSchedule", "NoExecute"):
            problems.append(f"tolerations[{position}].effect: must be NoSchedule, PreferNoSchedule or NoExecute")
    if params.get("host") and not (params.get("api_key") or params.get("client_cert")):
        problems.append("host: needs credentials: api_key, or client_cert with client_key")
    if params.get("api_key") and not params.get("host"):
        problems.append("api_key: needs host (the API server URL the token is for)")
    if params.get("state") == "absent" and params.get("expected_gpus"):
        problems.append("expected_gpus: has no meaning with state=absent")
    problems.extend(_expected_resources_problems(params.get("expected_resources")))
    return problems


_EXTENDED_RESOURCE = re.compile(r"^nvidia\.com/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def _whole(value):
    """A non-negative whole number from an int or its text (AWX and -e pass strings); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    text = str(value).strip()
    return int(text, 10) if text.isdigit() else None


def _expected_resources_problems(expected) -> list:
    if expected is None:
        return []
    if not expected:
        return ["expected_resources: must name at least one node (or leave it out)"]
    problems = []
    for node, resources in expected.items():
        if not isinstance(resources, dict):
            problems.append(f"expected_resources[{node}]: must map resource names to counts, not {resources!r}")
            continue
        for name, count in resources.items():
            if not _EXTENDED_RESOURCE.match(str(name)):
                problems.append(
                    f"expected_resources[{node}]: {name!r} is not an NVIDIA resource name (nvidia.com/gpu, "
                    "nvidia.com/mig-1g.10gb)"
                )
            if _whole(count) is None:
                problems.append(f"expected_resources[{node}][{name}]: {count!r} is not a whole number")
    return problems


def expected_resources(params: dict) -> dict | None:
    """Per node, the resources it must advertise before sharing, as whole numbers."""
    expected = params.get("expected_resources")
    if expected is None:
        return None
    return {str(node): {str(k): _whole(v) for k, v in resources.items()} for node, resources in expected.items()}


def expected_counts(params: dict) -> dict | None:
    expected = params.get("expected_gpus")
    if expected is None:
        return None
    return {str(node): int(str(count), 10) if not isinstance(count, int) else count for node, count in expected.items()}


# Credentials a kubeconfig given inline (a dict) can carry; its `users` entries hold them.
KUBECONFIG_SECRET_KEYS = frozenset(
    ("token", "password", "client-key-data", "access-token", "refresh-token", "client-secret", "id-token")
)


def kubeconfig_secrets(kubeconfig) -> set:
    """The secret values inside an inline kubeconfig, so that the module can keep them out of its output."""
    secrets = set()
    pending = [user.get("user") for user in (kubeconfig or {}).get("users") or [] if isinstance(user, dict)]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in KUBECONFIG_SECRET_KEYS and isinstance(value, str) and value:
                    secrets.add(value)
                else:
                    pending.append(value)
        elif isinstance(node, list):
            pending.extend(node)
    return secrets
