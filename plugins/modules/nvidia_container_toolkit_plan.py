#!/usr/bin/python
# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only: kubegpu.node.nvidia_container_toolkit_plan is an action plugin
# (plugins/action/nvidia_container_toolkit_plan.py) that runs on the controller and reads the node through plain
# commands.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_container_toolkit_plan
short_description: Plan what the role kubegpu.node.nvidia_container_toolkit does on a node, changing nothing
version_added: 0.1.0
description:
  - The planning step of the role C(kubegpu.node.nvidia_container_toolkit), usable on its own to see what the role
    would do on a node (a drift check). It reads and decides, and changes nothing on the node.
  - "Reads the node in one command: dpkg's state of the four toolkit packages, C(config.toml) and the C(/dev/char)
    udev rule, the CDI refresh units and what C(nvidia-ctk cdi list) shows, the NVIDIA device nodes without their
    C(/dev/char) link. A full read (without O(checked)) also fetches the repository's key with apt's own downloader
    and reads the role's source and keyring files (once per run)."
  - "Checks on the controller that every key in the fetched key has one of O(repo_key_fingerprints); plans the four
    packages at O(version), moved together (refusing a downgrade unless O(allow_downgrade)); and, when the source,
    the key or the packages must change, has apt read the repository in a throwaway state (its own lists: a signature
    that does not verify with the key fails there, every failure an error) and checks that it offers O(version)."
  - Merges O(runtime_config) into C(config.toml) on the controller, changing only the lines of the keys that change
    and keeping every comment.
author:
  - kubegpu.node maintainers (@kubegpu)
extends_documentation_fragment:
  - kubegpu.node.attributes
  - kubegpu.node.attributes.action
  - kubegpu.node.attributes.reads_only
attributes:
  diff_mode:
    details: The role's file writes show the differences.
options:
  state:
    description: C(present) plans the installation; C(absent) the removal of what the role added.
    type: str
    choices: [present, absent]
    default: present
  version:
    description: The exact package version of all four packages, as apt shows it.
    type: str
    default: 1.18.2-1
  allow_downgrade:
    description: Allow a version older than the installed one.
    type: bool
    default: false
  channel:
    description: C(stable), or C(experimental) in addition to stable.
    type: str
    choices: [stable, experimental]
    default: stable
  repo_url:
    description: The repository's base URL (C(<url>/stable/deb/<arch>)).
    type: str
    default: https://nvidia.github.io/libnvidia-container
  repo_key_url:
    description: Where the node fetches the repository's signing key.
    type: str
    default: https://nvidia.github.io/libnvidia-container/gpgkey
  repo_key_fingerprints:
    description: The fingerprints every key in the signing key must have.
    type: list
    elements: str
    default: [C95B321B61E88C1809C4F759DDCAE044F796ECB0]
  hold:
    description: Hold the four packages.
    type: bool
    default: true
  cdi:
    description: Read what CDI knows (C(nvidia-ctk cdi list)).
    type: bool
    default: false
  cdi_spec:
    description: Where the role writes the CDI specification when the toolkit has no refresh units.
    type: path
    default: /etc/cdi/nvidia.yaml
  runtime_config:
    description: Settings of C(config.toml), tables as nested dicts.
    type: dict
    default: {}
  dev_char_symlinks:
    description: The C(/dev/char) links and their udev rule are wanted.
    type: bool
    default: true
  keyring:
    description: The keyring file the source's C(Signed-By) names.
    type: path
    default: /etc/apt/keyrings/nvidia-container-toolkit.asc
  source:
    description: The deb822 source file.
    type: path
    default: /etc/apt/sources.list.d/nvidia-container-toolkit.sources
  checked:
    description: RV(checked) of a full read earlier in this run; only the node is read again.
    type: dict
  links_only:
    description: Read only the NVIDIA device nodes without a C(/dev/char) link (RV(unlinked)).
    type: bool
    default: false
  hand_over:
    description:
      - Mark a full read's result for the role's next run on the host in this playbook run (result C(hand_over)). The
        role's preflight entry point sets it; its main entry point does not, so that a run's own preflight is never
        taken for a later run's.
    type: bool
    default: false
seealso:
  - module: kubegpu.node.service_config
"""

EXAMPLES = r"""
- name: See what the toolkit role would do on a node
  kubegpu.node.nvidia_container_toolkit_plan:
    version: 1.18.2-1
  register: toolkit_plan

- name: Say it
  ansible.builtin.debug:
    msg: "{{ toolkit_plan.packages.direction }}: {{ toolkit_plan.packages.install }}"
"""

RETURN = r"""
packages:
  description:
    - C(installed) (name to version), C(held), C(change), C(downgrades), C(direction) (none, install, upgrade,
      downgrade, mixed), C(install) (C(name=version) for one apt transaction), C(to_hold), C(to_unhold),
      C(to_remove), C(problem).
  returned: always
  type: dict
files:
  description: The keyring and the source (C(path), C(content), C(mode), C(changed)).
  returned: with state present
  type: list
  elements: dict
repo_changes:
  description: The keyring or the source differ from what the role writes.
  returned: with state present
  type: bool
update_needed:
  description: The node's lists of the toolkit's repository must be updated before apt runs.
  returned: with state present
  type: bool
update_lists_argv:
  description: The command that updates them (the toolkit's source only, every failure an error).
  returned: with state present
  type: list
  elements: str
hold_after_apt:
  description: The packages to hold after apt changed any.
  returned: with state present
  type: list
  elements: str
to_hold:
  description: The packages to hold now.
  returned: with state present
  type: list
  elements: str
to_unhold:
  description: The holds to release (O(hold=false)).
  returned: with state present
  type: list
  elements: str
runtime_config:
  description: C(config.toml)'s new C(content), the C(changed) keys, whether to C(write) it, its C(file).
  returned: with state present
  type: dict
udev_rule:
  description: Whether to C(write) the C(/dev/char) udev rule, its C(file) and C(content).
  returned: with state present
  type: dict
cdi:
  description:
    - C(units) (the refresh units are installed), C(change_units), C(generated), C(remove_own_spec), C(list),
      C(list_rc), C(ok) (the list shows a GPU).
  returned: with state present
  type: dict
unlinked:
  description: The NVIDIA device nodes without their C(/dev/char) link.
  returned: with state present, or O(links_only)
  type: list
  elements: str
steps:
  description:
    - Which steps have anything to do, each a bool - C(packages) (key, source, lists, packages, holds), C(configure)
      (C(config.toml), the udev rule, the C(/dev/char) links). The role includes a step's tasks only when it is true.
  returned: with state present
  type: dict
remove_files:
  description: With state absent, the files the role wrote.
  returned: with state absent
  type: list
  elements: str
replay:
  description:
    - With RV(hand_over) - this read's own arguments (C(args)), less those of the hand-over, with which the playbook
      C(kubegpu.node.site) reads the node again at the start of the host's batch (M(kubegpu.node.chain_plan)), as
      the role's next run would.
  returned: when handed over
  type: dict
hand_over:
  description:
    - True when O(hand_over) was asked for and this plan read everything (the key and the repository) without
      O(checked).
    - The role's next run on the host in the same playbook run plans from this result's C(checked) instead of
      reading it all again.
  returned: with state present
  type: bool
checked:
  description: The key, the source and keyring as read, whether the repository was read; for O(checked).
  returned: with state present
  type: dict
"""
