#!/usr/bin/python
# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only: kubegpu.node.gpu_mig is an action plugin (plugins/action/gpu_mig.py) that plans on the
# controller and acts on the node with nvidia-smi.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_mig
short_description: Apply a MIG layout to a node's GPUs with nvidia-smi, planned on the controller
version_added: 0.1.0
description:
  - Reads the node's GPUs and their MIG state with C(nvidia-smi) (C(--query-gpu) for the model's PCI device ID and
    the current and pending MIG mode, C(mig -lgi), C(mig -lci), C(mig -lgip), and the compute processes), in one round
    trip.
  - Plans on the controller, from a layout file in the format of NVIDIA's MIG partition editor (C(nvidia-mig-parted),
    C(version) V(v1), named entries under C(mig-configs)) or a built-in layout name, and a table of the profiles each
    GPU model takes (NVIDIA's MIG User Guide).
  - Refuses, before any change, a layout a GPU cannot take (a profile the model does not have, more instances than
    it holds, instances whose memory slices would overlap, more than one media-extension instance, compute-instance
    profiles), a GPU matched by two different entries, and a MIG-capable GPU that is not in the table.
  - Acts with C(nvidia-smi)'s own commands, per GPU. A MIG mode change comes first (the GPU's instances destroyed, then
    C(nvidia-smi -i N -mig 1|0)); the node is read again and the instances are created with
    C(nvidia-smi mig -i N -cgi PROFILES -C) (each GPU instance with one compute instance over all of it), larger
    instances first. A GPU whose instances differ from the layout has them destroyed (C(-dci), C(-dgi)) and created
    again. Nothing is done where the layout is already there. Then the node is read again and the layout checked.
  - A MIG mode that stays pending (the driver could not reset the GPU, because a process holds it or the platform,
    such as a passthrough VM, allows no reset) fails the task and says what to do; only a GPU reset or a reboot makes
    it current.
  - A change is not applied while a compute process uses a GPU it changes (the task reports it as RV(pending) and
    names the processes), nor with O(apply=false). C(kubegpu.node.site) plans it in its batch and applies it inside
    the node's drain window.
  - Before the driver answers (no driver loaded yet), the layout is checked against the GPUs' PCI device IDs only and
    reported as RV(pending); with O(apply=true) the task then fails.
author:
  - kubegpu.node maintainers (@kubegpu)
extends_documentation_fragment:
  - kubegpu.node.attributes
  - kubegpu.node.attributes.action
attributes:
  check_mode:
    support: full
    details: Reads and plans only; reports the change it would make.
  diff_mode:
    support: full
    details: Shows each GPU's MIG mode and instances before and after.
  idempotent:
    support: full
    details: A second run with the same layout finds it there and runs no command.
options:
  layout:
    description:
      - The layout to apply, a name from O(layouts) or a built-in name.
      - "Built in: V(all-disabled) (MIG off), V(all-enabled) (MIG on, no instance), V(all-balanced) (NVIDIA's balanced
        layout of each model, such as 2 x 1g.10gb, 1 x 2g.20gb and 1 x 3g.40gb on an H100 80GB) and
        V(all-<profile>) (as many instances of that profile as each GPU holds, for example V(all-1g.10gb),
        V(all-3g.40gb), V(all-1g.10gb.me) for C(1g.10gb+me)). A built-in name a GPU model has no profile for is
        refused."
    type: str
    required: true
  layouts:
    description:
      - Named layouts in the format of NVIDIA's MIG partition editor, C(version) V(v1) and C(mig-configs), each a list
        of entries with C(devices) (V(all) or a list of GPU indexes), C(mig-enabled), C(mig-devices) (profile to
        count) and optionally C(device-filter) (PCI device IDs such as V(0x233010DE), to give each GPU model its own
        entry).
      - A name here overrides the built-in name. A GPU that no entry of the layout matches is left as it is; a GPU
        without MIG is skipped by an entry for V(all) devices, as C(nvidia-mig-parted) skips it.
    type: dict
    default: {}
  apply:
    description:
      - V(true) applies a change (unless a compute process uses a GPU it changes). V(false) only plans and reports
        it as RV(pending), as C(kubegpu.node.site) does outside a node's drain window.
    type: bool
    default: true
  nvidia_smi:
    description: The C(nvidia-smi) to run on the node.
    type: str
    default: nvidia-smi
notes:
  - MIG instances do not survive a reboot (MIG mode does); run the task again after a reboot, as
    C(kubegpu.node.site) does in its drain window.
  - "Sources: NVIDIA's MIG User Guide (supported GPUs and profiles, placements, the nvidia-smi commands and their
    output); NVIDIA/mig-parted (the layout format, the GPU models' PCI device IDs, the balanced layouts)."
seealso:
  - name: NVIDIA Multi-Instance GPU User Guide
    description: Profiles, placements and nvidia-smi's MIG commands.
    link: https://docs.nvidia.com/datacenter/tesla/mig-user-guide/
  - name: NVIDIA MIG partition editor
    description: The layout format this module reads.
    link: https://github.com/NVIDIA/mig-parted
"""

EXAMPLES = r"""
- name: Every A100/H100 as seven 1g.10gb instances
  kubegpu.node.gpu_mig:
    layout: all-1g.10gb

- name: A layout of our own, per GPU model
  kubegpu.node.gpu_mig:
    layout: inference
    layouts:
      version: v1
      mig-configs:
        inference:
          - device-filter: ["0x233010DE"]   # H100 80GB SXM5
            devices: all
            mig-enabled: true
            mig-devices:
              "1g.10gb": 4
              "3g.40gb": 1
          - device-filter: ["0x20B210DE"]   # A100-SXM4-80GB
            devices: [0, 1]
            mig-enabled: true
            mig-devices:
              "2g.20gb": 3

- name: Plan only (a change is reported as pending)
  kubegpu.node.gpu_mig:
    layout: all-balanced
    apply: false
  register: mig
"""

RETURN = r"""
layout:
  description: The layout asked for.
  returned: always
  type: str
ready:
  description: Whether nvidia-smi answered (false before a driver is loaded; the layout was then checked against the
    GPUs' PCI device IDs only).
  returned: success
  type: bool
pending:
  description: A change the layout needs that was not applied (O(apply=false), a GPU in use, no driver answering yet,
    or a MIG mode waiting for a reset).
  returned: success
  type: bool
plan:
  description: Per GPU, what was planned (after a change, what the final read found to do, which is nothing).
  returned: success
  type: list
  elements: dict
  contains:
    index:
      description: The GPU's index.
      type: int
    model:
      description: The GPU model in the profile table.
      type: str
    device_id:
      description: The GPU's PCI device ID.
      type: str
    mig:
      description: Whether the layout wants MIG on this GPU (null when the layout leaves it as it is).
      type: bool
    devices:
      description: The instances the layout wants, profile to count.
      type: dict
    action:
      description: One of none, create, reconfigure, enable, disable, keep_mode, reset_required, unknown.
      type: str
    commands:
      description: The nvidia-smi commands planned.
      type: list
      elements: list
    placements:
      description: Where each instance goes (profile, first memory slice).
      type: list
      elements: dict
    busy:
      description: Compute processes using the GPU.
      type: list
      elements: str
    note:
      description: Why nothing is planned, where nothing is.
      type: str
commands:
  description: The nvidia-smi commands run, in order.
  returned: success
  type: list
  elements: list
  sample: [["nvidia-smi", "mig", "-i", "0", "-cgi", "3g.40gb,2g.20gb,1g.10gb,1g.10gb", "-C"]]
devices:
  description: What the node offers now; GPUs, GPUs without MIG, GPUs with MIG, and MIG devices per profile.
  returned: success
  type: dict
  sample: {"gpus": 2, "full_gpus": 1, "mig_enabled_gpus": 1, "mig": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}
wanted:
  description: What the node offers once the layout is applied (same shape as RV(devices)).
  returned: success
  type: dict
reset_required:
  description: Indexes of GPUs whose MIG mode waits for a reset.
  returned: success
  type: list
  elements: int
busy:
  description: GPU index to the compute processes that keep a change from being applied.
  returned: success
  type: dict
fact:
  description: What C(kubegpu.node.gpu_mig)'s role writes to C(/etc/ansible/facts.d/nvidia_mig.fact) (layout,
    pending, whether a GPU takes MIG, the product, RV(devices), RV(wanted), and the attributes C(nvidia-smi mig -lgip)
    gives each profile present), from which C(kubegpu.node.gpu_labels) works out the MIG labels.
  returned: success
  type: dict
"""
