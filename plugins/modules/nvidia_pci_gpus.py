#!/usr/bin/python
# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_pci_gpus
short_description: List the NVIDIA GPUs on a node's PCI bus, with or without a driver
version_added: 0.1.0
description:
  - Reads the node's PCI devices from sysfs (C(/sys/bus/pci/devices/*/vendor), C(device), C(class)) and returns the
    NVIDIA GPUs among them, display controllers (class C(0x0300)) and 3D controllers (class C(0x0302), the data-centre
    boards). NVSwitch bridges (class C(0x0680)) and audio functions are not GPUs.
  - Needs no driver, no C(lspci) and no C(nvidia-smi) - what the node's hardware has, whatever its driver does. The
    role C(kubegpu.node.nvidia_driver) uses it for its warnings and facts.
author:
  - kubegpu.node maintainers (@kubegpu)
extends_documentation_fragment:
  - kubegpu.node.attributes
  - kubegpu.node.attributes.reads_only
options:
  sysfs:
    description: The folder of PCI devices to read (a test can point it at a copy).
    type: path
    default: /sys/bus/pci/devices
"""

EXAMPLES = r"""
- name: Count the NVIDIA GPUs on the PCI bus
  kubegpu.node.nvidia_pci_gpus:
  register: pci

- name: Say how many there are
  ansible.builtin.debug:
    msg: "{{ pci.count }} NVIDIA GPUs: {{ pci.gpus | map(attribute='device_id') | join(', ') }}"
"""

RETURN = r"""
gpus:
  description: The NVIDIA GPUs, by PCI address.
  returned: always
  type: list
  elements: dict
  contains:
    pci_bus_id:
      description: The PCI address, as sysfs names it.
      type: str
      sample: "0000:07:00.0"
    device_id:
      description: Vendor and device id as C(lspci -n) writes them.
      type: str
      sample: "10de:20b2"
    class:
      description: The PCI class.
      type: str
      sample: "0x030200"
  sample: [{pci_bus_id: "0000:07:00.0", device_id: "10de:20b2", class: "0x030200"}]
count:
  description: How many NVIDIA GPUs there are.
  returned: always
  type: int
  sample: 8
"""

import os

from ansible.module_utils.basic import AnsibleModule

NVIDIA_VENDOR = "0x10de"
# VGA compatible controller (0x0300xx) and 3D controller (0x0302xx).
GPU_CLASSES = ("0x0300", "0x0302")


def _read(path):
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip().lower()
    except (OSError, UnicodeDecodeError):
        return ""


def nvidia_gpus(sysfs):
    """The NVIDIA GPUs under a sysfs folder of PCI devices, sorted by address (Python 3.8: runs on the node)."""
    gpus = []
    try:
        entries = sorted(os.listdir(sysfs))
    except OSError:
        return gpus
    for entry in entries:
        folder = os.path.join(sysfs, entry)
        vendor = _read(os.path.join(folder, "vendor"))
        klass = _read(os.path.join(folder, "class"))
        if vendor != NVIDIA_VENDOR or not klass.startswith(GPU_CLASSES):
            continue
        device = _read(os.path.join(folder, "device"))
        if device.startswith("0x"):
            device = device[2:]
        gpus.append({"pci_bus_id": entry.lower(), "device_id": "10de:" + device, "class": klass})
    return gpus


def main():
    module = AnsibleModule(
        argument_spec={"sysfs": {"type": "path", "default": "/sys/bus/pci/devices"}},
        supports_check_mode=True,
    )
    gpus = nvidia_gpus(module.params["sysfs"])
    module.exit_json(changed=False, gpus=gpus, count=len(gpus))


if __name__ == "__main__":
    main()
