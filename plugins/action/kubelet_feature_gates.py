# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The action kubegpu.node.kubelet_feature_gates: reads where the node's kubelet takes its feature gates from and plans,
# on the controller, the files to change for its version. It changes nothing on the node: the role writes the files
# with kubegpu.node.service_config. Documentation: plugins/modules/kubelet_feature_gates.py.

from __future__ import annotations

from typing import Any

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
}

# --config-dir drop-ins exist from kubelet 1.28 (alpha behind KUBELET_CONFIG_DROPIN_DIR_ALPHA; beta 1.30).
CONFIG_DIR_SINCE = (1, 28)


class ActionModule(NodeAction):
    def run(self, tmp: str | None = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        del tmp
        self._vars = task_vars or {}
        _validation, args = self.validate_argument_spec(ARGUMENT_SPEC)
        try:
            result.update(self._run(args))
        except (ks.PlanError, kg.GateTableError, NodeError) as exc:
            result.update(failed=True, msg=str(exc))
        finally:
            self.cleanup()
        return result

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

        managed = {}
        if args["device_plugins"]:
            managed["DevicePlugins"] = True
        if args["cdi_devices"]:
            managed["DevicePluginCDIDevices"] = True
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
            "config_file": sources.config_path,
            "config_dir": sources.config_dir if dropin_texts or sources.config_dir else None,
            "provisioner": provisioner["name"] if provisioner else None,
        }
        if planned.warnings:
            out["warnings"] = planned.warnings
        return out
