"""systemd's syntaxes read as systemd reads them: environment files, unit files, Environment= words, ExecStart= and
its expansion. Each rule is checked over exact file text; molecule/kubelet checks the same reading against the real
systemd of Debian 11 (247) and 13 (257)."""

from __future__ import annotations

import pytest
from ansible_collections.kubegpu.node.plugins.plugin_utils import _systemd_syntax as sd

# ---------------------------------------------------------------------------------------------------------------------
# Environment files (systemd.exec(5), EnvironmentFile=)
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # a trailing backslash joins the next line, the newline itself is dropped
        (
            "A=--node-labels=gpu=true \\\n  --feature-gates=DevicePlugins=true\n",
            "--node-labels=gpu=true   --feature-gates=DevicePlugins=true",
        ),
        # double quotes: the shell's escapes (\" \\ \$ \`) are undone, any other backslash is kept
        ('A="say \\"hi\\" \\$HOME \\\\ \\n"\n', 'say "hi" $HOME \\ \\n'),
        # single quotes: everything as written, no escapes, across lines
        ("A='a \\n \"b\"\nc'\n", 'a \\n "b"\nc'),
        # quotes only count at the start of the value; later ones are kept as they are
        ('A=--feature-gates="DevicePlugins=true" --v=2\n', '--feature-gates="DevicePlugins=true" --v=2'),
        # unquoted: a backslash keeps the next character, whitespace around the value goes, interior whitespace stays
        ("A=  a\\ b  c  \n", "a b  c"),
        # no comments after a value
        ("A=x # not a comment\n", "x # not a comment"),
        # quoted parts after a quoted start are joined
        ("A=\"a\" 'b' c\n", "abc"),
        ("A=\n", ""),
        ("A=last line without newline", "last line without newline"),
        ("A = spaced\n", "spaced"),
    ],
)
def test_env_file_values(text, expected):
    assert sd.env_file_values(text) == {"A": expected}


def test_env_file_last_assignment_wins_and_invalid_names_are_dropped():
    text = "A=first\nexport B=1\n9C=2\nA=second\n; a comment\n# another\nno equals sign\n"
    assert sd.env_file_values(text) == {"A": "second"}


def test_env_file_comment_ending_in_a_backslash_swallows_the_next_line_before_systemd_254():
    # systemd/systemd#27975: fixed in 254 (Debian 13 has 257, Debian 11 and 12 have 247 and 252)
    text = "# set by hand \\\nA=1\nB=2\n"
    assert sd.env_file_values(text, 247) == {"B": "2"}
    assert sd.env_file_values(text, 252) == {"B": "2"}
    assert sd.env_file_values(text, 257) == {"A": "1", "B": "2"}
    assert sd.env_file_values(text) == {"A": "1", "B": "2"}


def test_env_file_values_keep_their_spans():
    text = 'X=1\nA="--v=2 --feature-gates=\\"A=true\\""\n'
    (_x, found) = sd.read_env_file(text)
    start, end = found.value.span()
    assert text[start:end] == '--v=2 --feature-gates=\\"A=true\\"'
    assert text[found.start : found.end] == 'A="--v=2 --feature-gates=\\"A=true\\""'
    assert all(found.value.quoted)


def test_quote_env_value_reads_back():
    value = 'a "b" $c `d` \\e'
    assert sd.env_file_values("A=" + sd.quote_env_value(value) + "\n") == {"A": value}


# ---------------------------------------------------------------------------------------------------------------------
# Words (systemd.syntax(7), "Quoting")
# ---------------------------------------------------------------------------------------------------------------------


def words(text, **flags):
    found, complete = sd.extract_words(sd.Text.raw(text), **flags)
    return [w.value for w in found], complete


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('"A=one two" B=three', ["A=one two", "B=three"]),
        ("'A=a\"b' B=\\x41\\s\\t", ['A=a"b', "B=A \t"]),
        ('A="x"y"z w"', ["A=xyz w"]),  # quotes anywhere in a word
        ('"S=--feature-gates=\\"X=true\\""', ['S=--feature-gates="X=true"']),
    ],
)
def test_unit_words_unquote_and_unescape(text, expected):
    assert words(text, cunescape=True) == (expected, True)


def test_an_invalid_escape_or_unbalanced_quote_stops_environment_words():
    assert words("A=1 B=\\q C=3", cunescape=True) == (["A=1"], False)
    assert words('A=1 "B=2', cunescape=True) == (["A=1"], False)


def test_command_line_split_removes_quotes_and_takes_backslashes_literally():
    value = '--feature-gates="DevicePlugins=true" --node-labels=\'a=b c\' x\\ y \\n "unclosed'
    assert words(value, cunescape=False, relax=True) == (
        ["--feature-gates=DevicePlugins=true", "--node-labels=a=b c", "x y", "n", "unclosed"],
        True,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Unit files and ExecStart=
# ---------------------------------------------------------------------------------------------------------------------

PROBE_UNIT = r"""[Unit]
Description=probe ; not a comment here
[Service]
Type=oneshot
Environment="M=one two" N=three 'O=fo"ur' P=a\x20b
Environment=Q=%%literal R=%n
; a comment
Environment="S=--feature-gates=\"X=true\""
ExecStart=/usr/bin/python3 /probe.py $A ${C} --lit="q r" ${I}x $M $N $O $P $Q $R $S \
   # a comment inside the continued line is skipped
   $H $$x "$N" $UNSET ${UNSET}
"""
PROBE_ENV = "A=a1 'a 2'\nC=c c\nI=ii\nH=h\nN=from-the-file\n"


def test_unit_file_continuation_comments_and_sections():
    settings = sd.read_unit_file(PROBE_UNIT)
    assert [(s.section, s.key) for s in settings] == [
        ("Unit", "Description"),
        ("Service", "Type"),
        ("Service", "Environment"),
        ("Service", "Environment"),
        ("Service", "Environment"),
        ("Service", "ExecStart"),
    ]
    assert settings[0].value.value == "probe ; not a comment here"
    assert settings[-1].value.value.endswith('$S     $H $$x "$N" $UNSET ${UNSET}')


def test_service_environment_and_command_as_systemd_expands_them():
    service = sd.read_service([("/probe.service", PROBE_UNIT)], "probe.service")
    env = service.env_values()
    env.update({k: sd.Value(v, "/probe.env") for k, v in {a.key: a.value for a in sd.read_env_file(PROBE_ENV)}.items()})
    expansion = sd.expand_command(service.command, env)
    assert [a.value for a in expansion.args] == [
        "/usr/bin/python3",
        "/probe.py",
        "a1",
        "a 2",
        "c c",  # ${C}: the value as it is, one argument
        "--lit=q r",
        "iix",
        "one",
        "two",
        "from-the-file",  # an environment file overrides Environment=
        "four",
        "a",
        "b",
        "%literal",
        "probe.service",
        "--feature-gates=X=true",
        "h",
        "$x",
        "from-the-file",
        "",  # ${UNSET}: one empty argument; $UNSET: none
    ]
    assert expansion.used == ["A", "M", "N", "O", "P", "Q", "R", "S", "H", "N", "UNSET"]


def test_empty_assignments_reset_and_the_last_exec_start_counts():
    unit = "[Service]\nEnvironment=A=1\nExecStart=/bin/old $A\n"
    dropin = "[Service]\nEnvironment=\nEnvironment=B=2\nExecStart=\nExecStart=-/bin/new $B\n"
    service = sd.read_service([("/u", unit), ("/d", dropin)], "x.service")
    assert [w.value for w in service.command.words] == ["/bin/new", "$B"]
    assert list(service.env_values()) == ["B"]
    assert service.command.path == "/d"


def test_args_keep_the_span_they_are_written_in():
    unit = '[Service]\nEnvironment="E=--v=2 --feature-gates=A=true"\nExecStart=/k --x=1 \\\n  $E\n'
    service = sd.read_service([("/u", unit)], "k.service")
    args = sd.expand_command(service.command, service.env_values()).args
    assert [(a.value, unit[a.start : a.end], a.source) for a in args[1:]] == [
        ("--x=1", "--x=1", None),
        ("--v=2", "--v=2", "E"),
        ("--feature-gates=A=true", "--feature-gates=A=true", "E"),
    ]


def test_quote_unit_word_reads_back():
    value = 'E=a "b" \\c %n\ttab'
    unit = "[Service]\nEnvironment=" + sd.quote_unit_word(value) + "\nExecStart=/x\n"
    service = sd.read_service([("/u", unit)], "k.service")
    assert service.environment[0].value.value == value[2:]


def test_unbalanced_quotes_in_exec_start_are_refused():
    with pytest.raises(sd.SyntaxProblem, match="unbalanced"):
        sd.read_service([("/u", '[Service]\nExecStart=/k "--x\n')], "k.service")
