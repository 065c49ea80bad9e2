# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The action kubegpu.node.kubelet_feature_gates: reads where the node's kubelet takes its feature gates from and plans,
# on the controller, the files to change for its version. It changes nothing on the node: the role writes the files
# with kubegpu.node.service_config. Documentation: plugins/modules/kubelet_feature_gates.py.

from __future__ import annotations

import base64
import time
from typing import Any

from ansible.module_utils.common.text.converters import to_text
from ansible_collections.kubegpu.node.plugins.plugin_utils import _chain_plan as cp
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_embedded as ke
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_gates as kg
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_settings as ks
from ansible_collections.kubegpu.node.plugins.plugin_utils import _service_config as sc
from ansible_collections.kubegpu.node.plugins.plugin_utils import _systemd_syntax as sd
from ansible_collections.kubegpu.node.plugins.plugin_utils._node_action import NodeAction, NodeError, command_error

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
    "healthz_url": {"type": "str", "default": ""},
    "check_health": {"type": "bool", "default": True},
    # What else site.yml's batch needs to read the kubelet again as the role would (kubegpu.node.chain_plan): the
    # role's restart, backup_dir and pending_dir. Returned with the action's own arguments when given.
    "replay": {"type": "dict", "default": {}},
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
# A kubelet that systemd says is starting (or running) but that does not answer yet is asked again for this long.
HEALTH_TRIES = 15
HEALTH_DELAY = 2.0
# Reads files (r:PATH, printed in base64 on one line; "-" when missing, "?" when not a regular file), tests paths
# (e:PATH: "1" or "-") and lists folders (l:FOLDER/PATTERN: the regular files, links to one included, whose names
# match the shell pattern, hidden ones left out, in base64 on one line; "-" when the folder is missing) in one command:
# POSIX sh and coreutils' base64, nothing else on the node.
READ_SCRIPT = (
    'for a; do p=${a#??}; case $a in e:*) if [ -e "$p" ] || [ -L "$p" ]; then echo 1; else echo -; fi;; '
    'l:*) d=${p%/*}; if [ -d "$d" ]; then for f in "$d"/${p##*/}; do [ -f "$f" ] && printf "%s\\n" "$f"; done '
    '| base64 | tr -d "\\n"; echo; else echo -; fi;; '
    '*) if [ -f "$p" ]; then c=$(base64 < "$p") || exit 3; printf %s "$c" | tr -d "\\n"; echo; '
    "elif [ -e \"$p\" ]; then echo '?'; else echo -; fi;; esac; done"
)


class ActionModule(NodeAction):
    # The run() frame is NodeAction's: argument validation, these failures into failed + msg, cleanup.
    argument_spec = ARGUMENT_SPEC
    failures = (ks.PlanError, kg.GateTableError, NodeError)

    def _texts(self, paths: list[str]) -> dict[str, str | None]:
        """Several files read in one command (None: it does not exist)."""
        return self._reads(paths, [])[0]

    def _node_read(self, requests: list[str]) -> list[bytes | None]:
        """`r:PATH` (its bytes; None when missing), `e:PATH` (b"" when it exists; None when not) and `l:FOLDER/PATTERN`
        (the matching files' paths, one a line; None when the folder is missing), in one command."""
        outcome = self.command(self._read_argv(requests))
        lines = outcome["stdout"].splitlines()
        if outcome["rc"] != 0 or len(lines) < len(requests):
            raise NodeError(
                f"reading {', '.join(r[2:] for r in requests)} failed (rc {outcome['rc']}): {command_error(outcome)}"
            )
        found: list[bytes | None] = []
        for request, line in zip(requests, lines):
            if line == "-":
                found.append(None)
            elif line == "?":
                raise ks.PlanError(f"{request[2:]} is not a regular file; it was left untouched")
            elif request.startswith("e:"):
                found.append(b"")
            else:
                found.append(base64.b64decode(line))
        return found

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

        # Every read the plan may start with, in one round trip: which k3s/rke2 units are in use, each binary's
        # version, what systemd says of each unit, and the provisioners' markers.
        embedded_units = [unit for distribution in args["embedded"] for unit in distribution["units"]]
        markers = [entry["marker"] for entry in args["provisioners"]]
        self.prefetch(
            [
                *([self._units_argv(embedded_units)] if embedded_units else []),
                *[[distribution["binary"], "--version"] for distribution in args["embedded"]],
                *[self._show_argv(unit) for unit in embedded_units],
                [args["binary"], "--version"],
                self._show_argv(args["service"]),
                *([self._read_argv([f"e:{marker}" for marker in markers])] if markers else []),
            ]
        )
        in_use = self._units_in_use(embedded_units)
        for distribution in args["embedded"]:
            unit = next((unit for unit in distribution["units"] if unit in in_use), None)
            if unit:
                planned, config = self._plan_embedded(distribution, unit, table, managed, user, args["healthz_url"])
                out = self._finish(args, planned, service=unit)
                out.update(distribution=distribution["name"], config_file=config)
                return out

        said = self.command([args["binary"], "--version"])
        if said["rc"] != 0:
            raise ks.PlanError(
                f"`{args['binary']} --version` failed (rc {said['rc']}): "
                f"{command_error(said)}. Install the kubelet first; nothing was changed"
            )
        version = ks.kubelet_version(said["stdout"] or said["stderr"])
        unit, texts = self._read_unit(args["service"], [args["default_env_file"]])
        resolved = ks.resolve(unit, texts)
        config_path = ks.last_flag(resolved.values(), "--config")
        config_dir = ks.last_flag(resolved.values(), "--config-dir")
        # The config file and the drop-in folder's listing in one command, then the drop-ins (when there are any).
        listed_dir = config_dir if config_dir and version >= CONFIG_DIR_SINCE else None
        read, lists = self._reads([config_path] if config_path else [], [f"{listed_dir}/*.conf"] if listed_dir else [])
        config_text = read.get(config_path) if config_path else None
        dropins = lists[0] if listed_dir else []
        found = self._texts(dropins)
        dropin_texts = {path: text for path, text in found.items() if text is not None}

        planned = ks.plan(
            version=version,
            table=table,
            managed=managed,
            user=user,
            unit=unit,
            texts=texts,
            config_text=config_text,
            dropin_texts=dropin_texts,
            default_env_file=args["default_env_file"],
            healthz_override=args["healthz_url"],
        )

        out = self._finish(args, planned)
        out.update(config_file=config_path, config_dir=config_dir)
        return out

    @staticmethod
    def _show_argv(service: str) -> list[str]:
        properties = ",".join(ks.SHOW_PROPERTIES)
        return ["sh", "-c", 'systemctl show "$1" --property="$2" && systemctl --version', "-", service, properties]

    @staticmethod
    def _units_argv(units: list[str]) -> list[str]:
        return ["systemctl", "show", *units, "--property=Id,LoadState,UnitFileState,ActiveState"]

    @staticmethod
    def _read_argv(requests: list[str]) -> list[str]:
        return ["sh", "-c", READ_SCRIPT, "-", *requests]

    def _reads(self, paths: list[str], patterns: list[str]) -> tuple[dict[str, str | None], list[list[str]]]:
        """Files' texts (None: missing) and the files that folder patterns (FOLDER/PATTERN) match, in one command."""
        paths = list(dict.fromkeys(p for p in paths if p))
        if not paths and not patterns:
            return {}, []
        found = self._node_read([f"r:{path}" for path in paths] + [f"l:{pattern}" for pattern in patterns])
        texts = {path: self._decode(path, data) for path, data in zip(paths, found)}
        listed = [sorted((data or b"").decode("utf-8", "surrogateescape").splitlines()) for data in found[len(paths) :]]
        return texts, listed

    @staticmethod
    def _decode(path: str, data: bytes | None) -> str | None:
        if data is None:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ks.PlanError(f"{path} is not UTF-8 text; it was left untouched") from None

    def _read_unit(self, service: str, more: list[str]) -> tuple[ks.UnitFiles, dict[str, str | None]]:
        """What systemd says of the unit, and the text of its files, its environment files and `more`."""
        shown = self.command(self._show_argv(service))
        if shown["rc"] != 0:
            raise ks.PlanError(f"systemctl show {service} failed: {command_error(shown)}")
        unit = ks.parse_show(shown["stdout"], service)
        texts = self._texts([*unit.files, *[path for path, _optional in unit.env_files], *more])
        return unit, texts

    def _health(self, service: str, planned: ks.Plan) -> dict[str, Any]:
        """Whether the kubelet answers now (its healthz endpoint, or systemd's word when it has none); when it does
        not, systemd's state and its own last error. A kubelet that systemd says is starting gets some time."""
        url = planned.healthz_url
        said = ""
        state: dict[str, str] = {}
        for attempt in range(HEALTH_TRIES):
            if attempt:
                time.sleep(HEALTH_DELAY)
            if url:
                said = self._get(url)
                if not said:
                    return {"ok": True, "url": url}
            shown = self.command(["systemctl", "show", service, f"--property={','.join(ks.HEALTH_SHOW_PROPERTIES)}"])
            state = sd.show_properties(shown["stdout"])
            if not url:
                if state.get("ActiveState") == "active":
                    return {"ok": True, "url": None}
                said = "its health endpoint is turned off (healthzPort 0)"
            if ks.is_down(state):
                break
        pid = state.get("ExecMainPID", "0")
        journal = ["journalctl", f"_SYSTEMD_UNIT={service}", "--output=cat", "--no-pager", "--lines=200"]
        if pid.isdigit() and pid != "0":
            journal.append(f"_PID={pid}")
        lines = self.command(journal)
        error = sc.daemon_error(lines["stdout"]) if lines["rc"] == 0 else None
        return {
            "ok": False,
            "url": url,
            "state": state,
            "error": error,
            "message": ks.unhealthy_message(service, url, said, state, error, planned),
        }

    def _finish(self, args: dict[str, Any], planned: ks.Plan, service: str | None = None) -> dict[str, Any]:
        provisioner = None
        markers = [entry["marker"] for entry in args["provisioners"]]
        exists = self._node_read([f"e:{marker}" for marker in markers]) if markers else []
        for entry, found in zip(args["provisioners"], exists):
            if found is not None:
                provisioner = entry
                break
        if provisioner and planned.files and not args["allow_provisioned_edit"]:
            raise ks.PlanError(ks.provisioner_message(provisioner["name"], provisioner["setting"], planned))
        unit = service or args["service"]
        out: dict[str, Any] = {
            "changed": False,
            "version": planned.version,
            "files": planned.files,
            "before": planned.before,
            "after": planned.after,
            "removed": planned.removed,
            "service": unit,
            "distribution": None,
            "config_file": None,
            "config_dir": None,
            "provisioner": provisioner["name"] if provisioner else None,
            "daemon_reload": planned.daemon_reload,
            "healthz_url": planned.healthz_url,
            "verify": {"url": planned.healthz_url} if planned.healthz_url else {},
            "argv": planned.argv,
            "health": self._health(unit, planned) if args["check_health"] else {"ok": True, "url": None},
        }
        if planned.warnings:
            out["warnings"] = planned.warnings
        if args.get("replay"):
            out["replay"] = cp.replay(args, **args["replay"])
        return out

    def _get(self, url: str) -> str:
        """GET `url` on the node; '' when it answers 200, else what went wrong. A read, so it runs in check mode too
        (the uri module itself skips check mode)."""
        check_mode = self._task.check_mode
        self._task.check_mode = False
        try:
            outcome = self._execute_module(
                module_name="ansible.legacy.uri",
                module_args={"url": url, "status_code": [200], "timeout": 5, "return_content": False},
                task_vars=self._vars,
            )
        finally:
            self._task.check_mode = check_mode
        if not outcome.get("failed"):
            return ""
        return to_text(outcome.get("msg", "")).strip() or "no answer"

    # -----------------------------------------------------------------------------------------------------------------
    # k3s and rke2: the kubelet runs inside their process and takes its flags from kubelet-arg in their config files
    # -----------------------------------------------------------------------------------------------------------------

    def _units_in_use(self, units: list[str]) -> set[str]:
        """Which of `units` are installed and enabled or running (a k3s/rke2 node runs one of them), in one command."""
        if not units:
            return set()
        shown = self.command(self._units_argv(units))
        return set(ke.units_in_use(shown["stdout"])) if shown["rc"] == 0 else set()

    def _plan_embedded(
        self,
        distribution: dict[str, Any],
        unit: str,
        table: dict[str, list[kg.Stage]],
        managed: dict[str, bool],
        user: dict[str, bool],
        healthz_url: str,
    ) -> tuple[ks.Plan, str]:
        name = distribution["name"]
        said = self.command([distribution["binary"], "--version"])
        if said["rc"] != 0:
            raise ks.PlanError(
                f"{unit} is installed but `{distribution['binary']} --version` failed (rc {said['rc']}): "
                f"{command_error(said)}; nothing was changed"
            )
        version = ke.embedded_version(said["stdout"] or said["stderr"], name)
        unit_files, unit_texts = self._read_unit(unit, [])
        resolved = ks.resolve(unit_files, unit_texts)
        environment = {name: found.value.value for name, found in resolved.defs.items()}
        config, cli_args = ke.unit_overrides(resolved.values(), environment, name, distribution["config_file"])
        since = distribution.get("kubelet_dropin_since")
        read_dropins = bool(distribution.get("kubelet_dropin_dir") and since and version >= kg.parse_minor(since))
        # The config file with the two folders' listings in one command; then the files found there, if any.
        patterns = [f"{config}.d/*.yaml", *([f"{distribution['kubelet_dropin_dir']}/*.conf"] if read_dropins else [])]
        texts, listed = self._reads([config], patterns)
        files = [config, *listed[0]]
        dropins = listed[1] if read_dropins else []
        texts.update(self._texts(files[1:] + dropins))
        planned = ke.plan(
            name=name,
            version=version,
            table=table,
            managed=managed,
            user=user,
            layout=ke.Layout(config_files=files, kubelet_dropins=dropins),
            texts=texts,
            healthz_override=healthz_url,
        )
        if cli_args and planned.files:
            raise ks.PlanError(
                f"{unit} passes --kubelet-arg on its command line, which replaces the kubelet-arg list of {config}; "
                f"move those arguments into {config} (or a drop-in in {config}.d) and run again. Nothing was changed"
            )
        return planned, config
