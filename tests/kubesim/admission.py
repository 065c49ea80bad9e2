"""Admission of new pods: the Priority plugin and Pod Security admission, as the real API server runs them.

- Priority (k8s.io/kubernetes plugin/pkg/admission/priority): a pod's ``priorityClassName`` is resolved to
  ``spec.priority`` and ``spec.preemptionPolicy`` from the PriorityClass (the ``globalDefault`` class, or 0 and
  PreemptLowerPriority, when the pod names none); a class that does not exist, or a ``spec.priority`` that differs from
  the class's value, is refused with 403. The API server creates ``system-node-critical`` and
  ``system-cluster-critical`` at start (``SYSTEM_PRIORITY_CLASSES``).
- Pod Security admission (k8s.io/pod-security-admission): a namespace labelled ``pod-security.kubernetes.io/enforce``
  ``baseline`` or ``restricted`` refuses pods that break that level, with the real message shape ``pods "NAME" is
  forbidden: violates PodSecurity "restricted:latest": REASON (DETAIL), ...``. The checks follow the policy package
  (policy/check_*.go, one function each below): baseline's privileged, host namespaces, hostPath volumes, host ports
  and added capabilities; restricted adds the volume types, allowPrivilegeEscalation, runAsNonRoot, runAsUser,
  seccompProfile and capabilities. Only ``enforce`` is modelled (``audit`` and ``warn`` change nothing a client sees
  but a warning header), and the version label is read as "latest". Exemptions and user namespaces are not modelled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .errors import ApiError

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
LEVELS = ("privileged", "baseline", "restricted")
SYSTEM_PRIORITY_CLASSES = {"system-node-critical": 2000001000, "system-cluster-critical": 2000000000}
# The highest value a class not named system-* may have (pkg/apis/scheduling: HighestUserDefinablePriority).
HIGHEST_USER_PRIORITY = 1_000_000_000
PREEMPTION_POLICIES = ("PreemptLowerPriority", "Never")

# Capabilities baseline allows a container to add (policy/check_capabilities_baseline.go).
_BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
# Volume types restricted allows (policy/check_restrictedVolumes.go).
_RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
        "image",
    }
)

Finding = tuple[str, str]  # (forbidden reason, detail)


def _containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Init, regular and ephemeral containers, as the policy package's visitContainers walks them."""
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(key) or []:
            if isinstance(container, dict):
                yield container


def _context(container: dict[str, Any]) -> dict[str, Any]:
    return container.get("securityContext") or {}


def _quote(names: list[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


def _containers_phrase(names: list[str]) -> str:
    return f"{'container' if len(names) == 1 else 'containers'} {_quote(names)}"


# ----- baseline ---------------------------------------------------------------------------------------------------


def check_privileged(spec: dict[str, Any]) -> Finding | None:
    bad = [c.get("name", "") for c in _containers(spec) if _context(c).get("privileged") is True]
    if bad:
        return "privileged", f"{_containers_phrase(bad)} must not set securityContext.privileged=true"
    return None


def check_host_namespaces(spec: dict[str, Any]) -> Finding | None:
    used = [f"{key}=true" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key) is True]
    if used:
        return "host namespaces", ", ".join(used)
    return None


def check_host_path_volumes(spec: dict[str, Any]) -> Finding | None:
    bad = [v.get("name", "") for v in spec.get("volumes") or [] if isinstance(v, dict) and "hostPath" in v]
    if bad:
        return "hostPath volumes", f"{'volume' if len(bad) == 1 else 'volumes'} {_quote(bad)}"
    return None


def check_host_ports(spec: dict[str, Any]) -> Finding | None:
    bad, ports = [], []
    for container in _containers(spec):
        found = [str(p.get("hostPort")) for p in container.get("ports") or [] if (p or {}).get("hostPort")]
        if found:
            bad.append(container.get("name", ""))
            ports += found
    if bad:
        return (
            "hostPort",
            f"{_containers_phrase(bad)} {'uses' if len(bad) == 1 else 'use'} hostPorts {', '.join(ports)}",
        )
    return None


def check_capabilities_baseline(spec: dict[str, Any]) -> Finding | None:
    bad, added = [], []
    for container in _containers(spec):
        added = (_context(container).get("capabilities") or {}).get("add") or []
        extra = [c for c in added if c not in _BASELINE_CAPABILITIES]
        if extra:
            bad.append(container.get("name", ""))
            added += extra
    if bad:
        return "non-default capabilities", (
            f"{_containers_phrase(bad)} must not include {_quote(sorted(set(added)))} in "
            "securityContext.capabilities.add"
        )
    return None


# ----- restricted -------------------------------------------------------------------------------------------------


def check_restricted_volumes(spec: dict[str, Any]) -> Finding | None:
    bad, types = [], []
    for volume in spec.get("volumes") or []:
        if not isinstance(volume, dict):
            continue
        kinds = [k for k in volume if k != "name"]
        wrong = [k for k in kinds if k not in _RESTRICTED_VOLUMES]
        if wrong:
            bad.append(volume.get("name", ""))
            types += wrong
    if bad:
        return "restricted volume types", (
            f"{'volume' if len(bad) == 1 else 'volumes'} {_quote(bad)} "
            f"{'uses' if len(bad) == 1 else 'use'} restricted volume type {_quote(sorted(set(types)))}"
        )
    return None


def check_allow_privilege_escalation(spec: dict[str, Any]) -> Finding | None:
    # Every container must set it to false: unset counts as allowed (policy/check_allowPrivilegeEscalation.go).
    bad = [c.get("name", "") for c in _containers(spec) if _context(c).get("allowPrivilegeEscalation") is not False]
    if bad:
        return "allowPrivilegeEscalation != false", (
            f"{_containers_phrase(bad)} must set securityContext.allowPrivilegeEscalation=false"
        )
    return None


def check_run_as_non_root(spec: dict[str, Any]) -> Finding | None:
    """runAsNonRoot=true on the pod, or on every container; false anywhere is refused (policy/check_runAsNonRoot.go)."""
    pod_value = (spec.get("securityContext") or {}).get("runAsNonRoot")
    bad_setters = ["pod"] if pod_value is False else []
    explicit, implicit = [], []
    for container in _containers(spec):
        value = _context(container).get("runAsNonRoot")
        if value is False:
            explicit.append(container.get("name", ""))
        elif value is None and pod_value is not True:
            implicit.append(container.get("name", ""))
    if explicit:
        bad_setters.append(_containers_phrase(explicit))
    if bad_setters:
        return "runAsNonRoot != true", f"{' and '.join(bad_setters)} must not set securityContext.runAsNonRoot=false"
    if implicit:
        return (
            "runAsNonRoot != true",
            f"pod or {_containers_phrase(implicit)} must set securityContext.runAsNonRoot=true",
        )
    return None


def check_run_as_user(spec: dict[str, Any]) -> Finding | None:
    setters = ["pod"] if (spec.get("securityContext") or {}).get("runAsUser") == 0 else []
    bad = [c.get("name", "") for c in _containers(spec) if _context(c).get("runAsUser") == 0]
    if bad:
        setters.append(_containers_phrase(bad))
    if setters:
        return "runAsUser=0", f"{' and '.join(setters)} must not set runAsUser=0"
    return None


def check_seccomp_restricted(spec: dict[str, Any]) -> Finding | None:
    """RuntimeDefault or Localhost on the pod, or on every container (policy/check_seccompProfile_restricted.go)."""
    allowed = ("RuntimeDefault", "Localhost")
    pod_profile = (spec.get("securityContext") or {}).get("seccompProfile")
    bad_setters, bad_values = [], set()
    pod_set = False
    if pod_profile is not None:
        if pod_profile.get("type") in allowed:
            pod_set = True
        else:
            bad_setters.append("pod")
            bad_values.add(str(pod_profile.get("type")))
    explicit, implicit = [], []
    for container in _containers(spec):
        profile = _context(container).get("seccompProfile")
        if profile is not None:
            if profile.get("type") not in allowed:
                explicit.append(container.get("name", ""))
                bad_values.add(str(profile.get("type")))
        elif not pod_set:
            implicit.append(container.get("name", ""))
    if explicit:
        bad_setters.append(_containers_phrase(explicit))
    if bad_setters:
        return "seccompProfile", (
            f"{' and '.join(bad_setters)} must not set securityContext.seccompProfile.type to "
            f"{_quote(sorted(bad_values))}"
        )
    if implicit:
        return "seccompProfile", (
            f'pod or {_containers_phrase(implicit)} must set securityContext.seccompProfile.type to "RuntimeDefault" '
            'or "Localhost"'
        )
    return None


def check_capabilities_restricted(spec: dict[str, Any]) -> Finding | None:
    """drop must include ALL; add may hold only NET_BIND_SERVICE (policy/check_capabilities_restricted.go)."""
    missing_drop, adding, forbidden = [], [], set()
    for container in _containers(spec):
        capabilities = _context(container).get("capabilities")
        if capabilities is None:
            missing_drop.append(container.get("name", ""))
            continue
        if "ALL" not in (capabilities.get("drop") or []):
            missing_drop.append(container.get("name", ""))
        extra = [c for c in capabilities.get("add") or [] if c != "NET_BIND_SERVICE"]
        if extra:
            adding.append(container.get("name", ""))
            forbidden.update(extra)
    details = []
    if missing_drop:
        details.append(f'{_containers_phrase(missing_drop)} must set securityContext.capabilities.drop=["ALL"]')
    if adding:
        details.append(
            f"{_containers_phrase(adding)} must not include {_quote(sorted(forbidden))} in "
            "securityContext.capabilities.add"
        )
    if details:
        return "unrestricted capabilities", "; ".join(details)
    return None


BASELINE_CHECKS: tuple[Callable[[dict[str, Any]], Finding | None], ...] = (
    check_privileged,
    check_host_namespaces,
    check_host_path_volumes,
    check_host_ports,
    check_capabilities_baseline,
)
RESTRICTED_CHECKS: tuple[Callable[[dict[str, Any]], Finding | None], ...] = (
    check_restricted_volumes,
    check_allow_privilege_escalation,
    check_run_as_non_root,
    check_run_as_user,
    check_seccomp_restricted,
    check_capabilities_restricted,
)


def pod_security_findings(level: str, spec: dict[str, Any]) -> list[Finding]:
    """What a pod spec breaks at ``level`` (privileged, baseline, restricted), in the policy package's order."""
    if level not in LEVELS:
        raise ValueError(f"unknown Pod Security level {level!r}")
    checks = () if level == "privileged" else BASELINE_CHECKS + (RESTRICTED_CHECKS if level == "restricted" else ())
    return [finding for check in checks if (finding := check(spec)) is not None]


def enforce_pod_security(namespace: dict[str, Any] | None, pod: dict[str, Any]) -> None:
    """Refuse the pod (403) when it breaks its namespace's enforced level."""
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    level = labels.get(ENFORCE_LABEL, "privileged")
    if level not in LEVELS:
        return  # the real server ignores an invalid label value here and falls back to its default (privileged)
    findings = pod_security_findings(level, pod.get("spec") or {})
    if findings:
        name = (pod.get("metadata") or {}).get("name", "")
        detail = ", ".join(f"{reason} ({text})" for reason, text in findings)
        raise ApiError(403, f'pods "{name}" is forbidden: violates PodSecurity "{level}:latest": {detail}')


def resolve_priority(classes: dict[str, dict[str, Any]], pod: dict[str, Any]) -> None:
    """Set spec.priority and spec.preemptionPolicy from the pod's PriorityClass, as the Priority plugin does."""
    spec = pod.setdefault("spec", {})
    name = spec.get("priorityClassName")
    name_text = (pod.get("metadata") or {}).get("name", "")
    if name:
        chosen = classes.get(name)
        if chosen is None:
            raise ApiError(403, f'pods "{name_text}" is forbidden: no PriorityClass with name {name} was found')
    else:
        chosen = next((c for c in classes.values() if c.get("globalDefault")), None)
        if chosen is not None:
            spec["priorityClassName"] = chosen["metadata"]["name"]
    value = int(chosen.get("value", 0)) if chosen else 0
    if spec.get("priority") is not None and int(spec["priority"]) != value:
        raise ApiError(
            403,
            f'pods "{name_text}" is forbidden: the integer value of priority ({spec["priority"]}) must not be '
            f"provided in pod spec; priority admission controller computed {value} from the given PriorityClass name",
        )
    spec["priority"] = value
    spec["preemptionPolicy"] = (
        (chosen or {}).get("preemptionPolicy") or spec.get("preemptionPolicy") or ("PreemptLowerPriority")
    )


def priority_class_problems(obj: dict[str, Any], old: dict[str, Any] | None) -> list[tuple[str, str]]:
    """Validation of a PriorityClass (pkg/apis/scheduling/validation)."""
    causes: list[tuple[str, str]] = []
    name = (obj.get("metadata") or {}).get("name", "")
    value = obj.get("value")
    if not isinstance(value, int) or isinstance(value, bool):
        causes.append(("value", "Required value"))
    elif name not in SYSTEM_PRIORITY_CLASSES and value > HIGHEST_USER_PRIORITY:
        causes.append(
            (
                "value",
                f"Invalid value: {value}: maximum allowed value of a user defined priority is {HIGHEST_USER_PRIORITY}",
            )
        )
    if name.startswith("system-") and name not in SYSTEM_PRIORITY_CLASSES:
        causes.append(
            (
                "metadata.name",
                f"Invalid value: \"{name}\": priority class names with 'system-' prefix are "
                "reserved for system use only",
            )
        )
    policy = obj.get("preemptionPolicy")
    if policy is not None and policy not in PREEMPTION_POLICIES:
        causes.append(
            (
                "preemptionPolicy",
                f'Unsupported value: "{policy}": supported values: '
                f'"{PREEMPTION_POLICIES[1]}", "{PREEMPTION_POLICIES[0]}"',
            )
        )
    if old is not None:
        if old.get("value") != value:
            causes.append(("value", "Forbidden: may not be changed in an update."))
        if (old.get("preemptionPolicy") or "PreemptLowerPriority") != (policy or "PreemptLowerPriority"):
            causes.append(("preemptionPolicy", "Invalid value: field is immutable"))
    return causes
