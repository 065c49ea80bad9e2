# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The action kubegpu.node.gpu_mig: reads the node's GPUs and MIG state with nvidia-smi (one shell round trip), plans on
# the controller (plugin_utils/_mig.py) and acts with nvidia-smi's own MIG commands, then reads again to verify.
# Documentation: plugins/modules/gpu_mig.py.

from __future__ import annotations

from typing import Any

from ansible_collections.kubegpu.node.plugins.plugin_utils import _mig as mig
from ansible_collections.kubegpu.node.plugins.plugin_utils._node_action import NodeAction, NodeError, command_error

ARGUMENT_SPEC: dict[str, Any] = {
    "layout": {"type": "str", "required": True},
    "layouts": {"type": "dict", "default": {}},
    "apply": {"type": "bool", "default": True},
    "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
}

# One round trip: every read nvidia-smi answers, each headed by '@@kubegpu NAME RC', then the PCI bus (for a node
# whose driver is not loaded yet). $1 is nvidia-smi.
READ_SCRIPT = r"""
smi=$1
run() { name=$1; shift; out=$("$@" 2>&1); rc=$?; printf '@@kubegpu %s %s\n%s\n' "$name" "$rc" "$out"; }
run gpus "$smi" --query-gpu=index,uuid,name,pci.device_id,mig.mode.current,mig.mode.pending,memory.total \
  --format=csv,noheader,nounits
run apps "$smi" --query-compute-apps=gpu_uuid,pid,process_name --format=csv,noheader
run lgi "$smi" mig -lgi
run lci "$smi" mig -lci
run lgip "$smi" mig -lgip
printf '@@kubegpu pci 0\n'
for d in /sys/bus/pci/devices/*; do
  [ -r "$d/vendor" ] && printf '%s %s %s %s\n' "${d##*/}" "$(cat "$d/vendor")" "$(cat "$d/device")" "$(cat "$d/class")"
done
"""

# A reset or a reboot, nothing the commands can do: the driver could not reset the GPU to change its MIG mode.
RESET_HINT = (
    "reset the GPU once nothing holds it (stop nvidia-persistenced, DCGM, the device plugin; nvidia-smi --gpu-reset "
    "-i N), or reboot the node; a passthrough VM needs a reboot of the VM"
)


class ActionModule(NodeAction):
    argument_spec = ARGUMENT_SPEC
    failures = (mig.MigError, NodeError)

    def _read(self, nvidia_smi: str) -> dict[str, Any]:
        outcome = self.command(["sh", "-c", READ_SCRIPT, "kubegpu-mig-read", nvidia_smi])
        if outcome["rc"] != 0:
            raise NodeError(f"reading the MIG state failed: {command_error(outcome)}")
        return mig.read_state(outcome["stdout"])

    def _run_one(self, argv: list[str], nvidia_smi: str) -> tuple[int, str]:
        argv = [nvidia_smi, *argv[1:]]
        outcome = self._execute_module(
            module_name="ansible.legacy.command", module_args={"argv": argv}, task_vars=self._vars
        )
        text = " ".join(str(outcome.get(k) or "").strip() for k in ("stdout", "stderr", "msg")).strip()
        return (1 if outcome.get("failed") and not outcome.get("rc") else int(outcome.get("rc") or 0)), text

    def _run_commands(self, commands: list[list[str]], nvidia_smi: str, done: list[list[str]]) -> None:
        """Run planned commands; a GPU's instances are created trying other orders when the driver finds no room."""
        try:
            for argv in commands:
                if "-cgi" in argv:
                    index = int(argv[argv.index("-i") + 1])
                    profiles = argv[argv.index("-cgi") + 1].split(",")
                    done.extend(mig.create_instances(index, profiles, lambda a: self._run_one(a, nvidia_smi)))
                    continue
                rc, text = self._run_one(argv, nvidia_smi)
                done.append(argv)
                if rc != 0:
                    raise mig.MigError(f"{' '.join(argv)} failed: {text}")
        except mig.MigError as error:
            raise mig.MigError(
                f"{error}. Nothing was rolled back: the next run plans the layout again from what the GPUs have then"
            ) from None

    def _run(self, args: dict[str, Any]) -> dict[str, Any]:
        smi = args["nvidia_smi"]
        layout = args["layout"]
        state = self._read(smi)
        before = mig.plan(state, args["layouts"], layout)
        result: dict[str, Any] = {
            "changed": False,
            "layout": layout,
            "ready": before["ready"],
            "plan": before["gpus"],
            "wanted": before["devices"],
            "commands": [],
            "reset_required": before["reset_required"],
            "busy": before["busy"],
            "pending": False,
        }
        if self._task.diff and before["changed"]:
            result["diff"] = _diff(state, before)
        if not before["ready"]:
            # No driver answering yet (the driver step installed one and holds its reboot back): checked against the
            # table only; the layout is applied once nvidia-smi answers.
            result.update(pending=True, msg=f"nvidia-smi does not answer ({state['smi_error']}): MIG not read yet")
            if args["apply"]:
                raise mig.MigError(
                    f"cannot apply MIG layout {layout}: nvidia-smi does not answer ({state['smi_error']}); load the "
                    "NVIDIA driver first (reboot into it)"
                )
            return self._finish(result, state, args)
        if before["reset_required"] and args["apply"]:
            raise mig.MigError(_reset_message(before["reset_required"]))
        if not before["changed"]:
            result["pending"] = bool(before["reset_required"])
            return self._finish(result, state, args)
        if self._task.check_mode or not args["apply"] or before["busy"]:
            result["changed"] = bool(self._task.check_mode and args["apply"] and not before["busy"])
            result["pending"] = not result["changed"]
            if before["busy"]:
                result["msg"] = "MIG layout change held back: GPUs in use: " + "; ".join(
                    f"GPU {gpu}: {', '.join(processes)}" for gpu, processes in sorted(before["busy"].items())
                )
            return self._finish(result, state, args)
        result["changed"] = True
        # A mode change first, alone; the instances are planned again once the new mode is current.
        mode_commands = [c for g in before["gpus"] if g["mode_change"] for c in g["commands"]]
        if mode_commands:
            self._run_commands(mode_commands, smi, result["commands"])
            state = self._read(smi)
            after_mode = mig.plan(state, args["layouts"], layout)
            if after_mode["reset_required"]:
                raise mig.MigError(_reset_message(after_mode["reset_required"]))
            instance_commands = [c for g in after_mode["gpus"] for c in g["commands"]]
        else:
            instance_commands = [c for g in before["gpus"] for c in g["commands"]]
        self._run_commands(instance_commands, smi, result["commands"])
        state = self._read(smi)
        after = mig.plan(state, args["layouts"], layout)
        if after["changed"] or after["reset_required"]:
            left = [f"GPU {g['index']}: {g['action']}" for g in after["gpus"] if g["commands"] or g["reset_required"]]
            raise mig.MigError(f"MIG layout {layout} is not there after the commands ({', '.join(left)})")
        result["plan"] = after["gpus"]
        return self._finish(result, state, args)

    def _finish(self, result: dict[str, Any], state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
        """The node's MIG facts as they are now (what ansible_local.nvidia_mig holds for the labels)."""
        current = mig.current_devices(state)
        profiles: dict[str, Any] = {}
        for gpu in state.get("gpus") or []:
            for name, attributes in (gpu.get("profiles") or {}).items():
                if name in current["mig"]:
                    profiles.setdefault(name, {k: v for k, v in attributes.items() if k not in ("gpu", "free")})
        result["devices"] = current
        result["fact"] = {
            "layout": args["layout"],
            "pending": result["pending"],
            "mig_capable": any(g.get("mig_current") is not None for g in state.get("gpus") or []),
            "product": next((g.get("name") for g in state.get("gpus") or [] if g.get("name")), None),
            "devices": current,
            "wanted": result["wanted"],
            "profiles": profiles,
        }
        return result


def _reset_message(indexes: list[int]) -> str:
    gpus = ", ".join(str(i) for i in indexes)
    return f"GPU {gpus}: MIG mode is pending (the driver could not reset the GPU to change it): {RESET_HINT}"


def _describe(gpu: dict[str, Any], devices: dict[str, int] | None, enabled: bool | None) -> str:
    if gpu.get("mig_current") is None:
        return f"GPU {gpu['index']}: no MIG"
    if not enabled:
        return f"GPU {gpu['index']}: MIG disabled"
    shown = ", ".join(f"{count} x {name}" for name, count in sorted((devices or {}).items())) or "no instance"
    return f"GPU {gpu['index']}: MIG enabled, {shown}"


def _diff(state: dict[str, Any], plan: dict[str, Any]) -> dict[str, str]:
    by_index = {g["index"]: g for g in state.get("gpus") or []}
    before, after = [], []
    for item in plan["gpus"]:
        gpu = by_index[item["index"]]
        counts = {}
        for gi in gpu.get("instances") or []:
            counts[gi["profile"]] = counts.get(gi["profile"], 0) + 1
        before.append(_describe(gpu, counts, gpu.get("mig_current")))
        after.append(_describe(gpu, item["devices"], item["mig"]) if item["mig"] is not None else before[-1])
    return {
        "before_header": "MIG layout",
        "after_header": f"MIG layout {plan['layout']}",
        "before": "\n".join(before) + "\n",
        "after": "\n".join(after) + "\n",
    }
