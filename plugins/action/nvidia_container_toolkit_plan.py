# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The action kubegpu.node.nvidia_container_toolkit_plan: reads the node in one command (with the repository's key,
# fetched by apt's own downloader) and, when the source or the packages must change, checks the repository with
# _apt's source check; plans on the controller what the role kubegpu.node.nvidia_container_toolkit does. It changes
# nothing. Documentation: plugins/modules/nvidia_container_toolkit_plan.py.

from __future__ import annotations

from typing import Any

from ansible_collections.kubegpu.node.plugins.plugin_utils import _apt
from ansible_collections.kubegpu.node.plugins.plugin_utils import _chain_plan as cp
from ansible_collections.kubegpu.node.plugins.plugin_utils import _nvidia_container_toolkit as tk
from ansible_collections.kubegpu.node.plugins.plugin_utils._node_action import NodeAction, NodeError, command_error

ARGUMENT_SPEC: dict[str, Any] = {
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "version": {"type": "str", "default": "1.18.2-1"},
    "allow_downgrade": {"type": "bool", "default": False},
    "channel": {"type": "str", "choices": ["stable", "experimental"], "default": "stable"},
    "repo_url": {"type": "str", "default": "https://nvidia.github.io/libnvidia-container"},
    "repo_key_url": {"type": "str", "default": "https://nvidia.github.io/libnvidia-container/gpgkey"},
    "repo_key_fingerprints": {
        "type": "list",
        "elements": "str",
        "default": ["C95B321B61E88C1809C4F759DDCAE044F796ECB0"],
    },
    "hold": {"type": "bool", "default": True},
    "cdi": {"type": "bool", "default": False},
    "cdi_spec": {"type": "path", "default": "/etc/cdi/nvidia.yaml"},
    "runtime_config": {"type": "dict", "default": {}},
    "dev_char_symlinks": {"type": "bool", "default": True},
    "keyring": {"type": "path", "default": "/etc/apt/keyrings/nvidia-container-toolkit.asc"},
    "source": {"type": "path", "default": "/etc/apt/sources.list.d/nvidia-container-toolkit.sources"},
    "checked": {"type": "dict"},
    "links_only": {"type": "bool", "default": False},
    "reread_files": {"type": "bool", "default": False},
    "hand_over": {"type": "bool", "default": False},
}


class ActionModule(NodeAction):
    # Reads only through commands: no remote temporary folder is made (three round trips saved).

    argument_spec = ARGUMENT_SPEC
    failures = (tk.Refusal, NodeError, ValueError)

    def failure_message(self, exc: Exception) -> str:
        return self.host_failure_message(exc)

    def _run(self, args: dict[str, Any]) -> dict[str, Any]:
        facts = self._vars.get("ansible_facts", {})
        inputs = tk.Inputs(
            state=args["state"],
            version=str(args["version"]),
            allow_downgrade=args["allow_downgrade"],
            channel=args["channel"],
            repo_url=args["repo_url"],
            repo_key_url=args["repo_key_url"],
            repo_key_fingerprints=tuple(_apt.normalise_fingerprint(f) for f in args["repo_key_fingerprints"]),
            hold=args["hold"],
            cdi=args["cdi"],
            cdi_spec=args["cdi_spec"],
            runtime_config=args["runtime_config"] or {},
            dev_char_symlinks=args["dev_char_symlinks"],
            keyring=args["keyring"],
            source=args["source"],
            architecture=str(facts.get("architecture", "")),
            os_family=str(facts.get("os_family", "")),
            distribution=str(facts.get("distribution", "")),
        )
        if args["links_only"]:
            said = self.command(tk.links_argv())
            if said["rc"] != 0:
                raise NodeError(f"reading the device nodes failed (rc {said['rc']}): {command_error(said)}")
            return {"changed": False, "unlinked": tk.parse_read(said["stdout"]).unlinked}
        tk.check_platform(inputs)
        checked = args["checked"]
        full = not checked and inputs.state == "present"
        tk.check_inputs(inputs)
        # The role's files are read once per run (the full read), unless apt changed the packages since.
        own_files = not checked or args["reread_files"]
        said = self.command(
            tk.read_argv(inputs, full=full, key_url=inputs.repo_key_url if full else "", own_files=own_files)
        )
        if said["rc"] != 0:
            raise NodeError(f"reading the node failed (rc {said['rc']}): {command_error(said)}")
        node = tk.parse_read(said["stdout"])
        if inputs.state == "absent":
            return {"changed": False, **tk.plan(inputs, node, None, {}, True)}
        if checked:
            key = checked.get("key")
            files = dict(checked.get("files", {}))
            probed = bool(checked.get("probed"))
            if not own_files:
                node.files.update(checked.get("own_files", {}))
                node.modes.update(checked.get("own_modes", {}))
        else:
            tk.check_key(inputs, node.source.key, node.source.key_error)
            key = node.source.key
            files = {path: node.files.get(path) for path in (inputs.keyring, inputs.source)}
            probed = False
        planned = tk.plan(inputs, node, key, files, probed)
        if planned["packages"]["problem"]:
            raise tk.Refusal(f"{planned['packages']['problem']}. {tk.NOTHING_CHANGED}")
        if planned["probe_needed"]:
            # apt itself reads the repository in a throwaway state, with the key just checked: its signature, every
            # failure an error, and the versions it offers.
            said = self.command(
                _apt.source_check_argv(tk.PACKAGES, source=inputs.source_text(_apt.KEYRING_PLACEHOLDER), key=key or "")
            )
            if said["rc"] != 0:
                raise NodeError(f"checking the repository failed (rc {said['rc']}): {command_error(said)}")
            tk.check_offer(inputs, _apt.parse_source_check(said["stdout"]))
            probed = True
        if planned["runtime_config"]["problem"]:
            raise tk.Refusal(
                f"{tk.RUNTIME_CONFIG_FILE} cannot be changed: {planned['runtime_config']['problem']}. It was left as "
                "it is; correct it (nvidia-ctk config --config-file=FILE prints a valid one) and run again."
            )
        owned = (tk.RUNTIME_CONFIG_FILE, tk.UDEV_RULE_FILE)
        handed_over = bool(args["hand_over"]) and not checked
        return {
            "changed": False,
            # What site.yml's batch reads the node again with (kubegpu.node.chain_plan), as this role's next run would.
            **({"replay": cp.replay(args)} if handed_over else {}),
            **planned,
            # What the role's next run on the host in this run starts from (see nvidia_driver_plan).
            "hand_over": handed_over,
            "checked": {
                "key": key,
                "files": files,
                "probed": probed,
                "own_files": {path: node.files.get(path) for path in owned},
                "own_modes": {path: node.modes[path] for path in owned if path in node.modes},
            },
        }
