#!/usr/bin/python
# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only: kubegpu.node.nvidia_driver_plan is an action plugin (plugins/action/nvidia_driver_plan.py) that
# runs on the controller and reads the node through plain commands and builtin modules.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_driver_plan
short_description: Plan what the role kubegpu.node.nvidia_driver does on a node, changing nothing
version_added: 0.1.0
description:
  - The planning step of the role C(kubegpu.node.nvidia_driver), usable on its own to see what the role would do on a
    node (a drift check). It reads and decides, and changes nothing on the node.
  - "A full read (without O(checked)) reads what holds for a whole run, in one command: the role's own files, a
    driver installed another way (NVIDIA's C(.run) installer: C(/usr/bin/nvidia-uninstall) or
    C(/usr/bin/nvidia-installer); the GPU Operator: C(/run/nvidia/driver); the installer's log alone is not one), the
    initramfs of the next boot, Secure Boot and the enrolled Machine Owner Keys, the free space; then the package
    source in a throwaway apt state (its own lists: a signature that does not verify with the key fails there), with
    the key fetched by apt's own downloader and its fingerprints checked on the controller; and the GPUs on the PCI
    bus (M(kubegpu.node.nvidia_pci_gpus))."
  - "Every read (also with O(checked), the result of a full read earlier in the run) reads what may change while a
    run goes on, in one command: the running kernel and those in C(/boot), their headers and the nvidia module built
    for each, dpkg's state of the driver's packages, the loaded driver, nouveau, C(nvidia-persistenced), and
    C(nvidia-smi)'s GPUs when a driver is loaded."
  - "Decides on the controller: the kernels to build for (O(kernels), or the kernel that boots next and the running
    one when it has headers: a kernel upgraded and not rebooted yet gets the module for the next boot only), the
    packages at the branch's newest version (or O(version)) that the source offers, what apt and dpkg must still do
    (installs, holds, NVIDIA pinning packages of another branch to remove, whether the node's lists of the source must
    be updated first so that apt sees the versions planned), the files to write, the reboot decision and the facts."
  - "Fails before any change, with a message saying what to do: wrong inputs, a driver installed another way, too
    little space, a key that is not trusted or cannot be fetched, a source whose signature does not verify or that
    lacks the branch (listing those it has), a kernel to build for without headers, Secure Boot with modules that
    would not load."
author:
  - kubegpu.node maintainers (@kubegpu)
extends_documentation_fragment:
  - kubegpu.node.attributes
  - kubegpu.node.attributes.action
  - kubegpu.node.attributes.reads_only
attributes:
  check_mode:
    details: It only reads. In check mode the reboot decision is made for the version the packages would install.
  diff_mode:
    details: The role's file writes show the differences.
options:
  state:
    description: C(present) plans the installation; C(absent) plans the removal of what the role added.
    type: str
    choices: [present, absent]
    default: present
  branch:
    description: The driver branch (V(535), V(580)); required with O(state=present).
    type: str
    default: ""
  version:
    description: An exact version of the branch; empty for the newest the source has.
    type: str
    default: ""
  source:
    description: Where the packages come from.
    type: str
    choices: [distribution, cuda, mirror]
    default: distribution
  flavour:
    description: The kernel modules.
    type: str
    choices: [proprietary, open]
    default: proprietary
  headless:
    description: Compute packages only.
    type: bool
    default: true
  extra_packages:
    description: More packages to install and hold with the driver.
    type: list
    elements: str
    default: []
  persistenced:
    description: Install and enable C(nvidia-persistenced).
    type: bool
    default: true
  kernels:
    description:
      - The kernels to build the module for; empty for the next boot's, and the running one when it has headers.
    type: list
    elements: str
    default: []
  manage_repository:
    description: The role writes the package source (false - the node's own lists are read, not updated).
    type: bool
    default: true
  debian_mirror:
    description: Debian's archive.
    type: str
    default: http://deb.debian.org/debian
  debian_security_mirror:
    description: Debian's security archive.
    type: str
    default: http://deb.debian.org/debian-security
  repository_url:
    description: The repository of source C(mirror), or C(cuda) (empty - NVIDIA's for the node's system).
    type: str
    default: ""
  repository_suite:
    description: The repository's suite.
    type: str
    default: /
  repository_components:
    description: The repository's components.
    type: list
    elements: str
    default: []
  repository_key:
    description: The repository's signing key, ASCII-armoured.
    type: str
    default: ""
  repository_key_url:
    description: Where the node fetches the key (empty with source C(cuda) - NVIDIA's key next to its repository).
    type: str
    default: ""
  repository_key_fingerprints:
    description:
      - The fingerprints every key in the repository's key must have. NVIDIA's CUDA repository keys by default.
      - Empty - a key given inline is trusted as it is; a key fetched from a URL is refused.
    type: list
    elements: str
    default: [EB693B3035CD5710E231E123A4B469963BF863CC, 02182E60104FCDC26EAE1B8597A5D4CB8793F200]
  repository_key_fingerprint:
    description: Deprecated; one fingerprint, used as O(repository_key_fingerprints) when set (with a warning).
    type: str
    default: ""
  min_free_mib:
    description: The free space under C(/usr) and C(/var) the packages and the DKMS build need, in MiB.
    type: int
    default: 1500
  checked:
    description:
      - RV(checked) of a full read earlier in this run; the node is read again for what may have changed since, the
        source and the role's files are not (they are read once per run).
    type: dict
  error:
    description:
      - The message of a failure earlier in this run. Nothing is refused then; the plan says what is on the node (the
        facts with C(next_boot_ready) and C(error), the holds to put back) for the role to record before it fails.
    type: str
    default: ""
  facts_now:
    description: The facts file's content when the role wrote it earlier in this run, since the full read whose
      C(checked) is given; used only with O(checked) (a full read reads the file).
    type: str
  hand_over:
    description:
      - Mark a full read's result for the role's next run on the host in this playbook run (result C(hand_over)). The
        role's preflight entry point sets it; its main entry point does not, so that a run's own preflight is never
        taken for a later run's.
    type: bool
    default: false
notes:
  - The node needs a POSIX shell, dpkg, apt and kmod's C(modinfo); nothing else beyond what ansible-core asks for.
seealso:
  - module: kubegpu.node.nvidia_pci_gpus
"""

EXAMPLES = r"""
- name: See what the driver role would do on a node (drift check)
  kubegpu.node.nvidia_driver_plan:
    branch: "580"
    source: cuda
  register: driver_plan

- name: Say it
  ansible.builtin.debug:
    msg: >-
      install {{ driver_plan.changes.install_packages }}, {{ driver_plan.decision.reason }}
"""

RETURN = r"""
kernels:
  description: C(targets) (the kernels to build for), C(next_boot), C(running).
  returned: with state present
  type: dict
dkms:
  description: Whether DKMS builds the module (false - Ubuntu's precompiled modules).
  returned: with state present
  type: bool
version:
  description: The driver version the plan installs (NVIDIA's, without the package revision).
  returned: with state present
  type: str
  sample: 580.95.05
planned:
  description: Every package the role installs and holds, C(name=version) where the source versions it with the driver.
  returned: with state present
  type: list
  elements: str
changes:
  description:
    - What apt and dpkg must still do - C(remove) (NVIDIA pinning packages of another branch), C(install_pinning),
      C(install_packages), C(to_hold), C(hold_after_apt), C(dkms_build) (kernels that lack the module),
      C(update_lists) (update the node's lists of the role's source first), C(initramfs) (rebuild it without nouveau).
  returned: with state present
  type: dict
update_lists_argv:
  description: The command that updates the node's lists of the role's source only (every failure an error).
  returned: with state present
  type: list
  elements: str
files:
  description: The files the role writes (C(path), C(content), C(mode), C(changed)).
  returned: with state present
  type: list
  elements: dict
decision:
  description:
    - C(action) (none, load, reboot, skip), C(reboot_required), C(reason), C(installed_version) (the next boot's
      module), C(loaded_version), C(next_boot_ready) (the next boot has the module of the installed packages).
  returned: with state present
  type: dict
persistenced:
  description: Whether C(nvidia-persistenced) must be enabled (C(enable)) or started (C(start)), and C(change).
  returned: with state present
  type: dict
facts:
  description: What the role records in C(/etc/ansible/facts.d/nvidia.fact) (C(ansible_local.nvidia)).
  returned: with state present
  type: dict
facts_text:
  description: That file's content.
  returned: with state present
  type: str
facts_changed:
  description: Whether the file differs from it.
  returned: with state present
  type: bool
steps:
  description:
    - Which steps have anything to do, each a bool - C(install) (files, lists, packages, holds, DKMS builds),
      C(activate) (a load, a reboot or its warning, nvidia-persistenced), C(facts) (the facts file differs). The role
      includes a step's tasks only when it is true.
  returned: with state present
  type: dict
replay:
  description:
    - With RV(hand_over) - this read's own arguments (C(args)), less those of the hand-over, with which the playbook
      C(kubegpu.node.site) reads the node again at the start of the host's batch (M(kubegpu.node.chain_plan)), as
      the role's next run would.
  returned: when handed over
  type: dict
hand_over:
  description:
    - True when O(hand_over) was asked for and this plan read everything (the package source, the role's files, the
      PCI GPUs) without O(checked).
    - The role's next run on the host in the same playbook run plans from this result's C(checked) instead of
      reading it all again.
  returned: with state present
  type: bool
checked:
  description: What a full read found that holds for the run (the key, the source's offer, the role's files, the PCI
    GPUs, the initramfs), for O(checked).
  returned: with state present
  type: dict
absent:
  description: With state absent - C(unhold), C(remove) (packages), C(files), C(source_removed), C(initramfs).
  returned: with state absent
  type: dict
"""
