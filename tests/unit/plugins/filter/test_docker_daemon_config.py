# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

import base64
import json

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.kubegpu.node.plugins.filter.docker_daemon_config import (
    DaemonConfigError,
    FilterModule,
    docker_daemon_config,
    merge,
    parse,
    render,
)

RUNTIME = "/usr/bin/nvidia-container-runtime"

# A daemon.json as users write them: keys the role must never touch, in the user's order and indentation.
USER_FILE = b"""{
    "data-root": "/srv/docker",
    "log-driver": "json-file",
    "log-opts": {"max-size": "10m", "max-file": "3"},
    "registry-mirrors": ["https://mirror.example.internal"],
    "runtimes": {"crun": {"path": "/usr/bin/crun", "runtimeArgs": ["--debug"]}},
    "default-runtime": "crun",
    "features": {"buildkit": true}
}
"""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def run(data: bytes | None, **kwargs):
    return docker_daemon_config(None if data is None else b64(data), **kwargs)


def user_keys(config: dict) -> dict:
    kept = {k: v for k, v in config.items() if k not in ("runtimes", "default-runtime", "features")}
    kept["crun"] = config["runtimes"]["crun"]
    kept["buildkit"] = config["features"]["buildkit"]
    return kept


def test_registered_as_filter():
    assert FilterModule().filters() == {"docker_daemon_config": docker_daemon_config}


def test_present_merges_and_keeps_every_user_key():
    result = run(USER_FILE)
    assert result["problem"] == ""
    assert result["differs"] is True
    after = json.loads(result["content"])
    assert after["runtimes"]["nvidia"] == {"path": RUNTIME}
    assert after["default-runtime"] == "nvidia"
    assert "cdi" not in after["features"]
    assert user_keys(after) == user_keys(json.loads(USER_FILE))
    assert list(after) == list(json.loads(USER_FILE))
    assert result["record"] == {
        "runtimes.nvidia": {"existed": False, "created_from": 2, "set": {"path": RUNTIME}},
        "default-runtime": {"existed": True, "value": "crun", "set": "nvidia"},
    }


def test_rendering_keeps_the_file_indentation():
    result = run(USER_FILE)
    assert result["content"].startswith('{\n    "data-root": "/srv/docker",\n')
    assert result["content"].endswith("}\n")


def test_new_file_is_created_with_two_space_indentation():
    result = run(None)
    assert result["exists"] is False
    assert result["differs"] is True
    assert result["content"] == (
        '{\n  "runtimes": {\n    "nvidia": {\n      "path": "/usr/bin/nvidia-container-runtime"\n    }\n  },\n'
        '  "default-runtime": "nvidia"\n}\n'
    )


def test_second_run_changes_nothing_and_keeps_the_first_record():
    first = run(USER_FILE)
    second = run(first["content"].encode(), record=first["record"])
    assert second["differs"] is False
    assert second["record"] == first["record"]
    assert second["content"] == first["content"]


def test_formatting_alone_is_no_change():
    compact = json.dumps({"runtimes": {"nvidia": {"path": RUNTIME}}, "default-runtime": "nvidia"}).encode()
    result = run(compact)
    assert result["differs"] is False
    assert result["content"] == compact.decode()


def test_existing_nvidia_runtime_keeps_its_other_keys():
    data = json.dumps({"runtimes": {"nvidia": {"path": "/opt/old", "runtimeArgs": ["--debug"]}}}).encode()
    after = json.loads(run(data, nvidia_default=False)["content"])
    assert after == {"runtimes": {"nvidia": {"path": RUNTIME, "runtimeArgs": ["--debug"]}}}


def test_not_default_leaves_the_default_runtime_alone():
    result = run(USER_FILE, nvidia_default=False)
    assert json.loads(result["content"])["default-runtime"] == "crun"
    assert "default-runtime" not in result["record"]


def test_turning_default_off_later_restores_the_previous_default():
    first = run(USER_FILE)
    second = run(first["content"].encode(), nvidia_default=False, record=first["record"])
    assert second["after"]["default-runtime"] == "crun"
    assert "default-runtime" not in second["record"]


def test_cdi_merges_into_existing_features():
    result = run(USER_FILE, cdi_enabled=True)
    assert result["after"]["features"] == {"buildkit": True, "cdi": True}
    assert result["record"]["features.cdi"] == {"existed": False, "created_from": 2, "set": True}


def test_cdi_number_is_replaced_by_a_boolean():
    result = run(b'{"features": {"cdi": 1}}', nvidia_default=False, cdi_enabled=True)
    assert result["differs"] is True
    assert result["after"]["features"]["cdi"] is True


def test_absent_restores_the_file_as_it_was():
    first = run(USER_FILE, cdi_enabled=True)
    undone = run(first["content"].encode(), state="absent", record=first["record"])
    assert undone["after"] == json.loads(USER_FILE)
    assert undone["record"] == {}
    again = run(undone["content"].encode(), state="absent", record=undone["record"])
    assert again["differs"] is False


def test_absent_removes_objects_the_role_created():
    first = run(b"{}", cdi_enabled=True)
    assert first["after"] == {
        "runtimes": {"nvidia": {"path": RUNTIME}},
        "default-runtime": "nvidia",
        "features": {"cdi": True},
    }
    assert run(first["content"].encode(), state="absent", record=first["record"])["after"] == {}


def test_absent_without_record_removes_runtime_and_a_default_naming_it():
    data = json.dumps({"runtimes": {"nvidia": {"path": RUNTIME}, "crun": {"path": "/c"}}, "default-runtime": "nvidia"})
    result = run(data.encode(), state="absent")
    assert result["after"] == {"runtimes": {"crun": {"path": "/c"}}}


def test_absent_keeps_a_default_the_user_changed_since():
    first = run(USER_FILE)
    edited = dict(first["after"], **{"default-runtime": "runc"})
    result = run(json.dumps(edited).encode(), state="absent", record=first["record"])
    assert result["after"]["default-runtime"] == "runc"
    assert "nvidia" not in result["after"]["runtimes"]


def test_absent_puts_back_a_previous_nvidia_runtime():
    data = json.dumps({"runtimes": {"nvidia": {"path": "/opt/nvidia-old"}}}).encode()
    first = run(data, nvidia_default=False)
    undone = run(first["content"].encode(), state="absent", record=first["record"])
    assert undone["after"] == {"runtimes": {"nvidia": {"path": "/opt/nvidia-old"}}}


def test_absent_on_missing_file_changes_nothing():
    result = run(None, state="absent")
    assert result["exists"] is False
    assert result["differs"] is False


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", 'it is empty, and dockerd refuses an empty daemon.json ("EOF")'),
        (b"  \n", 'it is empty, and dockerd refuses an empty daemon.json ("EOF")'),
        (b'\xef\xbb\xbf{"debug": true}', "it starts with a UTF-8 byte order mark, which dockerd refuses"),
    ],
)
def test_empty_file_and_byte_order_mark_are_refused_as_dockerd_refuses_them(data, problem):
    # dockerd 20.10 says "unable to configure the Docker daemon with file ...: EOF" and "invalid character 'ï'".
    assert run(data)["problem"].startswith(problem)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_standard_numbers_are_refused_naming_the_value(constant):
    # Python's JSON reader accepts them; dockerd does not start with them.
    result = run(f'{{"debug": true, "max-concurrent-downloads": {constant}}}'.encode())
    assert result["problem"] == (
        f"it contains {constant}, which Python's JSON reader accepts but dockerd does not (JSON has no {constant})"
    )
    assert result["content"] is None


@pytest.mark.parametrize("depth", [65, 5000, 200000])
def test_deep_nesting_is_refused_up_front_not_a_crash(depth):
    data = b'{"a":' * depth + b"1" + b"}" * depth
    assert run(data)["problem"].startswith("it is nested more than 64 levels deep")


def test_nesting_that_settings_use_is_fine():
    data = b'{"log-opts": {"labels": "a"}, "x": ' + b"[" * 60 + b"]" * 60 + b"}"
    assert run(data)["problem"] == ""


@pytest.mark.parametrize("data", [b'{"labels": ["\\ud800"]}', b'{"\\udfff": 1}', b'{"a": "\\ud83d x"}'])
def test_lone_surrogates_are_refused_before_anything_is_written(data):
    result = run(data)
    assert result["problem"].startswith("it contains a string that is not valid Unicode")
    assert result["content"] is None


def test_a_pair_of_surrogates_is_a_real_character_and_fine():
    result = run(b'{"labels": ["\\ud83d\\ude00"]}')
    assert result["problem"] == ""
    assert json.loads(result["content"])["labels"] == ["\U0001f600"]


def test_a_value_the_user_set_after_the_role_becomes_the_one_to_restore():
    # runc -> role sets nvidia -> the user sets crun -> role again (nvidia) -> absent must give crun back, not runc.
    original = json.dumps({"default-runtime": "runc"}).encode()
    first = run(original)
    assert first["record"]["default-runtime"]["value"] == "runc"
    by_user = json.dumps(dict(first["after"], **{"default-runtime": "crun"})).encode()
    second = run(by_user, record=first["record"])
    assert second["after"]["default-runtime"] == "nvidia"
    assert second["record"]["default-runtime"] == {"existed": True, "value": "crun", "set": "nvidia"}
    undone = run(second["content"].encode(), state="absent", record=second["record"])
    assert undone["after"]["default-runtime"] == "crun"


def test_a_setting_the_user_removed_after_the_role_is_removed_again_on_absent():
    first = run(json.dumps({"default-runtime": "runc"}).encode())
    without = {k: v for k, v in first["after"].items() if k != "default-runtime"}
    second = run(json.dumps(without).encode(), record=first["record"])
    assert second["record"]["default-runtime"]["existed"] is False
    undone = run(second["content"].encode(), state="absent", record=second["record"])
    assert "default-runtime" not in undone["after"]


@pytest.mark.parametrize(
    ("record_text", "problem"),
    [
        (b"{not json", "it is not valid JSON"),
        (b"[1, 2]", "it holds an array, not a JSON object"),
        (b'"x"', "it holds a string, not a JSON object"),
        (b'{"a": NaN}', "it is not valid JSON (it contains NaN"),
    ],
)
def test_a_damaged_record_is_reported_not_a_raw_error(record_text, problem):
    result = run(USER_FILE, record=b64(record_text))
    assert result["record_problem"].startswith(problem)
    assert result["problem"] == ""
    assert result["content"] is None


def test_the_record_file_content_is_read_as_slurp_returns_it():
    first = run(USER_FILE)
    second = run(first["content"].encode(), record=b64(first["record_content"].encode()))
    assert second["differs"] is False
    assert second["record"] == first["record"]


def test_absent_removes_a_file_the_role_created():
    created = run(None)
    assert created["record"]["daemon.json"] == {"created": True}
    undone = run(created["content"].encode(), state="absent", record=created["record"])
    assert undone["differs"] is True
    assert undone["content"] is None
    assert undone["record_content"] is None


def test_absent_keeps_a_created_file_the_user_added_to():
    created = run(None)
    added = dict(created["after"], debug=True)
    undone = run(json.dumps(added).encode(), state="absent", record=created["record"])
    assert undone["after"] == {"debug": True}
    assert json.loads(undone["content"]) == {"debug": True}


def test_runtime_changes_are_reloadable_features_are_not():
    assert run(USER_FILE)["reloadable"] is True
    assert run(USER_FILE, cdi_enabled=True)["reloadable"] is False
    first = run(USER_FILE)
    # The user's crun stays, so "runtimes" and "default-runtime" remain in the file: a reload applies them.
    assert run(first["content"].encode(), state="absent", record=first["record"])["reloadable"] is True


def test_keys_taken_out_of_the_file_need_a_restart():
    # dockerd's reload keeps the old value of a key the file no longer sets.
    created = run(b"{}")
    undone = run(created["content"].encode(), state="absent", record=created["record"])
    assert undone["after"] == {}
    assert undone["reloadable"] is False
    from_nothing = run(None)
    assert run(from_nothing["content"].encode(), state="absent", record=from_nothing["record"])["reloadable"] is False


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b'{"debug": true,', "it is not valid JSON: Expecting property name enclosed in double quotes at line 1"),
        (b"\xff\xfe{}", "it is not valid UTF-8 (byte 0)"),
        (b"[]", "the top level must be a JSON object, but it is an array"),
        (b"5", "the top level must be a JSON object, but it is a number"),
        (b'{"runtimes": null}', '"runtimes" must be an object, but it is null'),
        (b'{"runtimes": []}', '"runtimes" must be an object, but it is an array'),
        (b'{"runtimes": {"nvidia": 5}}', '"runtimes.nvidia" must be an object, but it is a number'),
        (b'{"runtimes": {"crun": "x"}}', '"runtimes.crun" must be an object, but it is a string'),
        (b'{"default-runtime": true}', '"default-runtime" must be a string, but it is a boolean'),
        (b'{"features": "x"}', '"features" must be an object, but it is a string'),
        (b'{"runtimes": {}, "runtimes": {}}', "the key 'runtimes' appears more than once in the same object"),
    ],
)
def test_malformed_files_are_refused_with_the_problem(data, problem):
    result = run(data)
    assert result["problem"].startswith(problem)
    assert result["differs"] is False
    assert result["content"] is None
    with pytest.raises(DaemonConfigError):
        parse(data)


def test_malformed_file_is_refused_for_absent_too():
    assert run(b'{"runtimes": null}', state="absent")["problem"]


def test_merge_does_not_modify_its_arguments():
    config = {"runtimes": {"nvidia": {"path": "/x"}}}
    record = {"default-runtime": {"existed": False, "created_from": 1, "set": "nvidia"}}
    merge(config, record=record)
    assert config == {"runtimes": {"nvidia": {"path": "/x"}}}
    assert record == {"default-runtime": {"existed": False, "created_from": 1, "set": "nvidia"}}


def test_unknown_state_is_a_programming_error():
    with pytest.raises(ValueError, match="state must be present or absent"):
        merge({}, state="gone")


def test_input_that_is_not_base64_is_a_filter_error():
    with pytest.raises(AnsibleFilterError, match="base64"):
        docker_daemon_config("{not base64}")


def test_render_indents_with_tabs_like_the_original():
    assert render({"a": 1}, b'{\n\t"a": 2\n}') == '{\n\t"a": 1\n}\n'
