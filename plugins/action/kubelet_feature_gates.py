# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The action kubegpu.node.kubelet_feature_gates: reads where the node's kubelet takes its feature gates from and plans,
# on the controller, the files to change for its version. It changes nothing on the node: the role writes the files
# with kubegpu.node.service_config. Documentation: plugins/modules/kubelet_feature_gates.py.

from __future__ import annotations

from typing import Any

from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_embedded as ke
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_gates as kg
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_settings as ks
from ansible_collections.kubegpu.node.plugins.plugin_utils._node_action import NodeAction, NodeError

ARGUMENT_SPEC: dict[str, Any] = {
    "device_plugins": {"type": "bool", "default": True},
    "cdi_devices": {"type": "bool", "default": False},
    "feature_gates": {"type": "dict", "default": {}},
    "gate_table": {"type": "dict", "default": {}},
    "service": {"type": "str", "default": "kubelet.service"},
    "binary": {"type": "str", "default": "kubelet"},
    "default_env_file": {"type": "path", "default": "/etc/default/kubelet"},
    "provisioners": {
        "type": "list",
        "elements": "dict",
        "default": [],
        "options": {
            "name": {"type": "str", "required": True},
            "marker": {"type": "path", "required": True},
            "setting": {"type": "str", "required": True},
        },
    },
    "allow_provisioned_edit": {"type": "bool", "default": False},
    "embedded": {
        "type": "list",
        "elements": "dict",
        "default": [],
        "options": {
            "name": {"type": "str", "required": True},
            "units": {"type": "list", "elements": "str", "required": True},
            "binary": {"type": "str", "required": True},
            "config_file": {"type": "path", "required": True},
            "kubelet_dropin_dir": {"type": "path"},
            "kubelet_dropin_since": {"type": "str"},
        },
    },
}

# --config-dir drop-ins exist from kubelet 1.28 (alpha behind KUBELET_CONFIG_DROPIN_DIR_ALPHA; beta 1.30).
CONFIG_DIR_SINCE = (1, 28)


class ActionModule(NodeAction):
    # The run() frame is NodeAction's: argument validation, these failures into failed + msg, cleanup.
    argument_spec = ARGUMENT_SPEC
    failures = (ks.PlanError, kg.GateTableError, NodeError)

    def _text(self, path: str) -> str | None:
        data = self.read_bytes(path)
        if data is None:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ks.PlanError(f"{path} is not UTF-8 text; it was left untouched") from None

    def _run(self, args: dict[str, Any]) -> dict[str, Any]:
        user = {}
        for name, value in args["feature_gates"].items():
            if not isinstance(value, bool):
                raise ks.PlanError(f"kubelet_feature_gates: {name} must be true or false, not {value!r}")
            user[str(name)] = value
        table = kg.build_table(args["gate_table"])
        managed = {}
        if args["device_plugins"]:
            managed["DevicePlugins"] = True
        if args["cdi_devices"]:
            managed["DevicePluginCDIDevices"] = True

        for distribution in args["embedded"]:
            unit = self._running_unit(distribution["units"])
            if unit:
                planned, config = self._plan_embedded(distribution, unit, table, managed, user)
                out = self._finish(args, planned, service=unit)
                out.update(distribution=distribution["name"], config_file=config)
                return out

        said = self.command([args["binary"], "--version"])
        if said["rc"] != 0:
            raise ks.PlanError(
                f"`{args['binary']} --version` failed (rc {said['rc']}): "
                f"{(said['stderr'] or said['stdout']).strip()}. Install the kubelet first; nothing was changed"
            )
        version = ks.kubelet_version(said["stdout"] or said["stderr"])

        shown = self.command(
            ["systemctl", "show", args["service"], "--property=ExecStart,Environment,EnvironmentFiles"]
        )
        if shown["rc"] != 0:
            raise ks.PlanError(f"systemctl show {args['service']} failed: {shown['stderr'].strip()}")
        unit = ks.parse_unit(shown["stdout"])
        env_texts = {path: self._text(path) for path in dict.fromkeys(unit.env_files)}
        if args["default_env_file"] not in env_texts:
            env_texts[args["default_env_file"]] = self._text(args["default_env_file"])
        sources = ks.resolve_sources(unit, env_texts)
        config_text = self._text(sources.config_path) if sources.config_path else None
        dropin_texts: dict[str, str] = {}
        if sources.config_dir and version >= CONFIG_DIR_SINCE:
            found = self.module(
                "ansible.legacy.find", {"paths": [sources.config_dir], "patterns": ["*.conf"], "file_type": "file"}
            )
            for entry in found.get("files", []):
                text = self._text(entry["path"])
                if text is not None:
                    dropin_texts[entry["path"]] = text

        planned = ks.plan(
            version=version,
            table=table,
            managed=managed,
            user=user,
            unit=unit,
            env_texts=env_texts,
            config_text=config_text,
            dropin_texts=dropin_texts,
            default_env_file=args["default_env_file"],
        )

        out = self._finish(args, planned)
        out.update(config_file=sources.config_path, config_dir=sources.config_dir)
        return out

    def _finish(self, args: dict[str, Any], planned: ks.Plan, service: str | None = None) -> dict[str, Any]:
        provisioner = None
        for entry in args["provisioners"]:
            if self.stat(entry["marker"]).get("exists"):
                provisioner = entry
                break
        if provisioner and planned.files and not args["allow_provisioned_edit"]:
            raise ks.PlanError(ks.provisioner_message(provisioner["name"], provisioner["setting"], planned))
        out: dict[str, Any] = {
            "changed": False,
            "version": planned.version,
            "files": planned.files,
            "before": planned.before,
            "after": planned.after,
            "removed": planned.removed,
            "service": service or args["service"],
            "distribution": None,
            "config_file": None,
            "config_dir": None,
            "provisioner": provisioner["name"] if provisioner else None,
        }
        if planned.warnings:
            out["warnings"] = planned.warnings
        return out

    # -----------------------------------------------------------------------------------------------------------------
    # k3s and rke2: the kubelet runs inside their process and takes its flags from kubelet-arg in their config files
    # -----------------------------------------------------------------------------------------------------------------

    def _running_unit(self, units: list[str]) -> str | None:
        """The first of `units` that is installed and enabled or running (a k3s/rke2 node runs one of them)."""
        for unit in units:
            shown = self.command(["systemctl", "show", unit, "--property=LoadState,UnitFileState,ActiveState"])
            if shown["rc"] != 0:
                continue
            if ke.unit_in_use(shown["stdout"]):
                return unit
        return None

    def _find(self, folder: str, pattern: str) -> list[str]:
        found = self.module("ansible.legacy.find", {"paths": [folder], "patterns": [pattern], "file_type": "file"})
        return sorted(entry["path"] for entry in found.get("files", []))

    def _plan_embedded(
        self,
        distribution: dict[str, Any],
        unit: str,
        table: dict[str, list[kg.Stage]],
        managed: dict[str, bool],
        user: dict[str, bool],
    ) -> tuple[ks.Plan, str]:
        name = distribution["name"]
        said = self.command([distribution["binary"], "--version"])
        if said["rc"] != 0:
            raise ks.PlanError(
                f"{unit} is installed but `{distribution['binary']} --version` failed (rc {said['rc']}): "
                f"{(said['stderr'] or said['stdout']).strip()}; nothing was changed"
            )
        version = ke.embedded_version(said["stdout"] or said["stderr"], name)
        shown = self.command(["systemctl", "show", unit, "--property=ExecStart,Environment,EnvironmentFiles"])
        parsed = ks.parse_unit(shown["stdout"]) if shown["rc"] == 0 else ks.Unit([], {}, [])
        config, cli_args = ke.unit_overrides(parsed.argv, parsed.environment, name, distribution["config_file"])
        files = [config, *self._find(config + ".d", "*.yaml")]
        dropins: list[str] = []
        since = distribution.get("kubelet_dropin_since")
        if distribution.get("kubelet_dropin_dir") and since and version >= kg.parse_minor(since):
            dropins = self._find(distribution["kubelet_dropin_dir"], "*.conf")
        texts = {path: self._text(path) for path in files + dropins}
        planned = ke.plan(
            name=name,
            version=version,
            table=table,
            managed=managed,
            user=user,
            layout=ke.Layout(config_files=files, kubelet_dropins=dropins),
            texts=texts,
        )
        if cli_args and planned.files:
            raise ks.PlanError(
                f"{unit} passes --kubelet-arg on its command line, which replaces the kubelet-arg list of {config}; "
                f"move those arguments into {config} (or a drop-in in {config}.d) and run again. Nothing was changed"
            )
        return planned, config
