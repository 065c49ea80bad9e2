# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# A test callback (tests/integration/test_site_host_tasks.py), not part of the collection: one JSON line per host-task
# into the file $KUBEGPU_HOST_TASKS_FILE. A host-task is what Ansible starts a worker for (v2_runner_on_start: one per
# host and task, a skipped one too, one for a run_once task), which is what Ansible's main process pays for.

from __future__ import annotations

import json
import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: host_tasks
type: aggregate
short_description: One JSON line per host-task started (a test's count)
description:
  - Writes the play, host, task, action and run_once of every host-task Ansible starts a worker for into the file
    named by the environment variable KUBEGPU_HOST_TASKS_FILE.
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "host_tasks"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._play = ""
        self._path = os.environ["KUBEGPU_HOST_TASKS_FILE"]

    def v2_playbook_on_play_start(self, play) -> None:
        self._play = play.get_name()

    def v2_runner_on_start(self, host, task) -> None:
        line = {
            "play": self._play,
            "host": host.get_name(),
            "task": task.get_name(),
            "action": task.action,
            "run_once": bool(task.run_once),
        }
        with open(self._path, "a", encoding="utf-8") as stream:
            stream.write(json.dumps(line) + "\n")
