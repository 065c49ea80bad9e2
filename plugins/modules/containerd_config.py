#!/usr/bin/python
# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only: kubegpu.node.containerd_config is an action plugin (plugins/action/containerd_config.py) that
# plans on the controller and reads the node with sh commands and `containerd config dump`.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: containerd_config
short_description: Plan and validate containerd's configuration for the NVIDIA runtime
version_added: 0.1.0
description:
  - Works out the files that register C(nvidia-container-runtime) with containerd as a runtime named C(nvidia),
    checks them with the host's own C(containerd config dump), and returns them. It writes nothing containerd reads;
    the role C(kubegpu.node.container_runtime) writes the files it returns with M(kubegpu.node.service_config), which
    brings check mode, diff mode, backups and the rollback after a failed restart.
  - It is an action plugin. The TOML is read, merged and written on the controller; on the node it runs only POSIX
    C(sh) commands with coreutils, so the node needs no more Python than ansible-core asks for (3.8 or later). One
    command reads the main file, the record, the drop-in and the C(.toml) files in the drop-in's folder (and
    C(containerd config default) when there is no main file); another runs C(containerd --config CANDIDATE config dump)
    on candidates sent inside the command into a temporary folder that the command removes. With nothing to change,
    the base and the drop-in already on disk are dumped together, so the task costs two commands on the node.
  - With O(state=present), the nvidia runtime goes into a drop-in file, and the main configuration's top-level
    C(imports) list is made to name it (the existing list is edited; a second C(imports) key is never written).
    Every other byte of the main file is kept. Without a main file, it starts from C(containerd config default).
  - Config version 2 (containerd 1.6/1.7, and 2.x reading an old file) and version 3 (containerd 2.x) are supported;
    the drop-in carries the main file's version and its plugin names. A file without C(version) (version 1) is refused
    with a message saying how to convert it.
  - containerd 1.x replaces a plugin's whole section with the last imported file that sets it, so there the drop-in
    also carries the CRI plugin settings in effect; containerd 2.x merges key by key and gets only the nvidia keys.
  - The candidate is loaded by containerd from a temporary folder; it must show the nvidia runtime, its
    C(BinaryName), C(SystemdCgroup) and the default runtime as asked, and no other setting may change.
  - With O(state=absent), returns the main file without the import this module added (according to O(record)),
    or no main file at all when the module wrote it from the defaults and nobody changed it since.
author:
  - kubegpu.node maintainers (@kubegpu)
requirements:
  - The C(containerd) binary on the target.
extends_documentation_fragment:
  - kubegpu.node.attributes
  - kubegpu.node.attributes.action
  - kubegpu.node.attributes.reads_only
attributes:
  check_mode:
    details: It changes nothing on the host, in check mode or not.
  diff_mode:
    details: The role shows the difference when it writes the returned files.
  idempotent:
    details: The same host and options give the same files.
options:
  path:
    description: containerd's main configuration file.
    type: path
    default: /etc/containerd/config.toml
  dropin:
    description:
      - The drop-in file that holds the nvidia runtime.
      - An import that already names it (also through a C(*) pattern) is used as it is.
    type: path
    default: /etc/containerd/conf.d/99-nvidia.toml
  record:
    description:
      - JSON file in which the role keeps what it added (the import, a main file written from the defaults).
      - Its current content is read; the module returns the new one in RV(record_content).
    type: path
    required: true
  state:
    description: Whether the nvidia runtime is to be configured or removed again.
    type: str
    choices: [present, absent]
    default: present
  runtime_name:
    description: Name of the runtime in containerd's configuration.
    type: str
    default: nvidia
  runtime_path:
    description: Absolute path of C(nvidia-container-runtime), the runtime's C(BinaryName).
    type: path
    default: /usr/bin/nvidia-container-runtime
  systemd_cgroup:
    description:
      - C(SystemdCgroup) of the runtime. It must match the kubelet's cgroup driver.
      - When not set, the same as the host's C(runc) runtime (else its default runtime) in C(containerd config dump).
    type: bool
  set_as_default:
    description: Make the runtime containerd's default runtime (C(default_runtime_name)).
    type: bool
    default: false
  cdi:
    description:
      - Set C(enable_cdi) and C(cdi_spec_dirs). containerd 1.6 has no CDI support; asking for it there fails.
      - When false, the host's CDI settings are left as they are.
    type: bool
    default: false
  cdi_spec_dirs:
    description: Where CDI specifications are read from, when O(cdi) is true.
    type: list
    elements: path
    default: [/etc/cdi, /var/run/cdi]
  containerd_binary:
    description: The containerd binary (a name looked up in C(PATH), or a path) that is asked for its configuration.
    type: str
    default: containerd
"""

EXAMPLES = r"""
- name: Work out containerd's configuration for the nvidia runtime
  kubegpu.node.containerd_config:
    record: /var/lib/kubegpu/container_runtime/containerd.json
    set_as_default: true
  register: plan

- name: Write the drop-in and the main file it returned, restart containerd, roll back if it does not answer
  kubegpu.node.service_config:
    service: containerd
    files:
      - path: "{{ plan.dropin }}"
        content: "{{ plan.dropin_content }}"
        mode: "0600"
      - path: "{{ plan.main_path }}"
        content: "{{ plan.main_content }}"
    verify:
      command: [ctr, version]
"""

RETURN = r"""
service_files:
  description:
    - The three files (the record, the drop-in, the main file) as M(kubegpu.node.service_config) takes them, in the
      order that leaves a run cut between two of them undoable (present - the record, the drop-in, the main file;
      absent - the reverse). A file whose content is null is removed.
  returned: always
  type: list
  elements: dict
config_version:
  description: Version of the main configuration (2 or 3); the drop-in has the same.
  returned: when O(state=present)
  type: int
  sample: 2
main_path:
  description: The main configuration file.
  returned: always
  type: str
  sample: /etc/containerd/config.toml
main_before:
  description: The main file's current content; null when there is none.
  returned: always
  type: str
main_content:
  description: What the main file must contain; null when it must not exist.
  returned: always
  type: str
main_mode:
  description: The main file's current mode, or C(0644) when there is none.
  returned: always
  type: str
  sample: "0644"
import_added:
  description: Whether the import of the drop-in is (or will be) one that this module added.
  returned: always
  type: bool
dropin:
  description: The drop-in file.
  returned: always
  type: str
  sample: /etc/containerd/conf.d/99-nvidia.toml
dropin_before:
  description: The drop-in's current content; null when there is none.
  returned: always
  type: str
dropin_content:
  description: What the drop-in must contain; null when it must not exist.
  returned: always
  type: str
record_before:
  description: The record's current content; null when there is none.
  returned: always
  type: str
record_content:
  description: What the record must contain; null when it must not exist.
  returned: always
  type: str
systemd_cgroup:
  description: C(SystemdCgroup) of the runtime in the drop-in.
  returned: when O(state=present)
  type: bool
default_runtime_before:
  description: The default runtime in effect without this module's drop-in.
  returned: when O(state=present)
  type: str
  sample: runc
carries_cri_section:
  description: Whether the drop-in carries the CRI plugin settings in effect (containerd 1.x).
  returned: when O(state=present)
  type: bool
"""
