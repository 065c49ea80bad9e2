# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubegpu.node.nvidia_pci_gpus over a copy of sysfs' PCI device folders (what a node with GPUs shows)."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.kubegpu.node.plugins.modules.nvidia_pci_gpus import nvidia_gpus


def device(root: Path, address: str, vendor: str, device_id: str, klass: str) -> None:
    folder = root / address
    folder.mkdir(parents=True)
    for name, value in (("vendor", vendor), ("device", device_id), ("class", klass)):
        (folder / name).write_text(value + "\n", encoding="ascii")


def test_only_nvidia_display_and_3d_controllers_are_gpus(tmp_path: Path):
    device(tmp_path, "0000:00:02.0", "0x8086", "0x9bc8", "0x030000")  # Intel graphics
    device(tmp_path, "0000:86:00.0", "0x10de", "0x1bb3", "0x030200")  # Tesla P4, 3D controller
    device(tmp_path, "0000:07:00.0", "0x10de", "0x20B2", "0x030200")  # A100
    device(tmp_path, "0000:07:00.1", "0x10de", "0x10f0", "0x040300")  # the GPU's HDMI audio function
    device(tmp_path, "0000:c1:00.0", "0x10de", "0x22a3", "0x068000")  # an NVSwitch bridge
    device(tmp_path, "0000:01:00.0", "0x10de", "0x2204", "0x030000")  # a display controller (GeForce)
    (tmp_path / "0000:ff:00.0").mkdir()  # a device without the attributes
    assert nvidia_gpus(str(tmp_path)) == [
        {"pci_bus_id": "0000:01:00.0", "device_id": "10de:2204", "class": "0x030000"},
        {"pci_bus_id": "0000:07:00.0", "device_id": "10de:20b2", "class": "0x030200"},
        {"pci_bus_id": "0000:86:00.0", "device_id": "10de:1bb3", "class": "0x030200"},
    ]


def test_a_node_without_a_pci_bus_has_no_gpu(tmp_path: Path):
    assert nvidia_gpus(str(tmp_path / "missing")) == []
