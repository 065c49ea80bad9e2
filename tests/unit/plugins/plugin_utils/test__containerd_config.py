"""Unit tests for the pure helpers behind kubegpu.node.containerd_config (no host, no containerd needed).

The sample files are what Debian ships (/etc/containerd/config.toml of containerd 1.6.20, 1.7.24 and 2.1.9 is the same
version 2 file) and excerpts of `containerd config dump` from those versions.
"""

from __future__ import annotations

import pytest
import tomllib
from ansible_collections.kubegpu.node.plugins.plugin_utils import _containerd_config as cc

DROPIN = "/etc/containerd/conf.d/99-nvidia.toml"
MAIN = "/etc/containerd/config.toml"
NVIDIA = "/usr/bin/nvidia-container-runtime"

DEBIAN_CONFIG = """\
version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
"""

# The head of `containerd config default` on 1.6 and 1.7: an empty imports list that must be edited, not repeated.
DEFAULT_16_HEAD = """\
disabled_plugins = []
imports = []
oom_score = 0
plugin_dir = ""
required_plugins = []
root = "/var/lib/containerd"
state = "/run/containerd"
temp = ""
version = 2

[cgroup]
  path = ""
"""

# The head of `containerd config default` on 2.1: version 3, single-quoted strings.
DEFAULT_21_HEAD = """\
version = 3
root = '/var/lib/containerd'
state = '/run/containerd'
temp = ''
disabled_plugins = []
required_plugins = []
oom_score = 0
imports = []

[grpc]
  address = '/run/containerd/containerd.sock'
"""


def dump_v2(runc_systemd=False, default="runc", extra_runtimes=None, cdi=None, sandbox="registry.k8s.io/pause:3.6"):
    """A trimmed `containerd config dump` of containerd 1.x."""
    cri = {
        "sandbox_image": sandbox,
        "containerd": {
            "default_runtime_name": default,
            "runtimes": {
                "runc": {
                    "runtime_type": "io.containerd.runc.v2",
                    "options": {"BinaryName": "", "SystemdCgroup": runc_systemd},
                },
                **(extra_runtimes or {}),
            },
        },
        "registry": {"config_path": ""},
    }
    if cdi is not None:  # containerd 1.7 dumps enable_cdi; 1.6 does not know it
        cri["enable_cdi"] = cdi
        cri["cdi_spec_dirs"] = ["/etc/cdi", "/var/run/cdi"]
    return {"version": 2, "imports": [MAIN], "plugins": {cc.CRI_PLUGIN_V2: cri}}


def dump_v3(runc_systemd=False, default="runc"):
    """A trimmed `containerd config dump` of containerd 2.x."""
    return {
        "version": 3,
        "imports": [],
        "plugins": {
            cc.CRI_RUNTIME_PLUGIN_V3: {
                "enable_cdi": True,
                "cdi_spec_dirs": ["/etc/cdi", "/var/run/cdi"],
                "containerd": {
                    "default_runtime_name": default,
                    "runtimes": {
                        "runc": {"runtime_type": "io.containerd.runc.v2", "options": {"SystemdCgroup": False}}
                    },
                },
            },
            "io.containerd.cri.v1.images": {"pinned_images": {"sandbox": "registry.k8s.io/pause:3.10"}},
        },
    }


# --- editing the imports key ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "after"),
    [
        # Debian's file has no imports key: one line after `version`.
        (DEBIAN_CONFIG, DEBIAN_CONFIG.replace("version = 2\n", f'version = 2\nimports = ["{DROPIN}"]\n')),
        # containerd 1.6/1.7 default: the empty list is filled in, never a second key.
        (DEFAULT_16_HEAD, DEFAULT_16_HEAD.replace("imports = []", f'imports = ["{DROPIN}"]')),
        (DEFAULT_21_HEAD, DEFAULT_21_HEAD.replace("imports = []", f'imports = ["{DROPIN}"]')),
        ('imports = ["/a.toml"]  # mine\nversion = 2\n', f'imports = ["/a.toml", "{DROPIN}"]  # mine\nversion = 2\n'),
        ('imports = ["/a.toml",]\n', f'imports = ["/a.toml", "{DROPIN}",]\n'),
        (
            'version = 2\nimports = [\n  "/a.toml", # first\n  "/b.toml",\n]\n',
            f'version = 2\nimports = [\n  "/a.toml", # first\n  "/b.toml",\n  "{DROPIN}",\n]\n',
        ),
        # Strings holding ] and # must not end the list early.
        ("imports = ['/x]#y.toml']\n", f"imports = ['/x]#y.toml', \"{DROPIN}\"]\n"),
        # No version line: the key goes first, where top-level keys belong.
        ("[plugins]\n", f'imports = ["{DROPIN}"]\n[plugins]\n'),
        # A version line without a final newline.
        ("version = 3", f'version = 3\nimports = ["{DROPIN}"]'),
    ],
)
def test_add_import_keeps_every_other_byte_and_remove_import_undoes_it(before, after):
    text, key_added = cc.add_import(before, DROPIN)
    assert text == after
    assert DROPIN in tomllib.loads(text)["imports"]
    assert cc.remove_import(text, DROPIN, key_added) == before


def test_add_import_ignores_imports_inside_tables_and_multiline_strings():
    text = 'version = 2\nnote = """\nimports = []\n"""\n[plugins.x]\nimports = ["/not/top/level"]\n'
    new, key_added = cc.add_import(text, DROPIN)
    assert key_added
    assert tomllib.loads(new)["imports"] == [DROPIN]
    assert tomllib.loads(new)["plugins"]["x"]["imports"] == ["/not/top/level"]


def test_add_import_refuses_an_imports_key_that_is_not_a_list():
    with pytest.raises(cc.ConfigError, match="not a list"):
        cc.add_import('imports = "/a.toml"\n', DROPIN)


def test_remove_import_leaves_a_user_import_alone():
    text = f'imports = ["/a.toml", "{DROPIN}"]\n'
    assert cc.remove_import(text, "/other.toml", False) == text
    assert cc.remove_import(text, DROPIN, False) == 'imports = ["/a.toml"]\n'
    assert cc.remove_import(f'imports = ["{DROPIN}", "/a.toml"]\n', DROPIN, False) == 'imports = ["/a.toml"]\n'


def test_remove_import_keeps_a_key_it_did_not_add():
    assert cc.remove_import(f'imports = ["{DROPIN}"]\n', DROPIN, False) == "imports = []\n"
    assert cc.remove_import(f'version = 2\nimports = ["{DROPIN}"]\n', DROPIN, True) == "version = 2\n"


def test_replace_imports_gives_one_key():
    text = cc.replace_imports('version = 2\nimports = [\n  "a",\n  "b"]\n[x]\ny = 1\n', ["/1", "/2"])
    assert tomllib.loads(text) == {"version": 2, "imports": ["/1", "/2"], "x": {"y": 1}}
    assert tomllib.loads(cc.replace_imports("version = 3\n", ["/1"]))["imports"] == ["/1"]


# --- versions and imports -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("doc", "version"), [({"version": 2}, 2), ({"version": 3}, 3)])
def test_config_version(doc, version):
    assert cc.config_version(doc, MAIN) == version


def test_config_version_1_is_refused_with_a_way_out():
    with pytest.raises(cc.ConfigError, match="containerd config migrate"):
        cc.config_version({"plugins": {"cri": {}}}, MAIN)
    with pytest.raises(cc.ConfigError, match="not supported"):
        cc.config_version({"version": 4}, MAIN)
    with pytest.raises(cc.ConfigError, match="must be a number"):
        cc.config_version({"version": "2"}, MAIN)


@pytest.mark.parametrize(
    ("pattern", "covered"),
    [
        (DROPIN, True),
        ("/etc/containerd/conf.d/*.toml", True),
        ("conf.d/*.toml", True),  # relative to the main file's folder
        ("/etc/containerd/*.toml", False),  # '*' does not cross '/'
        ("/etc/containerd/conf.d/*.conf", False),
        ("/etc/containerd/conf.d/9?-nvidia.toml", False),  # without '*', containerd takes the name literally
    ],
)
def test_imports_cover(pattern, covered):
    assert cc.imports_cover([pattern], MAIN, DROPIN) is covered


def test_expand_imports_leaves_out_or_replaces_the_dropin_in_containerd_order():
    def glob(pattern):
        assert pattern == "/etc/containerd/conf.d/*.toml"
        return ["/etc/containerd/conf.d/50-user.toml", DROPIN, "/etc/containerd/conf.d/10-first.toml"]

    imports = ["/etc/containerd/conf.d/*.toml", "extra.toml"]
    assert cc.expand_imports(imports, MAIN, DROPIN, glob, None) == [
        "/etc/containerd/conf.d/10-first.toml",
        "/etc/containerd/conf.d/50-user.toml",
        "/etc/containerd/extra.toml",
    ]
    assert cc.expand_imports(imports, MAIN, DROPIN, glob, "/tmp/try.toml") == [
        "/etc/containerd/conf.d/10-first.toml",
        "/etc/containerd/conf.d/50-user.toml",
        "/tmp/try.toml",
        "/etc/containerd/extra.toml",
    ]


def test_expand_imports_places_a_dropin_that_does_not_exist_yet():
    assert cc.expand_imports(["conf.d/*.toml"], MAIN, DROPIN, lambda pattern: [], "/tmp/try.toml") == ["/tmp/try.toml"]
    assert cc.expand_imports([DROPIN], MAIN, DROPIN, lambda pattern: [], None) == []


def test_section_in_effect_is_the_last_file_that_sets_it():
    files = [
        (MAIN, {"plugins": {cc.CRI_PLUGIN_V2: {"sandbox_image": "a"}}}),
        ("/etc/containerd/conf.d/10.toml", {"debug": {"level": "warn"}}),
        ("/etc/containerd/conf.d/50.toml", {"plugins": {cc.CRI_PLUGIN_V2: {"registry": {"config_path": "/c"}}}}),
    ]
    assert cc.section_in_effect(files, cc.CRI_PLUGIN_V2) == (files[2][0], {"registry": {"config_path": "/c"}})
    assert cc.section_in_effect(files[:2], cc.CRI_PLUGIN_V2) == (MAIN, {"sandbox_image": "a"})
    assert cc.section_in_effect(files[1:2], cc.CRI_PLUGIN_V2) == (None, None)


def test_files_in_load_order_follows_nested_imports_once():
    docs = {
        "/etc/containerd/a.toml": {"imports": ["b.toml", "/etc/containerd/config.toml"]},
        "/etc/containerd/b.toml": {},
    }
    main_doc = {"imports": ["a.toml", DROPIN]}
    order = cc.files_in_load_order(MAIN, main_doc, DROPIN, docs.__getitem__, lambda pattern: [])
    assert [entry[0] for entry in order] == [MAIN, "/etc/containerd/a.toml", "/etc/containerd/b.toml"]


# --- what the host has, what the drop-in says -----------------------------------------------------------------------


def test_host_systemd_cgroup_follows_runc():
    assert cc.host_systemd_cgroup(dump_v2(runc_systemd=True)) is True
    assert cc.host_systemd_cgroup(dump_v2(runc_systemd=False)) is False
    assert cc.host_systemd_cgroup(dump_v3()) is False


def test_host_systemd_cgroup_falls_back_to_the_default_runtime_then_false():
    crun = {"crun": {"options": {"SystemdCgroup": True}}}
    dump = dump_v2(default="crun", extra_runtimes=crun)
    del dump["plugins"][cc.CRI_PLUGIN_V2]["containerd"]["runtimes"]["runc"]
    assert cc.host_systemd_cgroup(dump) is True
    del dump["plugins"][cc.CRI_PLUGIN_V2]["containerd"]["runtimes"]["crun"]
    assert cc.host_systemd_cgroup(dump) is False


def test_a_dump_without_the_cri_plugin_is_an_error():
    with pytest.raises(cc.ConfigError, match="no CRI plugin"):
        cc.runtime_section({"version": 2, "plugins": {}})


def test_supports_cdi_only_from_containerd_1_7():
    assert not cc.supports_cdi(dump_v2())  # 1.6
    assert cc.supports_cdi(dump_v2(cdi=False))  # 1.7
    assert cc.supports_cdi(dump_v3())


def test_build_dropin_for_containerd_2_holds_only_the_nvidia_keys():
    doc = cc.build_dropin(3, "nvidia", NVIDIA, True, True, False, [])
    assert doc == {
        "version": 3,
        "plugins": {
            cc.CRI_RUNTIME_PLUGIN_V3: {
                "containerd": {
                    "runtimes": {
                        "nvidia": {
                            "runtime_type": "io.containerd.runc.v2",
                            "options": {"BinaryName": NVIDIA, "SystemdCgroup": True},
                        }
                    },
                    "default_runtime_name": "nvidia",
                }
            }
        },
    }


def test_build_dropin_for_a_version_2_file_uses_the_old_plugin_name():
    doc = cc.build_dropin(2, "nvidia", NVIDIA, False, False, True, ["/etc/cdi"])
    section = doc["plugins"][cc.CRI_PLUGIN_V2]
    assert doc["version"] == 2
    assert "default_runtime_name" not in section["containerd"]
    assert section["enable_cdi"] is True
    assert section["cdi_spec_dirs"] == ["/etc/cdi"]


def test_build_dropin_for_containerd_1_carries_the_section_and_the_runtimes_in_effect():
    user = {"sandbox_image": "example.com/pause:9", "registry": {"config_path": "/etc/containerd/certs.d"}}
    in_effect = dump_v2()["plugins"][cc.CRI_PLUGIN_V2]["containerd"]["runtimes"]
    doc = cc.build_dropin(2, "nvidia", NVIDIA, False, True, False, [], user, in_effect)
    section = doc["plugins"][cc.CRI_PLUGIN_V2]
    assert section["sandbox_image"] == "example.com/pause:9"
    assert section["registry"] == {"config_path": "/etc/containerd/certs.d"}
    # A runtimes table replaces containerd 1.x's built-in runc: it must be written out too.
    assert set(section["containerd"]["runtimes"]) == {"runc", "nvidia"}
    assert user == {"sandbox_image": "example.com/pause:9", "registry": {"config_path": "/etc/containerd/certs.d"}}


def test_build_dropin_for_containerd_1_keeps_the_users_own_runtimes():
    user = {"containerd": {"runtimes": {"runc": {"options": {"SystemdCgroup": True}}}}}
    doc = cc.build_dropin(2, "nvidia", NVIDIA, True, True, False, [], user, {"runc": {}, "kata": {}})
    assert set(doc["plugins"][cc.CRI_PLUGIN_V2]["containerd"]["runtimes"]) == {"runc", "nvidia"}


def test_dumps_round_trips_through_tomllib():
    doc = {
        "version": 2,
        "title": 'quote " backslash \\ tab \t newline \n bell \x07',
        "plugins": {
            "io.containerd.grpc.v1.cri": {
                "n": 1,
                "f": 1.5,
                "flag": False,
                "dirs": ["/a", "/b"],
                "nested": [[1, 2], ["x"]],
                "inline": [{"a": 1}, {"b": "c"}],
                "empty": {},
                "registry": {"mirrors": {"docker.io": {"endpoint": ["https://m.example"]}}},
            },
        },
        "proxy_plugins": {"p": [{"name": "x"}, {"name": "y"}]},
    }
    assert tomllib.loads(cc.dumps(doc)) == doc


# --- checking a candidate's merged configuration --------------------------------------------------------------------


def with_nvidia(dump, systemd=False, default=None, binary=NVIDIA):
    section = cc.runtime_section(dump)
    section["containerd"]["runtimes"]["nvidia"] = cc.nvidia_runtime(binary, systemd)
    if default:
        section["containerd"]["default_runtime_name"] = default
    return dump


def test_check_candidate_accepts_exactly_the_intended_change():
    assert (
        cc.check_candidate(dump_v2(), with_nvidia(dump_v2(), default="nvidia"), "nvidia", NVIDIA, False, True, False)
        == []
    )
    assert cc.check_candidate(dump_v3(), with_nvidia(dump_v3()), "nvidia", NVIDIA, False, False, False) == []


def test_check_candidate_sees_a_dropin_that_is_not_in_effect():
    problems = cc.check_candidate(dump_v2(), dump_v2(), "nvidia", NVIDIA, False, True, False)
    assert any("runtimes.nvidia is not in effect" in p for p in problems)
    assert any("default_runtime_name is 'runc', not 'nvidia'" in p for p in problems)


def test_check_candidate_sees_wrong_values():
    candidate = with_nvidia(dump_v2(), systemd=True, binary="/wrong")
    problems = cc.check_candidate(dump_v2(), candidate, "nvidia", NVIDIA, False, False, False)
    assert any("BinaryName is '/wrong'" in p for p in problems)
    assert any("SystemdCgroup is True, not False" in p for p in problems)


def test_check_candidate_sees_lost_user_settings():
    # What containerd 1.x does with a drop-in that sets only the nvidia runtime: the user's CRI settings are gone.
    base = dump_v2(sandbox="example.com/pause:9")
    problems = cc.check_candidate(base, with_nvidia(dump_v2()), "nvidia", NVIDIA, False, False, False)
    assert problems == [
        f"plugins.{cc.CRI_PLUGIN_V2}.sandbox_image would change from 'example.com/pause:9' "
        "to 'registry.k8s.io/pause:3.6'"
    ]


def test_check_candidate_requires_cdi_when_asked():
    problems = cc.check_candidate(
        dump_v2(cdi=False), with_nvidia(dump_v2(cdi=False)), "nvidia", NVIDIA, False, False, True
    )
    assert any("enable_cdi is False" in p for p in problems)


# --- the record -----------------------------------------------------------------------------------------------------


def test_record_round_trip_and_errors():
    record = {"dropin": DROPIN, "import_added": True}
    assert cc.parse_record(cc.render_record(record), "r.json") == record
    assert cc.parse_record(None, "r.json") == {}
    with pytest.raises(cc.ConfigError, match="not valid JSON"):
        cc.parse_record("{", "r.json")
    with pytest.raises(cc.ConfigError, match="JSON object"):
        cc.parse_record("[]", "r.json")


def test_loads_names_the_file_in_its_error():
    with pytest.raises(cc.ConfigError, match=r"/etc/containerd/config\.toml is not valid TOML"):
        cc.loads("imports = []\nimports = []\n", MAIN)
