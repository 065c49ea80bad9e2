#!/usr/bin/python
# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only: kubegpu.node.gpu_health is an action plugin (plugins/action/gpu_health.py) that reads the node
# in one shell command and judges what it read on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health
short_description: Judge the health of a node's NVIDIA GPUs from one read of the node
version_added: 0.1.0
description:
  - Reads the node once, in one shell command (no Python module runs on the node) - C(nvidia-smi -q -x); the
    C(NVRM:) C(Xid) lines of the kernel log since boot (C(journalctl -k -b), else C(dmesg), or O(kernel_log_file)); and
    the NVIDIA GPUs on the PCI bus (vendor C(0x10de), class C(0x0300) or C(0x0302) under O(pci_devices_dir)).
  - "Judges each GPU on the controller: uncorrectable ECC errors (volatile and aggregate), retired pages and
    remapped rows (pending, failed), the current PCIe link width against the maximum (and the generation, as a note:
    it drops while the GPU idles), clock event reasons that mean hardware trouble (HW Slowdown, HW Thermal Slowdown,
    HW Power Brake Slowdown, SW Thermal Slowdown), the driver's reset status, persistence mode (a note), and each Xid
    with its meaning and action from NVIDIA's Xid catalog."
  - Compares the GPUs on the PCI bus with those the driver lists, so a GPU that has fallen off the bus is found
    even when nvidia-smi no longer shows it.
  - Returns a verdict per GPU and per node - C(healthy), C(degraded), C(failed), or C(unknown) when the GPUs could not
    be read (no driver loaded) - each with its reasons and the one action that would clear it, from the least to the
    most disruptive - C(application) (the GPU is fine, an application failed), C(watch), C(reset) (drain, then reset
    the GPU), C(reboot) (drain, then reboot the node), C(replace) (hardware service).
  - Parses nvidia-smi's XML of drivers 470 to 580 (DTD versions v11, v12 and v13; 580's read of a real H200 is a test
    fixture); any field a GPU does not support (C(N/A), for example ECC on a GeForce GPU) is left unjudged. The
    driver's GPU recovery action (v13) counts, where C(Reset) fails the GPU with action C(reset) and C(Reboot) with
    C(reboot).
author:
  - kubegpu.node maintainers (@kubegpu)
extends_documentation_fragment:
  - kubegpu.node.attributes
  - kubegpu.node.attributes.action
  - kubegpu.node.attributes.reads_only
attributes:
  idempotent:
    details: It changes nothing; the same node state gives the same result.
  become:
    description: Is usable alongside become keywords.
    support: full
    details: Reading the kernel log usually needs root.
options:
  nvidia_smi:
    description: The nvidia-smi to run (a name on the node's C(PATH), or a path).
    type: str
    default: nvidia-smi
  kernel_log_file:
    description:
      - A file to read the C(NVRM:) C(Xid) lines from (for example C(/var/log/kern.log)), instead of the journal since
        boot (or C(dmesg) where the journal holds no kernel messages). Every line of the file counts.
    type: str
    default: ""
  pci_devices_dir:
    description: The sysfs folder of PCI devices.
    type: str
    default: /sys/bus/pci/devices
  max_xid_lines:
    description: At most this many of the newest Xid lines are read.
    type: int
    default: 2000
  ignore_xids:
    description: Xids not to judge (for example one a site knows to be harmless on its hardware).
    type: list
    elements: int
    default: []
  facts_file:
    description:
      - A local facts file for the verdict (the role's C(<gpu_health_facts_dir>/nvidia_health.fact)), read in the same
        command; the result then says whether the file already holds this verdict (RV(facts_current)) and gives its
        text (RV(facts_content)), so that a run whose verdict is already there writes nothing. This action does not
        write it.
    type: path
    default: ""
  fail_on:
    description:
      - The verdicts RV(fails) is true for - V(none) (none), V(degraded) (degraded or failed), V(failed). A node whose
        GPUs could not be read (verdict C(unknown)) is never one of them.
      - This action does not fail for them; the role of the same name does (C(gpu_health_fail_on)), once it has
        recorded and reported the verdict. Any other value fails the action before the node is read.
    type: str
    choices: [none, degraded, failed]
    default: none
notes:
  - Xids count from the node's boot; a GPU reset that cleared the fault does not clear the kernel log, so such a GPU
    stays failed until the next reboot, or until its Xid is listed in O(ignore_xids).
  - The role M(kubegpu.node.gpu_health) (a role of the same name) runs this action, writes the verdict into the local
    facts C(ansible_local.nvidia_health) and reports it; C(kubegpu.node.site) marks the Kubernetes node with it.
seealso:
  - name: NVIDIA Xid catalog
    description: The meaning and the resolution of each Xid.
    link: https://docs.nvidia.com/deploy/xid-errors/
  - name: nvidia-smi(1)
    description: ECC errors, page retirement, row remapping, clock event reasons.
    link: https://docs.nvidia.com/deploy/nvidia-smi/
"""

EXAMPLES = r"""
- name: Check the GPUs of every node, ad hoc
  kubegpu.node.gpu_health:
  become: true
  register: health

- name: Show the nodes that are not healthy
  ansible.builtin.debug:
    msg: "{{ health.gpu_health.summary }}"
  when: health.gpu_health.verdict in ['degraded', 'failed']

- name: Read the Xids from the syslog file where the journal does not keep kernel messages
  kubegpu.node.gpu_health:
    kernel_log_file: /var/log/kern.log
    ignore_xids: [92]
  become: true
"""

RETURN = r"""
facts_content:
  description: The text of O(facts_file) for this verdict (JSON, keys sorted, four spaces, a final newline).
  returned: when O(facts_file) is set
  type: str
facts_current:
  description: Whether O(facts_file) already holds RV(facts_content), root's, mode 0644, in a folder of mode 0755.
  returned: when O(facts_file) is set
  type: bool
fails:
  description: Whether the verdict is one O(fail_on) names.
  returned: success
  type: bool
gpu_health:
  description: The node's verdict, as the role writes it into C(ansible_local.nvidia_health).
  returned: success
  type: dict
  contains:
    schema:
      description: Version of this structure (1).
      type: int
    verdict:
      description: C(healthy), C(degraded), C(failed), or C(unknown) (the GPUs could not be read). The worst of the
        GPUs' verdicts and the node's own findings.
      type: str
      sample: failed
    action:
      description: The strongest action among the findings that count - C(none), C(application), C(watch), C(reset),
        C(reboot) or C(replace).
      type: str
      sample: reset
    summary:
      description: One line for people (the play's output, the validation table, the node's annotation).
      type: str
      sample: "failed (reset): 1 of 4 GPU(s): GPU 2 (00000000:47:00.0): 2 uncorrectable ECC error(s) since the
        driver loaded (volatile) -> reset"
    reasons:
      description: Every finding that counts, one line each, naming the GPU, what was found and the action.
      type: list
      elements: str
    notes:
      description: Node findings that change no verdict (no kernel log readable, the driver not loaded).
      type: list
      elements: str
    gpus:
      description: One entry per GPU the driver lists, and per GPU on the PCI bus it does not (its index is null).
      type: list
      elements: dict
      contains:
        index:
          description: The GPU's minor number, null for a GPU the driver does not list.
          type: int
        bus_id:
          description: The PCI address as nvidia-smi writes it.
          type: str
          sample: "00000000:47:00.0"
        uuid:
          description: The GPU's UUID.
          type: str
        name:
          description: The product name.
          type: str
        verdict:
          description: C(healthy), C(degraded) or C(failed).
          type: str
        action:
          description: The action that would clear this GPU's findings.
          type: str
        findings:
          description: Each finding, worst first - C(severity) (C(info), C(degraded), C(failed)), C(action), C(text).
          type: list
          elements: dict
    unhealthy_gpus:
      description: Bus ids of the GPUs whose verdict is degraded or failed.
      type: list
      elements: str
    gpu_count:
      description: C(pci), the NVIDIA GPUs on the PCI bus; C(driver), those nvidia-smi lists (null when it answered
        nothing).
      type: dict
      sample: {"pci": 4, "driver": 3}
    driver_version:
      description: The driver's version, as nvidia-smi reports it.
      type: str
    kernel_log:
      description: Where the Xid lines came from - C(journal), C(dmesg), C(file), or C(none) / C(unreadable).
      type: str
    xids:
      description: Per GPU and Xid - C(bus_id), C(xid), C(count), C(meaning), C(action), and the C(last) message.
      type: list
      elements: dict
"""
