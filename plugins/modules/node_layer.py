#!/usr/bin/python
# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only: kubegpu.node.node_layer is an action plugin (plugins/action/node_layer.py) that runs on the
# controller; its decisions are plugins/plugin_utils/_node_layer.py.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_layer
short_description: The node layer of kubegpu.node's roles (internal to the role kubegpu.node._common)
version_added: 0.1.0
description:
  - Internal to the role C(kubegpu.node._common) (C(roles/_common/tasks/node.yml)), which every role of this
    collection imports first, and to the playbook C(kubegpu.node.site), which calls it once for all its roles
    (O(roles)); its options and results may change in any release.
  - Refuses a caller that is not a role of this collection or that playbook.
  - Checks that the node's Python is 3.8 or later before any module runs (a shell command, as C(ansible.builtin.raw)
    runs it), once a run for each interpreter.
  - Gathers the facts the roles read (the C(min) subset) when one is missing.
  - Finds the calling role's OS variable files (C(vars/os/default.yml), then the first of
    C(<distribution>-<major>.yml), C(<distribution>.yml), C(<os_family>.yml)) once a run for each role, and warns when
    they say that the collection's CI does not run the role on the node's system.
  - Decides which old names of renamed variables are used for their new names, with a warning for each old name set,
    from the role's table C(__<role>_renamed) in its C(vars/main.yml) and the host's variables.
    C(roles/_common/tasks/node_renamed.yml) sets them; a role with renamed variables that imports C(node.yml) is
    refused.
author:
  - kubegpu.node maintainers (@kubegpu)
extends_documentation_fragment:
  - kubegpu.node.attributes
  - kubegpu.node.attributes.action
  - kubegpu.node.attributes.reads_only
options:
  caller:
    description: The role that imports the layer (C(ansible_parent_role_names[0])).
    type: str
    default: ""
  caller_path:
    description: That role's folder (C(ansible_parent_role_paths[0])); its C(vars/os/) holds the OS variable files.
    type: path
    default: ""
  interpreter:
    description: The Python that modules run with on the node.
    type: str
    default: python3
  done:
    description: This task's own result from an earlier call in the run (what is done once a run).
    type: dict
    default: {}
  renames_applied:
    description:
      - Whether the caller imported C(roles/_common/tasks/node_renamed.yml), which sets the new names after this task.
      - A role with renamed variables (C(__<role>_renamed) in its C(vars/main.yml)) that imported C(node.yml) instead
        is refused.
    type: bool
    default: false
  roles:
    description:
      - The playbook C(kubegpu.node.site) only (O(caller=kubegpu.node.site)) - the layer of each of these roles of
        this collection in one call - each role's OS variable files (RV(os_files), in order) and renamed variables
        (read from the role's C(vars/main.yml); the old names' values from the host's variables).
      - Each must be a role of this collection (a folder of its C(roles/), read from there).
    type: list
    elements: str
    default: []
  fact_path:
    description: Where the facts gathered read local facts from (O(ansible.builtin.setup#module:fact_path)).
    type: str
    default: ""
  gather:
    description:
      - Gather the facts once in the run even when those the roles read are known (a fact cache, or AWX's fact
        storage, keeps them from an earlier run; the node, its local facts too, may have changed since).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Check the node's Python, read its facts and find its system's variables (once a run)
  kubegpu.node.node_layer:
    caller: "{{ ansible_parent_role_names | default([]) | first | default('') }}"
    caller_path: "{{ ansible_parent_role_paths | default([]) | first | default('') }}"
    done: "{{ __common_node | default({}) }}"
  register: __common_node
"""

RETURN = r"""
python_checked:
  description: The interpreter whose version was checked in this run.
  returned: success
  type: str
os_files:
  description: The OS variable files to load now, in order (none when this run loaded them already).
  returned: success
  type: list
  elements: str
loaded:
  description: The roles whose OS variable files this run has loaded.
  returned: success
  type: list
  elements: str
renamed:
  description: The old names whose values are used for their new names, each with C(old) and C(new).
  returned: success
  type: list
  elements: dict
ansible_facts:
  description: The C(min) subset of the facts, when one the roles read was missing or O(gather) asked for them.
  returned: when gathered
  type: dict
gathered:
  description: Whether this run has gathered the facts (in this call or an earlier one, O(done)).
  returned: success
  type: bool
"""
