# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # The attributes every module of the collection documents, as ansible.builtin's action_common_attributes does:
    # the fragment says what an attribute means, the module its support and, in `details`, how it behaves. A module's
    # own values win over a fragment's (ansible/utils/plugin_docs.py, merge_fragment), so a module states only what
    # is its own.
    DOCUMENTATION = r"""
attributes:
  check_mode:
    description: Can run in check mode and return the changed status prediction without modifying the target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check mode), when in diff mode.
  idempotent:
    description: When run twice in a row outside check mode, with the same arguments, the second run reports no change.
"""

    # The actions: their module file holds only the documentation; the plugin runs on the controller.
    ACTION = r"""
attributes:
  action:
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the
      controller.
    support: full
    details: Runs as an action plugin on the controller.
"""

    # What only reads (a plan, a judgement, a listing): the same in check mode, nothing to show in diff mode.
    READS_ONLY = r"""
attributes:
  check_mode:
    support: full
    details: It only reads; it runs the same in check mode.
  diff_mode:
    support: none
    details: It changes nothing.
  idempotent:
    support: full
    details: It only reads.
"""

    # The modules that write to the Kubernetes API: dry runs in check mode, the objects' before and after in diff mode
    # (the module says how).
    K8S = r"""
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  idempotent:
    support: full
"""
