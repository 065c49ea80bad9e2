#!/usr/bin/python
# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: containerd_config
short_description: Plan and validate containerd's configuration for the NVIDIA runtime
version_added: 0.1.0
description:
  - Works out the files that register C(nvidia-container-runtime) with containerd as a runtime named C(nvidia),
    checks them with the host's own C(containerd config dump), and returns them. It writes nothing; the role
    C(kubegpu.node.container_runtime) writes the files it returns, so that check mode, diff mode, backups and the
    rollback after a failed restart are those of M(ansible.builtin.copy).
  - With O(state=present), the nvidia runtime goes into a drop-in file, and the main configuration's top-level
    C(imports) list is made to name it (the existing list is edited; a second C(imports) key is never written).
    Every other byte of the main file is kept. Without a main file, it starts from C(containerd config default).
  - Config version 2 (containerd 1.6/1.7, and 2.x reading an old file) and version 3 (containerd 2.x) are supported;
    the drop-in carries the main file's version and its plugin names. A file without C(version) (version 1) is refused
    with a message saying how to convert it.
  - containerd 1.x replaces a plugin's whole section with the last imported file that sets it, so there the drop-in
    also carries the CRI plugin settings in effect; containerd 2.x merges key by key and gets only the nvidia keys.
  - The candidate is loaded by containerd from a temporary folder; it must show the nvidia runtime, its
    C(BinaryName), C(SystemdCgroup) and the default runtime as asked, and no other setting may change.
  - With O(state=absent), returns the main file without the import this module added (according to O(record)),
    or no main file at all when the module wrote it from the defaults and nobody changed it since.
author:
  - kubegpu.node maintainers (@kubegpu)
requirements:
  - Python 3.11 or later on the target (C(tomllib)).
  - The C(containerd) binary on the target.
attributes:
  check_mode:
    support: full
    description: The module changes nothing on the host, in check mode or not.
  diff_mode:
    support: none
    description: The role shows the difference when it writes the returned files.
  idempotent:
    support: full
    description: The same host and options give the same files.
options:
  path:
    description: containerd's main configuration file.
    type: path
    default: /etc/containerd/config.toml
  dropin:
    description:
      - The drop-in file that holds the nvidia runtime.
      - An import that already names it (also through a C(*) pattern) is used as it is.
    type: path
    default: /etc/containerd/conf.d/99-nvidia.toml
  record:
    description:
      - JSON file in which the role keeps what it added (the import, a main file written from the defaults).
      - Its current content is read; the module returns the new one in RV(record_content).
    type: path
    required: true
  state:
    description: Whether the nvidia runtime is to be configured or removed again.
    type: str
    choices: [present, absent]
    default: present
  runtime_name:
    description: Name of the runtime in containerd's configuration.
    type: str
    default: nvidia
  runtime_path:
    description: Absolute path of C(nvidia-container-runtime), the runtime's C(BinaryName).
    type: path
    default: /usr/bin/nvidia-container-runtime
  systemd_cgroup:
    description:
      - C(SystemdCgroup) of the runtime. It must match the kubelet's cgroup driver.
      - When not set, the same as the host's C(runc) runtime (else its default runtime) in C(containerd config dump).
    type: bool
  set_as_default:
    description: Make the runtime containerd's default runtime (C(default_runtime_name)).
    type: bool
    default: false
  cdi:
    description:
      - Set C(enable_cdi) and C(cdi_spec_dirs). containerd 1.6 has no CDI support; asking for it there fails.
      - When false, the host's CDI settings are left as they are.
    type: bool
    default: false
  cdi_spec_dirs:
    description: Where CDI specifications are read from, when O(cdi) is true.
    type: list
    elements: path
    default: [/etc/cdi, /var/run/cdi]
  containerd_binary:
    description: The containerd binary (a name looked up in C(PATH), or a path) that is asked for its configuration.
    type: str
    default: containerd
"""

EXAMPLES = r"""
- name: Work out containerd's configuration for the nvidia runtime
  kubegpu.node.containerd_config:
    record: /var/lib/kubegpu/container_runtime/containerd.json
    set_as_default: true
  register: plan

- name: Write the drop-in it returned
  ansible.builtin.copy:
    dest: "{{ plan.dropin }}"
    content: "{{ plan.dropin_content }}"
    mode: "0644"
  when: plan.dropin_content is not none
"""

RETURN = r"""
config_version:
  description: Version of the main configuration (2 or 3); the drop-in has the same.
  returned: when O(state=present)
  type: int
  sample: 2
main_path:
  description: The main configuration file.
  returned: always
  type: str
  sample: /etc/containerd/config.toml
main_before:
  description: The main file's current content; null when there is none.
  returned: always
  type: str
main_content:
  description: What the main file must contain; null when it must not exist.
  returned: always
  type: str
main_mode:
  description: The main file's current mode, or C(0644) when there is none.
  returned: always
  type: str
  sample: "0644"
import_added:
  description: Whether the import of the drop-in is (or will be) one that this module added.
  returned: always
  type: bool
dropin:
  description: The drop-in file.
  returned: always
  type: str
  sample: /etc/containerd/conf.d/99-nvidia.toml
dropin_before:
  description: The drop-in's current content; null when there is none.
  returned: always
  type: str
dropin_content:
  description: What the drop-in must contain; null when it must not exist.
  returned: always
  type: str
record_before:
  description: The record's current content; null when there is none.
  returned: always
  type: str
record_content:
  description: What the record must contain; null when it must not exist.
  returned: always
  type: str
systemd_cgroup:
  description: C(SystemdCgroup) of the runtime in the drop-in.
  returned: when O(state=present)
  type: bool
default_runtime_before:
  description: The default runtime in effect without this module's drop-in.
  returned: when O(state=present)
  type: str
  sample: runc
carries_cri_section:
  description: Whether the drop-in carries the CRI plugin settings in effect (containerd 1.x).
  returned: when O(state=present)
  type: bool
"""

import glob
import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_text
from ansible_collections.kubegpu.node.plugins.module_utils import _containerd_config as cc

HEADER = """\
# Managed by Ansible (kubegpu.node.container_runtime): the {name} runtime for containerd, imported from {main}.
# Run the role with container_runtime_state=absent to remove it; containerd's previous default runtime then returns.
"""

HEADER_1X = """\
# containerd 1.x replaces a plugin's whole section with the last file that sets it, so this file also carries the
# CRI plugin settings in effect without it ({source}). Change those there and run the role again.
"""


def read_text(module: AnsibleModule, path: str) -> str | None:
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        module.fail_json(msg=f"Cannot read {path}: {exc}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        module.fail_json(msg=f"{path} is not UTF-8 text (containerd's TOML must be); it was left untouched")
    return None


class Planner:
    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.params = module.params
        self.main = os.path.normpath(self.params["path"])
        self.dropin = os.path.normpath(self.params["dropin"])
        self.tmp = tempfile.mkdtemp(prefix="containerd-config-", dir=module.tmpdir)

    def fail(self, msg: str, **kwargs) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.module.fail_json(msg=msg, **kwargs)

    def containerd(self, *args: str) -> str:
        binary = self.params["containerd_binary"]
        command = [self.module.get_bin_path(binary, required=True) if "/" not in binary else binary, *args]
        rc, out, err = self.module.run_command(command)
        if rc != 0:
            self.fail(f"'{' '.join(command)}' failed (rc {rc}): {(err or out).strip()}", rc=rc, stdout=out, stderr=err)
        return to_text(out)

    def dump(self, main_text: str, imports: list[str], name: str) -> dict:
        """containerd's merged configuration when `main_text` is the main file and it imports `imports`."""
        candidate = os.path.join(self.tmp, name)
        with open(candidate, "w", encoding="utf-8") as handle:
            handle.write(cc.replace_imports(main_text, imports))
        return cc.loads(self.containerd("--config", candidate, "config", "dump"), f"containerd config dump ({name})")

    def load(self, path: str) -> dict:
        text = read_text(self.module, path)
        if text is None:
            self.fail(f"{path} is imported by containerd's configuration but does not exist")
        return cc.loads(text, path)

    def _current(self) -> tuple:
        """The main file as it is, the role's record as text and parsed, and whether the record is of this setup."""
        main_before = read_text(self.module, self.main)
        record_before = read_text(self.module, self.params["record"])
        record = cc.parse_record(record_before, self.params["record"])
        mine = record.get("dropin") == self.dropin and record.get("path") == self.main
        return main_before, record_before, record, mine

    def present(self) -> dict:
        params = self.params
        main_before, record_before, record, mine = self._current()
        if main_before is None:
            main_text = self.containerd("config", "default")
            created_sha = cc.sha256(main_text)
        else:
            main_text = main_before
            created_sha = record.get("main_created_sha256") if mine else None
        main_doc = cc.loads(main_text, self.main)
        version = cc.config_version(main_doc, self.main)
        imports = cc.imports_of(main_doc, self.main)

        if cc.imports_cover(imports, self.main, self.dropin):
            main_after = main_text
            ours = mine and record.get("import_added") is True and self.dropin in imports
            key_added = ours and record.get("imports_key_added") is True
        else:
            main_after, key_added = cc.add_import(main_text, self.dropin)
            ours = True
        after_doc = cc.loads(main_after, f"{self.main} with the import added")
        after_imports = cc.imports_of(after_doc, self.main)

        base = self.dump(
            main_after, cc.expand_imports(after_imports, self.main, self.dropin, glob.glob, None), "base.toml"
        )
        base_default = cc.default_runtime(base)
        systemd_cgroup = params["systemd_cgroup"]
        if systemd_cgroup is None:
            systemd_cgroup = cc.host_systemd_cgroup(base, params["runtime_name"])
        if params["cdi"] and not cc.supports_cdi(base):
            self.fail(
                "container_runtime_cdi_enabled is true, but this containerd has no CDI support (containerd 1.7 or "
                "later has it; this one does not know enable_cdi). Upgrade containerd or turn CDI off."
            )

        # containerd 1.x dumps version 2 and merges imports plugin section by plugin section.
        carries_section = base.get("version", 2) < 3
        header = HEADER.format(name=params["runtime_name"], main=self.main)
        section_copy = runtimes_in_effect = None
        if carries_section:
            files = cc.files_in_load_order(self.main, after_doc, self.dropin, self.load, glob.glob)
            source, section = cc.section_in_effect(files, cc.CRI_PLUGIN_V2)
            section_copy = section or {}
            runtimes_in_effect = cc.get_path(cc.runtime_section(base), "containerd", "runtimes")
            header += HEADER_1X.format(source=source or "containerd's built-in defaults")
        dropin_doc = cc.build_dropin(
            version=version,
            runtime_name=params["runtime_name"],
            binary=params["runtime_path"],
            systemd_cgroup=systemd_cgroup,
            make_default=params["set_as_default"],
            cdi=params["cdi"],
            cdi_spec_dirs=params["cdi_spec_dirs"],
            section_in_effect_copy=section_copy,
            runtimes_in_effect=runtimes_in_effect,
        )
        dropin_content = header + cc.dumps(dropin_doc)

        trial_dropin = os.path.join(self.tmp, "dropin.toml")
        with open(trial_dropin, "w", encoding="utf-8") as handle:
            handle.write(dropin_content)
        candidate = self.dump(
            main_after,
            cc.expand_imports(after_imports, self.main, self.dropin, glob.glob, trial_dropin),
            "candidate.toml",
        )
        problems = cc.check_candidate(
            base,
            candidate,
            runtime_name=params["runtime_name"],
            binary=params["runtime_path"],
            systemd_cgroup=systemd_cgroup,
            make_default=params["set_as_default"],
            cdi=params["cdi"],
        )
        if problems:
            self.fail(
                f"containerd would not load the nvidia runtime as intended from {self.dropin} (nothing was changed): "
                + "; ".join(problems),
                problems=problems,
                dropin_content=dropin_content,
            )

        record_after = {
            "path": self.main,
            "dropin": self.dropin,
            "import_added": ours,
            "imports_key_added": bool(ours and key_added),
            "main_created_sha256": created_sha,
        }
        return {
            "config_version": version,
            "main_before": main_before,
            "main_content": main_after,
            "import_added": ours,
            "dropin_content": dropin_content,
            "record_before": record_before,
            "record_content": cc.render_record(record_after),
            "systemd_cgroup": systemd_cgroup,
            "default_runtime_before": base_default,
            "carries_cri_section": carries_section,
        }

    def absent(self) -> dict:
        main_before, record_before, record, mine = self._current()
        main_after = main_before
        if main_before is not None and mine and record.get("import_added") is True:
            main_after = cc.remove_import(main_before, self.dropin, record.get("imports_key_added") is True)
            if record.get("main_created_sha256") == cc.sha256(main_after):
                main_after = None
        if main_after is not None:
            doc = cc.loads(main_after, self.main)
            imports = cc.imports_of(doc, self.main)
            # What containerd will load once the drop-in is gone must still be a valid configuration.
            self.dump(main_after, cc.expand_imports(imports, self.main, self.dropin, glob.glob, None), "after.toml")
        return {
            "main_before": main_before,
            "main_content": main_after,
            "import_added": False,
            "dropin_content": None,
            "record_before": record_before,
            "record_content": None,
        }

    def run(self) -> None:
        try:
            result = self.present() if self.params["state"] == "present" else self.absent()
        except cc.ConfigError as exc:
            self.fail(str(exc))
        mode = "0644"
        if os.path.exists(self.main):
            mode = f"{os.stat(self.main).st_mode & 0o7777:04o}"
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.module.exit_json(
            changed=False,
            main_path=self.main,
            main_mode=mode,
            dropin=self.dropin,
            dropin_before=read_text(self.module, self.dropin),
            **result,
        )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/etc/containerd/config.toml"},
            "dropin": {"type": "path", "default": "/etc/containerd/conf.d/99-nvidia.toml"},
            "record": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "runtime_name": {"type": "str", "default": "nvidia"},
            "runtime_path": {"type": "path", "default": "/usr/bin/nvidia-container-runtime"},
            "systemd_cgroup": {"type": "bool"},
            "set_as_default": {"type": "bool", "default": False},
            "cdi": {"type": "bool", "default": False},
            "cdi_spec_dirs": {"type": "list", "elements": "path", "default": ["/etc/cdi", "/var/run/cdi"]},
            "containerd_binary": {"type": "str", "default": "containerd"},
        },
        supports_check_mode=True,
    )
    if not cc.HAS_TOMLLIB:
        module.fail_json(msg="This module needs Python 3.11 or later on the target host (for tomllib).")
    Planner(module).run()


if __name__ == "__main__":
    main()
