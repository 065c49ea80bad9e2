"""kubegpu.node.nvidia_device_plugin through a real ansible-playbook run against the simulated API server."""

from __future__ import annotations

import sys
import textwrap

from kubesim import SimCluster, SimNode

PLAYBOOK = textwrap.dedent(
    """\
    - name: Device plugin on the simulated cluster
      hosts: localhost
      gather_facts: false
      # One set of connection options for this collection's group and kubernetes.core's.
      module_defaults:
        group/kubegpu.node.k8s: &k8s_auth
          kubeconfig: "{{ kubeconfig_path }}"
        group/kubernetes.core.k8s: *k8s_auth
      tasks:
        - name: Apply with time-slicing and wait for every node
          kubegpu.node.nvidia_device_plugin:
            config:
              version: v1
              sharing:
                timeSlicing:
                  resources:
                    - name: nvidia.com/gpu
                      replicas: 2
            expected_gpus:
              gpu-1: 2
              gpu-2: 4
            wait_timeout: 30
          register: first

        - name: Apply again
          kubegpu.node.nvidia_device_plugin:
            config:
              version: v1
              sharing:
                timeSlicing:
                  resources:
                    - name: nvidia.com/gpu
                      replicas: 2
            expected_gpus:
              gpu-1: 2
              gpu-2: 4
          register: second

        - name: A misplaced config key is refused
          kubegpu.node.nvidia_device_plugin:
            kubeconfig: "{{ kubeconfig_path }}"
            config:
              version: v1
              flags:
                renameByDefault: true
          register: invalid
          failed_when: invalid is not failed

        - name: Read the DaemonSet with kubernetes.core, through the same module_defaults
          kubernetes.core.k8s_info:
            kind: DaemonSet
            namespace: kube-system
            name: nvidia-device-plugin-daemonset
          register: daemonset

        - name: Check what happened
          ansible.builtin.assert:
            that:
              - first is changed
              - first.nodes['gpu-1'].capacity == 4
              - first.nodes['gpu-2'].capacity == 8
              - second is not changed
              - "'sharing.timeSlicing.renameByDefault' in invalid.msg"
              - daemonset.resources | length == 1
    """
)


def test_playbook_run(ansible, tmp_path):
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2), SimNode("gpu-2", gpus=4)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        playbook = tmp_path / "site.yml"
        playbook.write_text(PLAYBOOK)
        # No inventory: the play runs on the implicit localhost, with this interpreter.
        completed = ansible.playbook(
            playbook,
            "-e",
            f"kubeconfig_path={kubeconfig}",
            env={"ANSIBLE_PYTHON_INTERPRETER": sys.executable, "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false"},
            skip_chain=False,
            timeout=180,
        )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    assert "failed=0" in output
