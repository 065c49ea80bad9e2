# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The action kubegpu.node.nvidia_driver_plan: reads the node (one command; a full read also checks the package source
# with _apt's source check and lists the GPUs with kubegpu.node.nvidia_pci_gpus) and plans, on the controller, what the
# role kubegpu.node.nvidia_driver does there. It changes nothing. Documentation: plugins/modules/nvidia_driver_plan.py.

from __future__ import annotations

from typing import Any

from ansible.utils.display import Display
from ansible_collections.kubegpu.node.plugins.plugin_utils import _apt
from ansible_collections.kubegpu.node.plugins.plugin_utils import _chain_plan as cp
from ansible_collections.kubegpu.node.plugins.plugin_utils import _nvidia_driver as nd
from ansible_collections.kubegpu.node.plugins.plugin_utils._node_action import NodeAction, NodeError, command_error

display = Display()

ARGUMENT_SPEC: dict[str, Any] = {
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "branch": {"type": "str", "default": ""},
    "version": {"type": "str", "default": ""},
    "source": {"type": "str", "choices": list(nd.SOURCES), "default": "distribution"},
    "flavour": {"type": "str", "choices": list(nd.FLAVOURS), "default": "proprietary"},
    "headless": {"type": "bool", "default": True},
    "extra_packages": {"type": "list", "elements": "str", "default": []},
    "persistenced": {"type": "bool", "default": True},
    "kernels": {"type": "list", "elements": "str", "default": []},
    "manage_repository": {"type": "bool", "default": True},
    "debian_mirror": {"type": "str", "default": "http://deb.debian.org/debian"},
    "debian_security_mirror": {"type": "str", "default": "http://deb.debian.org/debian-security"},
    "repository_url": {"type": "str", "default": ""},
    "repository_suite": {"type": "str", "default": "/"},
    "repository_components": {"type": "list", "elements": "str", "default": []},
    "repository_key": {"type": "str", "default": ""},
    "repository_key_url": {"type": "str", "default": ""},
    "repository_key_fingerprints": {"type": "list", "elements": "str", "default": list(nd.CUDA_KEY_FINGERPRINTS)},
    "repository_key_fingerprint": {"type": "str", "default": ""},
    "min_free_mib": {"type": "int", "default": 1500},
    "checked": {"type": "dict"},
    "error": {"type": "str", "default": ""},
    "facts_now": {"type": "str"},
    "hand_over": {"type": "bool", "default": False},
}


class ActionModule(NodeAction):
    argument_spec = ARGUMENT_SPEC
    failures = (nd.Refusal, NodeError, ValueError)

    def failure_message(self, exc: Exception) -> str:
        return self.host_failure_message(exc)

    def _inputs(self, args: dict[str, Any]) -> nd.Inputs:
        facts = self._vars.get("ansible_facts", {})
        fingerprints = list(args["repository_key_fingerprints"])
        if args["repository_key_fingerprint"]:
            display.deprecated(
                "nvidia_driver_repository_key_fingerprint is deprecated: set nvidia_driver_repository_key_fingerprints "
                "(a list) instead; the single fingerprint given is used as that list",
                version="1.0.0",
                collection_name="kubegpu.node",
            )
            fingerprints = [args["repository_key_fingerprint"]]
        return nd.Inputs(
            state=args["state"],
            branch=str(args["branch"]),
            version=str(args["version"]),
            source=args["source"],
            flavour=args["flavour"],
            headless=args["headless"],
            extra_packages=tuple(args["extra_packages"]),
            persistenced=args["persistenced"],
            kernels=tuple(args["kernels"]),
            manage_repository=args["manage_repository"],
            debian_mirror=args["debian_mirror"],
            debian_security_mirror=args["debian_security_mirror"],
            repository_url=args["repository_url"],
            repository_suite=args["repository_suite"],
            repository_components=tuple(args["repository_components"]),
            repository_key=args["repository_key"],
            repository_key_url=args["repository_key_url"],
            repository_key_fingerprints=tuple(fingerprints),
            min_free_mib=args["min_free_mib"],
            distribution=str(facts.get("distribution", "")),
            distribution_version=str(facts.get("distribution_version", "")),
            distribution_major=str(facts.get("distribution_major_version", "")),
            codename=str(facts.get("distribution_release", "")),
            architecture=str(facts.get("architecture", "")),
        )

    def _read(self, inputs: nd.Inputs, full: bool) -> nd.NodeRead:
        said = self.command(nd.read_argv(inputs.kernels, nd.dpkg_names(inputs), full))
        if said["rc"] != 0:
            raise NodeError(f"reading the node failed (rc {said['rc']}): {command_error(said)}")
        return nd.parse_read(said["stdout"])

    def _check_source(self, inputs: nd.Inputs, node: nd.NodeRead) -> _apt.SourceCheck:
        said = self.command(
            _apt.source_check_argv(
                nd.probed_packages(inputs, node),
                source=inputs.source_text(),
                key=inputs.repository_key if inputs.source != "distribution" else "",
                key_url=inputs.key_url,
            )
        )
        if said["rc"] != 0:
            raise NodeError(f"checking the package source failed (rc {said['rc']}): {command_error(said)}")
        return _apt.parse_source_check(said["stdout"])

    def _run(self, args: dict[str, Any]) -> dict[str, Any]:
        inputs = self._inputs(args)
        nd.check_platform(inputs)
        checked = args["checked"]
        check_mode = bool(self._task.check_mode)
        if inputs.state == "absent":
            node = self._read(inputs, full=True)
            return {"changed": False, "absent": nd.absent_plan(node, node.files)}

        nd.check_inputs(inputs)
        if checked:
            node = self._read(inputs, full=False)
            source = nd.Source(key=checked.get("key"), offered=checked.get("offered", {}))
            files = dict(checked.get("files", {}))
            pci_gpus = list(checked.get("pci_gpus", []))
            node.initramfs_kernel = checked.get("initramfs_kernel", "")
            node.initramfs_has_blacklist = checked.get("initramfs_has_blacklist")
        else:
            node = self._read(inputs, full=True)
            if not args["error"]:
                nd.refuse_node(inputs, node)
            found = self._check_source(inputs, node)
            if not args["error"]:
                nd.check_key(inputs, found.key, found.key_error)
                nd.check_offer(inputs, found)
            source = nd.Source(key=found.key, offered=found.offered)
            files = node.files
            pci_gpus = self.module("kubegpu.node.nvidia_pci_gpus", {}).get("gpus", [])

        planned = nd.plan(
            inputs,
            node,
            source,
            files,
            pci_gpus,
            check_mode=check_mode,
            error=args["error"],
            # A full read reads the facts file itself; facts_now says what this run wrote since its full read.
            facts_now=args["facts_now"] if checked else None,
        )
        if not args["error"] and not checked:
            nd.refuse_secure_boot(node, planned.result["dkms"])
        out: dict[str, Any] = {"changed": False, **planned.result}
        # A full read asked to be handed over (the role's preflight entry point) is what the role's next run on the
        # host in this run starts from; that run's own plan is no full read, so the run after it checks everything.
        out["hand_over"] = bool(args["hand_over"]) and not checked
        if out["hand_over"]:
            # What site.yml's batch reads the node again with (kubegpu.node.chain_plan), as this role's next run would.
            out["replay"] = cp.replay(args)
        out["checked"] = {
            "key": source.key,
            "offered": source.offered,
            "files": files,
            "pci_gpus": pci_gpus,
            "initramfs_kernel": node.initramfs_kernel,
            "initramfs_has_blacklist": node.initramfs_has_blacklist,
        }
        # Said once per run: in the full read (the preflight), not again in each later plan.
        if planned.warnings and not checked:
            out["warnings"] = planned.warnings
        return out
