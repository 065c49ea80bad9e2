#!/usr/bin/python
# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only: kubegpu.node.service_config is an action plugin (plugins/action/service_config.py) that runs on
# the controller and acts on the node through builtin modules.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_config
short_description: Write a service's configuration files, restart it, verify it, and roll everything back on failure
version_added: 0.1.0
description:
  - The one write-restart-verify-roll-back step of this collection. The roles C(kubegpu.node.container_runtime),
    C(kubegpu.node.kubelet) and C(kubegpu.node.nvidia_container_toolkit) write every configuration file through it.
  - Reads each file in O(files) (through a symbolic link, its final target), and writes those whose content, mode,
    owner or group differ, in the order given, atomically (M(ansible.builtin.copy)). A file whose O(files[].content)
    is null is removed. A copy of every file it replaces or removes is kept in O(backup_dir) first.
  - Then, when anything changed and O(restart) is true, clears systemd's failed state and start-limit counter of
    O(service), restarts it and waits until it answers (O(verify)).
  - When a write, the restart or the verification fails, it puts every file back exactly as it was (the same bytes,
    owner and mode; a file it created is removed; a symbolic link stays a link and only its target is restored),
    restarts the service with them, and fails with the service's own last error from its journal, saying whether
    systemd's start limit was hit. Only lines of the processes this restart started count (the unit's invocation IDs
    from the restart on, C(_SYSTEMD_INVOCATION_ID)), so a crash loop of the previous process, or its words while it
    stopped, are never quoted as the new configuration's error; after a reload, the lines the same process logged
    since the reload.
  - A run cut at any point (a cancelled job, SIGTERM then SIGKILL; a controller that dies) leaves a node that the
    next run completes or undoes exactly. The order of a change is - copy the files about to change to O(backup_dir);
    write the note of the change in O(pending_dir) (when it was written, and the way back to the files the service
    runs with); write the files in the order given; restart (or reload) O(service); verify; remove the note. After a
    failed verification - put every file back (the last first); restart; remove the note. A run that finds a note
    restarts the service when it has not restarted since (and some noted file still differs from what it runs with),
    asks a service that has restarted since whether it answers (and restarts it, with the same way back, when it does
    not), and removes a note that has served or whose files are all back as they were (no restart then).
  - The task reports C(changed) when a file changed or the service was restarted or reloaded (a restart held back
    by an earlier run and done now is a change).
  - Never runs C(systemctl daemon-reload) (O(daemon_reload)) where it would take GPUs away from running containers.
    With the systemd cgroup driver a reload rewrites every container's device rules through
    C(/dev/char/MAJOR:MINOR), and a device without that link is dropped (NVML then fails with "Unknown Error" in
    the containers, NVIDIA/nvidia-docker#1730). Before such a reload it reads on the node, in one command, the NVIDIA
    character devices (C(/dev/nvidia*), C(/dev/nvidia-caps/*)), whether each has its C(/dev/char) link, and which
    processes hold one open (C(/proc/*/fd); NVIDIA's host daemons C(nvidia-persistenced) and C(nv-fabricmanager) do
    not count). When a link is missing and a process holds a GPU, and O(drained) is false, the files are written but
    the reload and the restart are held back exactly as with O(restart=false) (RV(restart_pending), a warning naming
    the processes, RV(gpu_guard)); a later run restarts the service once the links are in place
    (C(kubegpu.node.nvidia_container_toolkit) creates them) or with O(drained=true).
  - An undo record (what a role changed, so that C(state=absent) can restore it) is best passed as one more file, so
    that it is written and restored together with the configuration it describes. Put it before the files it
    describes when adding, and after them when undoing, so that a run cut between two files never leaves a change
    without the record that undoes it.
  - Runs on the controller; on the node it needs only what ansible-core's builtin modules need (Python 3.8 or later).
author:
  - kubegpu.node maintainers (@kubegpu)
extends_documentation_fragment:
  - kubegpu.node.attributes
  - kubegpu.node.attributes.action
attributes:
  check_mode:
    support: full
    details: Reads the files (and the note of an earlier change) and reports what would change and whether the
      service would restart; writes and restarts nothing.
  diff_mode:
    support: full
    details: Shows each changed file before and after (a symbolic link is shown with its target).
  idempotent:
    support: full
    details: Files that already hold the content, mode and ownership asked for are not written, and the service
      is not restarted (unless an earlier run's change to them is noted as not active or not verified yet).
options:
  service:
    description:
      - The systemd unit that reads the files (C(.service) is added when no suffix is given).
      - Omit it for files that no daemon needs to re-read.
    type: str
  files:
    description: The files to write or remove, in order. All are restored together when any step fails.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description:
          - The file. When it is a symbolic link (also a dangling one), the link is kept and its final target is
            written.
        type: path
        required: true
      content:
        description:
          - The text the file must hold (UTF-8).
          - Null (V(none)) when the file must not exist.
        type: str
      mode:
        description:
          - The file's mode, as octal digits (V('0644')). When not given, an existing file keeps its mode and a new
            one gets V('0644').
        type: raw
      owner:
        description: The file's owner. When not given, an existing file keeps its owner and a new one is V(root)'s.
        type: str
      group:
        description: The file's group. When not given, an existing file keeps its group and a new one gets V(root).
        type: str
      validate:
        description:
          - A command that checks a candidate before it replaces the file; C(%s) stands for the candidate's path.
          - As O(ansible.builtin.copy#module:validate). A refused candidate leaves every file as it was.
        type: str
  restart:
    description:
      - Restart O(service) after a change (or after a change an earlier run wrote without a restart).
      - When false, the files are written, the task warns, and RV(restart_pending) says that the service still runs
        with the previous ones. The note of the change in O(pending_dir) stays, with the way back to the files the
        service runs with, so that a later run with O(restart=true) restarts it even when no file changes then, and
        rolls back to those files if the service does not come back. When the service restarts (or the node reboots)
        in the meantime, the next run asks it whether it answers instead.
    type: bool
    default: true
  reload:
    description:
      - Reload O(service) (C(systemctl reload), the unit's C(ExecReload)) instead of restarting it, for daemons that
        re-read these files on a reload (dockerd re-reads its runtimes on SIGHUP). The rollback reloads too.
    type: bool
    default: false
  no_restart_reason:
    description: Why O(restart) is false, for the warning (for example what a restart would stop).
    type: str
  daemon_reload:
    description:
      - Run C(systemctl daemon-reload) before the restart (for unit files and their drop-ins).
      - Held back, with the restart, while it would take GPUs away from running containers (see O(drained)).
    type: bool
    default: false
  drained:
    description:
      - The node runs no GPU workload that a reload could hurt (it is drained, or not a node of a cluster yet), so
        O(daemon_reload) runs even where NVIDIA devices have no C(/dev/char) link, without reading the node.
      - Set it only inside a drain window, for example with C(module_defaults) for C(kubegpu.node.service_config)
        around the steps a drain window runs. Leave it false everywhere else.
    type: bool
    default: false
  verify:
    description:
      - How to know that the service answers after its restart. Without it, only systemd's word counts
        (C(systemctl is-active) after O(verify.delay) seconds).
    type: dict
    suboptions:
      command:
        description: A command (a list of arguments, run on the node without a shell) that exits 0 once the service
          answers.
        type: list
        elements: str
      url:
        description: A URL fetched on the node (M(ansible.builtin.uri)) that answers 200 once the service answers.
        type: str
      expect:
        description:
          - With O(verify.command), a regular expression (Python) its output must match, so that the service is known
            to run with the new configuration (not only to answer).
          - Not applied after a rollback, when the previous configuration is back.
        type: str
      retries:
        description: How many times to ask.
        type: int
        default: 15
      delay:
        description: Seconds between two tries.
        type: float
        default: 2.0
  backup_dir:
    description: Where the previous files are copied (mode C(0600), in a folder of mode C(0700)), one copy per change.
    type: path
    default: /var/lib/kubegpu/backup
  pending_dir:
    description:
      - Where a change is noted from before its first file is written until the service answers with it (one JSON
        file per unit, mode C(0600), in a folder of mode C(0700)). A change written without a restart stays noted
        until a run restarts the service.
    type: path
    default: /var/lib/kubegpu/pending
  error_pattern:
    description:
      - A regular expression (Python) for the journal lines of O(service) that read like its own error; the last one
        logged by the processes the restart started (by the same process since a reload) is quoted when the service
        does not come back.
      - The default matches the formats of dockerd, containerd, CRI-O and the kubelet.
    type: str
notes:
  - Content is compared by SHA-1 with the file on the node, so a no-op run reads each file's checksum (and whether a
    note of an earlier change exists) and nothing else.
  - "Test hook, never for production: when the environment of the controller's C(ansible-playbook) sets
    C(KUBEGPU_NODE_TEST_KILL_AT) to the name of a step, the controller kills itself at that step (SIGKILL of the
    worker and of C(ansible-playbook)): no cleanup, no rescue, as a cancelled job or a dead execution node leaves a
    run. The steps, in their order - C(backed-up) (copies made), C(noted) (the note written), C(wrote-1), C(wrote-2),
    ... (the n-th changed file written or removed), C(daemon-reloaded), C(restarted) (the restart or reload
    returned), C(verified) (the service answers; the note not removed yet); after a failed verification
    C(restored-1), C(restored-2), ... (the n-th file put back, the last first) and C(rolled-back) (restarted with the
    previous files). The molecule scenario C(service_config_kill) uses it."
seealso:
  - module: ansible.builtin.copy
  - module: ansible.builtin.systemd_service
"""

EXAMPLES = r"""
- name: Write containerd's nvidia drop-in and the import of it, restart containerd, roll back if it does not answer
  kubegpu.node.service_config:
    service: containerd
    files:
      - path: /etc/containerd/conf.d/99-nvidia.toml
        content: "{{ plan.dropin_content }}"
        mode: "0600"
      - path: /etc/containerd/config.toml
        content: "{{ plan.main_content }}"
    verify:
      command: [ctr, version]

- name: Remove a drop-in (content null), restarting the kubelet and waiting for its health endpoint
  kubegpu.node.service_config:
    service: kubelet
    files:
      - path: /etc/kubernetes/kubelet.conf.d/50-gpu.conf
        content: null
    verify:
      url: http://127.0.0.1:10248/healthz

- name: A unit drop-in, inside a drain window (daemon-reload even where NVIDIA devices have no /dev/char link)
  kubegpu.node.service_config:
    service: containerd
    files:
      - path: /etc/systemd/system/containerd.service.d/50-limits.conf
        content: "[Service]\nLimitNOFILE=1048576\n"
    daemon_reload: true
    drained: true

- name: Write a file that no daemon re-reads, with a backup and a rollback if the write fails
  kubegpu.node.service_config:
    files:
      - path: /etc/nvidia-container-runtime/config.toml
        content: "{{ toolkit_config_text }}"
"""

RETURN = r"""
files:
  description: One entry per file of O(files), in the same order.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: The path as given.
      type: str
    real_path:
      description: Where the bytes are written (the final target of a symbolic link, else O(files[].path)).
      type: str
    changed:
      description: Whether the file's content, mode, owner or group differ (and were, or would be, changed).
      type: bool
    existed:
      description: Whether the file existed before.
      type: bool
    backup:
      description: The copy of the previous file in O(backup_dir); null when there was none to keep.
      type: str
      returned: when the file was written or removed
restarted:
  description:
    - Whether O(service) was restarted or reloaded (in check mode, whether it would be); the task then reports
      C(changed) too.
  returned: always
  type: bool
note:
  description:
    - Whether a note of an earlier change of O(service) (its file in O(pending_dir)) is there for this run to finish
      or to remove as moot.
  returned: always
  type: bool
restart_pending:
  description:
    - O(service) still runs with its previous files, because O(restart) was false in this run or in an earlier one
      that wrote them, or because its O(daemon_reload) would have taken GPUs away from running containers
      (RV(gpu_guard)).
  returned: always
  type: bool
gpu_guard:
  description: What the node was found to have before a O(daemon_reload), and whether the reload was held back.
  returned: when O(daemon_reload) and the service would be restarted
  type: dict
  contains:
    held_back:
      description: The reload and the restart were held back (RV(restart_pending) is true).
      type: bool
    drained:
      description: O(drained) was true, so the node was not read.
      type: bool
    unlinked:
      description: The NVIDIA character devices without their C(/dev/char/MAJOR:MINOR) link.
      type: list
      elements: str
    processes:
      description: The processes that hold NVIDIA devices open, each with C(pid), C(command) and C(devices).
      type: list
      elements: dict
"""
