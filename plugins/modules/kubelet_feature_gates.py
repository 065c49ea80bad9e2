#!/usr/bin/python
# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only: kubegpu.node.kubelet_feature_gates is an action plugin (plugins/action/kubelet_feature_gates.py)
# that runs on the controller and reads the node through builtin modules.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kubelet_feature_gates
short_description: Plan the kubelet's feature gates for its version, wherever this node's kubelet reads them
version_added: 0.1.0
description:
  - Reads the kubelet's version (C(kubelet --version)) and where its systemd unit takes its settings from, as systemd
    and the kubelet read them. The unit file and its drop-ins (C(systemctl show) names them) are read with systemd's
    own rules (continued lines, comments, C(Environment=) words with their quoting and C escapes, C(%) specifiers, an
    empty assignment resetting the list); the environment files (C(EnvironmentFile=), optional ones with C(-)) with
    those of its environment-file parser (continued lines, single and double quotes, escapes, the last assignment
    winning); C(ExecStart=) is expanded as systemd expands it at start (C($NAME) split at whitespace with quotes
    removed, C(${NAME}) kept whole). So flags in kubeadm's C(/var/lib/kubelet/kubeadm-flags.env), C(KUBELET_EXTRA_ARGS)
    in C(/etc/default/kubelet) or C(/etc/sysconfig/kubelet), C(Environment=) lines of a drop-in (kubeadm 1.8 and
    1.9) or C(ExecStart=) itself are all found where they are written.
  - Reads the C(--config) file (YAML or JSON, such as kubeadm's C(/var/lib/kubelet/config.yaml) or EKS'
    C(/etc/kubernetes/kubelet/kubelet-config.json)) and the C(--config-dir) drop-ins from kubelet 1.28.
  - Decides, from a table of what each kubelet minor release knows (stage, default, lock, and the Kubernetes change
    that says so), which gates to write and which to take out. A gate the kubelet would refuse (unknown, removed, or
    locked to the other value) is never written; the gates this collection manages are written only where they are
    off by default, and taken out wherever they are redundant or would stop the kubelet at its next upgrade.
  - Flags override the config file, so every place that names a gate gets the same value. A gate that no file names
    yet goes into the config file, or into the flags when the kubelet has none.
  - Returns the new text of each file to change (for M(kubegpu.node.service_config)); it changes nothing itself.
    Each edit changes the gate list where it is written and keeps every other byte of the file (a JSON file is
    edited as JSON; YAML C(featureGates) in block or flow style keeps the file's comments). Before returning, the
    planned files are read back as systemd would read them; an edit that would give the kubelet anything else than
    the planned gates, or change any other argument or variable, fails the task instead.
  - A change to a unit file or drop-in returns RV(daemon_reload) true, as does a unit that changed on disk since
    systemd last read it.
  - Reads where the kubelet answers C(/healthz) (C(healthzPort) and C(healthzBindAddress) of its config file and
    drop-ins, C(--healthz-port) and C(--healthz-bind-address) flags over them) and whether it answers now
    (RV(health)); when it does not, its C(message) says what systemd says and the kubelet's own last error from
    its journal, and where a gate that error names is set.
  - Fails before any change for a gate the user asked for that this kubelet would refuse, and for a node whose
    kubelet settings a provisioner regenerates (kops nodeup, EKS nodeadm), saying what to change at the source.
  - On a k3s or rke2 node (one of the units of an O(embedded) entry installed and enabled or running), the kubelet
    runs inside that process; its version is read from C(k3s --version) or C(rke2 --version), and its gates from
    C(kubelet-arg) in C(config.yaml) and then C(config.yaml.d/*.yaml), merged as k3s does (the last file's key wins,
    C(kubelet-arg+) appends), plus the kubelet drop-ins of k3s 1.32 and later. The same table and rules decide; the
    files to change are those configuration files, and RV(service) is that unit.
  - Parses every format on the controller; the node needs only what ansible-core's builtin modules need.
author:
  - kubegpu.node maintainers (@kubegpu)
extends_documentation_fragment:
  - kubegpu.node.attributes
  - kubegpu.node.attributes.action
  - kubegpu.node.attributes.reads_only
attributes:
  diff_mode:
    details: The files are shown by M(kubegpu.node.service_config), which writes them.
  idempotent:
    details: Planning a second time against the files it planned returns no file.
options:
  device_plugins:
    description: Make sure the kubelet runs with device plugins (C(DevicePlugins)) on; written only in 1.8 and 1.9.
    type: bool
    default: true
  cdi_devices:
    description: Make sure C(DevicePluginCDIDevices) is on; written only in 1.28, where it is off by default.
    type: bool
    default: false
  feature_gates:
    description:
      - More gates, name to true or false, written as asked where this kubelet accepts them.
      - A gate this kubelet does not know, or one locked to the other value, fails the task before any change.
    type: dict
    default: {}
  gate_table:
    description:
      - Gates to add to (or replace in) the built-in table, name to a list of stages, each with C(since) (minor
        release such as V('1.30')), C(stage) (alpha, beta, ga, deprecated, removed), C(default), C(locked) and
        C(source).
    type: dict
    default: {}
  service:
    description: The kubelet's systemd unit.
    type: str
    default: kubelet.service
  binary:
    description: The kubelet binary asked for its version.
    type: str
    default: kubelet
  default_env_file:
    description:
      - The environment file that takes C(KUBELET_EXTRA_ARGS) when the kubelet has no config file and none of its
        files carries C(--feature-gates) yet (C(/etc/sysconfig/kubelet) on the RHEL family).
    type: path
    default: /etc/default/kubelet
  provisioners:
    description: Provisioners that regenerate the kubelet's settings, each known by a file on the node.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The provisioner, for the message.
        type: str
        required: true
      marker:
        description: A path whose existence means that the provisioner owns this node.
        type: path
        required: true
      setting:
        description: Where to change the feature gates at the source, for the message.
        type: str
        required: true
  allow_provisioned_edit:
    description: Plan the files of a provisioner-owned node anyway (a later provisioner run may undo it).
    type: bool
    default: false
  healthz_url:
    description:
      - The URL that answers 200 when the kubelet runs, instead of the one read from its configuration.
      - Empty reads it from the kubelet's own configuration (default C(http://127.0.0.1:10248/healthz)).
    type: str
    default: ""
  check_health:
    description: Ask the kubelet whether it answers now (RV(health)).
    type: bool
    default: true
  replay:
    description:
      - What else the playbook C(kubegpu.node.site) needs to read the kubelet again at the start of the host's batch
        (M(kubegpu.node.chain_plan)) - the role's C(restart), C(backup_dir) and C(pending_dir). Returned, with this
        plan's own arguments, as RV(replay).
    type: dict
    default: {}
  embedded:
    description:
      - Distributions whose kubelet runs inside their own process (the role passes k3s and rke2), checked in order
        before the kubelet unit.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The distribution (C(k3s), C(rke2)); also the prefix of its C(*_CONFIG_FILE) variable.
        type: str
        required: true
      units:
        description: Its systemd units (server and agent).
        type: list
        elements: str
        required: true
      binary:
        description: Its binary, asked for C(--version).
        type: str
        required: true
      config_file:
        description: Its configuration file; the drop-ins are C(<config_file>.d/*.yaml).
        type: path
        required: true
      kubelet_dropin_dir:
        description: The kubelet drop-in folder it passes to its kubelet (C(*.conf)), if any.
        type: path
      kubelet_dropin_since:
        description: The Kubernetes minor release from which that folder is read (V('1.32') for k3s).
        type: str
notes:
  - The gate table is in C(plugins/plugin_utils/_kubelet_gates.py), each entry with its source.
seealso:
  - module: kubegpu.node.service_config
"""

EXAMPLES = r"""
- name: Plan the kubelet's feature gates
  kubegpu.node.kubelet_feature_gates:
    device_plugins: true
    feature_gates:
      KubeletPodResourcesGet: true
    gate_table:
      KubeletPodResourcesGet:
        - {since: "1.27", stage: alpha, default: false, locked: false, source: "kubernetes v1.27.0 CHANGELOG"}
  register: gates

- name: Write them, restart the kubelet, roll back if it does not answer
  kubegpu.node.service_config:
    service: kubelet
    files: "{{ gates.files }}"
    daemon_reload: "{{ gates.daemon_reload }}"
    verify: "{{ gates.verify }}"
"""

RETURN = r"""
replay:
  description: O(replay) with this plan's own arguments (C(args)).
  returned: when O(replay) is given
  type: dict
version:
  description: The kubelet's minor release.
  returned: success
  type: str
  sample: "1.30"
files:
  description: The files to change, as M(kubegpu.node.service_config) takes them (C(path), C(content)); empty when
    the settings are already right.
  returned: success
  type: list
  elements: dict
before:
  description: The feature gates the kubelet runs with now (config file, then drop-ins, then flags).
  returned: success
  type: dict
after:
  description: The feature gates it runs with once the files are written.
  returned: success
  type: dict
removed:
  description: The gates taken out, each with the reason.
  returned: success
  type: dict
config_file:
  description: The kubelet's C(--config) file, if any (on k3s/rke2, their C(config.yaml)).
  returned: success
  type: str
config_dir:
  description: The kubelet's C(--config-dir), if any.
  returned: success
  type: str
service:
  description: The unit to restart for a change (the kubelet's, or the k3s/rke2 unit that runs it).
  returned: success
  type: str
  sample: k3s.service
distribution:
  description: C(k3s) or C(rke2) when the kubelet runs inside one of them; null otherwise.
  returned: success
  type: str
provisioner:
  description: The provisioner found to own this node, if any.
  returned: success
  type: str
daemon_reload:
  description: Whether systemd must read the unit's files again before the restart (a unit file or drop-in changes,
    or changed on disk since systemd read it).
  returned: success
  type: bool
healthz_url:
  description: Where the kubelet answers C(/healthz) (null when its config turns the endpoint off).
  returned: success
  type: str
  sample: http://127.0.0.1:10248/healthz
verify:
  description: How M(kubegpu.node.service_config) checks that the kubelet answers after a restart
    (O(kubegpu.node.service_config#module:verify)).
  returned: success
  type: dict
  sample: {url: "http://127.0.0.1:10248/healthz"}
argv:
  description: The kubelet's command line as systemd starts it (the unit's C(ExecStart=) expanded).
  returned: success
  type: list
  elements: str
health:
  description: Whether the kubelet answers now (C(ok)); when it does not, C(message) says why (systemd's state, the
    kubelet's last error, where a gate that error names is set).
  returned: success
  type: dict
  sample: {ok: true, url: "http://127.0.0.1:10248/healthz"}
"""
