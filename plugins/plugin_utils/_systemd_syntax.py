# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private helper of this collection's actions, not a public API: it can change at any time.
#
# systemd's own syntaxes read as systemd reads them, written from its documentation and checked against its source:
# - unit files (systemd.syntax(7): sections, `key=value`, a trailing backslash joins the next line and becomes a space,
#   comment lines inside a continued line are skipped; src/shared/conf-parser.c);
# - words of a setting (systemd.syntax(7) "Quoting": quotes anywhere in a word, C escapes; src/basic/extract-word.c
#   extract_first_word() with EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE), as Environment= and ExecStart= take them
#   (systemd.exec(5) Environment=, systemd.service(5) "Command lines"; src/core/load-fragment.c);
# - environment files (systemd.exec(5) EnvironmentFile=: unquoted values with backslash escapes and continuations,
#   single and double quotes, comments; src/basic/env-file.c parse_env_file_internal(); since v254 a comment ending in
#   a backslash no longer swallows the next line, systemd/systemd#27975);
# - the expansion of ExecStart= at start: `$NAME` as a word of its own is the variable's value split at whitespace
#   with quotes removed (and no C escapes), `${NAME}` inside a word is the value as it is, `$$` is `$`
#   (src/basic/env-util.c replace_env_argv(), strv_split_full(EXTRACT_RELAX|EXTRACT_UNQUOTE)).
#
# Every decoded character keeps the span of file text it was read from, so that a caller can change one value and
# keep every other byte of the file.

from __future__ import annotations

import re
from dataclasses import dataclass, field

WHITESPACE = " \t\n\r"
NEWLINE = "\n\r"
COMMENTS = "#;"
SHELL_NEED_ESCAPE = '"\\`$'
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# The systemd release from which a comment line ending in a backslash no longer continues onto the next line of an
# environment file (systemd/systemd#27975, fixed in v254).
COMMENT_CONTINUATION_FIXED = 254


class SyntaxProblem(ValueError):
    """Text that systemd itself would refuse (or ignore with a warning) at that place."""


# ---------------------------------------------------------------------------------------------------------------------
# Text that remembers where each of its characters came from
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    """A decoded string; for each character, the [start, end) span of file text it was decoded from and whether it
    was written inside quotes."""

    value: str = ""
    starts: tuple[int, ...] = ()
    ends: tuple[int, ...] = ()
    quoted: tuple[bool, ...] = ()

    @classmethod
    def raw(cls, text: str, offset: int = 0) -> Text:
        """File text as it is (each character its own span)."""
        positions = tuple(range(offset, offset + len(text)))
        return cls(text, positions, tuple(p + 1 for p in positions), (False,) * len(text))

    def __len__(self) -> int:
        return len(self.value)

    def __getitem__(self, item: slice) -> Text:
        return Text(self.value[item], self.starts[item], self.ends[item], self.quoted[item])

    def span(self) -> tuple[int, int]:
        """The file text this whole string was read from (empty strings have none)."""
        if not self.value:
            raise ValueError("an empty string has no span")
        return self.starts[0], self.ends[-1]


class _Builder:
    def __init__(self) -> None:
        self.chars: list[str] = []
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.quoted: list[bool] = []

    def add(self, char: str, start: int, end: int, quoted: bool = False) -> None:
        self.chars.append(char)
        self.starts.append(start)
        self.ends.append(end)
        self.quoted.append(quoted)

    def extend(self, text: Text) -> None:
        self.chars.extend(text.value)
        self.starts.extend(text.starts)
        self.ends.extend(text.ends)
        self.quoted.extend(text.quoted)

    def truncate(self, length: int) -> None:
        del self.chars[length:], self.starts[length:], self.ends[length:], self.quoted[length:]

    def __len__(self) -> int:
        return len(self.chars)

    def build(self) -> Text:
        return Text("".join(self.chars), tuple(self.starts), tuple(self.ends), tuple(self.quoted))


def env_name_is_valid(name: str) -> bool:
    """A variable name systemd passes on (letters, digits and underscores, not starting with a digit)."""
    return bool(ENV_NAME.match(name))


# ---------------------------------------------------------------------------------------------------------------------
# Environment files (EnvironmentFile=)
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnvAssignment:
    """One `KEY=value` of an environment file: the raw span [start, end) runs from the key to the end of its line."""

    key: str
    value: Text
    start: int
    end: int


def read_env_file(text: str, systemd_version: int | None = None) -> list[EnvAssignment]:
    """Every assignment of an environment file in order, as systemd's parser reads it (a later one of the same key
    wins; keys that are not valid variable names are dropped, as systemd drops them when it starts the service).

    `systemd_version`: the node's systemd (a comment line ending in a backslash swallowed the next line before 254);
    None reads as the newest systemd.
    """
    comment_swallows_next = systemd_version is not None and systemd_version < COMMENT_CONTINUATION_FIXED
    found: list[EnvAssignment] = []
    state = "PRE_KEY"
    key: list[str] = []
    key_start = 0
    last_key_whitespace: int | None = None
    value = _Builder()
    last_value_whitespace: int | None = None
    escape_at = 0

    def push(end: int) -> None:
        name = "".join(key[:last_key_whitespace] if last_key_whitespace is not None else key)
        if env_name_is_valid(name):
            found.append(EnvAssignment(name, value.build(), key_start, end))

    index = 0
    for index, char in enumerate(text):
        if state == "PRE_KEY":
            if char in COMMENTS:
                state = "COMMENT"
            elif char not in WHITESPACE:
                state = "KEY"
                key = [char]
                key_start = index
                last_key_whitespace = None
        elif state == "KEY":
            if char in NEWLINE:
                state = "PRE_KEY"
            elif char == "=":
                state = "PRE_VALUE"
                value = _Builder()
                last_value_whitespace = None
            else:
                if char not in WHITESPACE:
                    last_key_whitespace = None
                elif last_key_whitespace is None:
                    last_key_whitespace = len(key)
                key.append(char)
        elif state == "PRE_VALUE":
            if char in NEWLINE:
                state = "PRE_KEY"
                push(index)
            elif char == "'":
                state = "SINGLE_QUOTE_VALUE"
            elif char == '"':
                state = "DOUBLE_QUOTE_VALUE"
            elif char == "\\":
                state = "VALUE_ESCAPE"
                escape_at = index
            elif char not in WHITESPACE:
                state = "VALUE"
                value.add(char, index, index + 1)
        elif state == "VALUE":
            if char in NEWLINE:
                state = "PRE_KEY"
                if last_value_whitespace is not None:
                    value.truncate(last_value_whitespace)
                push(index)
            elif char == "\\":
                state = "VALUE_ESCAPE"
                escape_at = index
                last_value_whitespace = None
            else:
                if char not in WHITESPACE:
                    last_value_whitespace = None
                elif last_value_whitespace is None:
                    last_value_whitespace = len(value)
                value.add(char, index, index + 1)
        elif state == "VALUE_ESCAPE":
            state = "VALUE"
            if char not in NEWLINE:  # an escaped newline is eaten up entirely: the value continues on the next line
                value.add(char, escape_at, index + 1)
        elif state == "SINGLE_QUOTE_VALUE":
            if char == "'":
                state = "PRE_VALUE"
            else:
                value.add(char, index, index + 1, quoted=True)
        elif state == "DOUBLE_QUOTE_VALUE":
            if char == '"':
                state = "PRE_VALUE"
            elif char == "\\":
                state = "DOUBLE_QUOTE_VALUE_ESCAPE"
                escape_at = index
            else:
                value.add(char, index, index + 1, quoted=True)
        elif state == "DOUBLE_QUOTE_VALUE_ESCAPE":
            state = "DOUBLE_QUOTE_VALUE"
            if char in SHELL_NEED_ESCAPE:
                value.add(char, escape_at, index + 1, quoted=True)
            elif char != "\n":  # like a shell, any other escaped character keeps its backslash
                value.add("\\", escape_at, index, quoted=True)
                value.add(char, index, index + 1, quoted=True)
        elif state == "COMMENT":
            if char == "\\":
                state = "COMMENT_ESCAPE"
            elif char in NEWLINE:
                state = "PRE_KEY"
        elif state == "COMMENT_ESCAPE":
            state = "COMMENT" if comment_swallows_next or char not in NEWLINE else "PRE_KEY"
    if state in ("PRE_VALUE", "VALUE", "VALUE_ESCAPE", "SINGLE_QUOTE_VALUE", "DOUBLE_QUOTE_VALUE"):
        if state == "VALUE" and last_value_whitespace is not None:
            value.truncate(last_value_whitespace)
        push(len(text))
    elif state == "DOUBLE_QUOTE_VALUE_ESCAPE":
        push(len(text))
    return found


def env_file_values(text: str, systemd_version: int | None = None) -> dict[str, str]:
    """The variables an environment file sets (the last assignment of a key wins)."""
    return {item.key: item.value.value for item in read_env_file(text, systemd_version)}


def quote_env_value(value: str) -> str:
    """A value written so that systemd's environment-file parser reads it back exactly (double-quoted)."""
    return '"' + "".join("\\" + c if c in SHELL_NEED_ESCAPE else c for c in value) + '"'


# ---------------------------------------------------------------------------------------------------------------------
# Words (extract_first_word)
# ---------------------------------------------------------------------------------------------------------------------

_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "s": " ",
}


def _cunescape_one(text: str, index: int) -> tuple[str, int] | None:
    """The C escape starting at text[index] (after the backslash) and its length; None when systemd refuses it."""
    char = text[index] if index < len(text) else ""
    if char in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[char], 1
    digits = {"x": (16, 2), "u": (16, 4), "U": (16, 8)}.get(char)
    if digits:
        base, count = digits
        chunk = text[index + 1 : index + 1 + count]
        if len(chunk) != count or not all(c in "0123456789abcdefABCDEF" for c in chunk):
            return None
        number = int(chunk, base)
        if number == 0 or number > 0x10FFFF:
            return None
        return chr(number), count + 1
    if char and char in "01234567":
        chunk = text[index : index + 3]
        if len(chunk) != 3 or not all(c in "01234567" for c in chunk):
            return None
        number = int(chunk, 8)
        return (chr(number), 3) if number else None
    return None


@dataclass(frozen=True)
class Word:
    """One word: its decoded text, and the raw span [start, end) it was written in (quotes included)."""

    text: Text
    start: int
    end: int

    @property
    def value(self) -> str:
        return self.text.value


def extract_words(
    source: Text,
    *,
    cunescape: bool,
    relax: bool = False,
    cunescape_relax: bool = False,
) -> tuple[list[Word], bool]:
    """The whitespace-separated words of `source` with quotes removed anywhere in a word (EXTRACT_UNQUOTE), C escapes
    decoded when `cunescape` (otherwise a backslash takes the next character as it is). Returns the words and whether
    all of it could be read: systemd stops at an invalid escape or an unbalanced quote (unless `relax`: then the word
    ends there; `cunescape_relax`: an unknown escape is kept with its backslash)."""
    value = source.value
    words: list[Word] = []
    index = 0
    length = len(value)
    while True:
        while index < length and value[index] in WHITESPACE:
            index += 1
        if index >= length:
            return words, True
        begin = index
        built = _Builder()
        quote = ""
        while index < length:
            char = value[index]
            if quote:
                if char == quote:
                    quote = ""
                    index += 1
                    continue
            elif char in "'\"":
                quote = char
                index += 1
                continue
            elif char in WHITESPACE:
                break
            if char == "\\":
                if index + 1 >= length:
                    if cunescape_relax and (not quote or relax):
                        built.add("\\", source.starts[index], source.ends[index], bool(quote))
                        index += 1
                        break
                    if relax:
                        index += 1
                        break
                    return words, False
                if cunescape:
                    decoded = _cunescape_one(value, index + 1)
                    if decoded is None:
                        if not cunescape_relax:
                            return words, False
                        built.add("\\", source.starts[index], source.ends[index], bool(quote))
                        built.add(value[index + 1], source.starts[index + 1], source.ends[index + 1], bool(quote))
                        index += 2
                        continue
                    char_out, used = decoded
                    built.add(char_out, source.starts[index], source.ends[index + used], bool(quote))
                    index += 1 + used
                    continue
                built.add(value[index + 1], source.starts[index], source.ends[index + 1], bool(quote))
                index += 2
                continue
            built.add(char, source.starts[index], source.ends[index], bool(quote))
            index += 1
        if quote and not relax:
            return words, False
        words.append(Word(built.build(), source.starts[begin], source.ends[index - 1]))


# ---------------------------------------------------------------------------------------------------------------------
# Specifiers (%n, %N, %p, %i, ... and %%), for the few systemd resolves from the unit's own name
# ---------------------------------------------------------------------------------------------------------------------


def unit_specifiers(unit: str) -> dict[str, str]:
    """The specifiers that follow from the unit's name alone (systemd.unit(5), "Specifiers")."""
    name = unit
    prefix, _sep, rest = name.partition("@")
    stem = name.rsplit(".", 1)[0]
    instance = rest.rsplit(".", 1)[0] if "@" in name else ""
    prefix = prefix.rsplit(".", 1)[0] if "@" not in name else prefix
    return {
        "%": "%",
        "n": name,
        "N": stem,
        "p": prefix,
        "P": prefix,
        "i": instance,
        "I": instance,
        "j": prefix.rsplit("-", 1)[-1],
        "J": prefix.rsplit("-", 1)[-1],
    }


def resolve_specifiers(text: Text, specifiers: dict[str, str]) -> Text:
    """`text` with each known %-specifier replaced (an unknown one is kept as it is written)."""
    if "%" not in text.value:
        return text
    built = _Builder()
    index = 0
    while index < len(text):
        char = text.value[index]
        if char == "%" and index + 1 < len(text) and text.value[index + 1] in specifiers:
            start, end = text.starts[index], text.ends[index + 1]
            for produced in specifiers[text.value[index + 1]]:
                built.add(produced, start, end, text.quoted[index])
            index += 2
            continue
        built.add(char, text.starts[index], text.ends[index], text.quoted[index])
        index += 1
    return built.build()


# ---------------------------------------------------------------------------------------------------------------------
# Unit files
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UnitSetting:
    """One `Key=value` line of a unit file: the value (after the `=`, whitespace around it stripped) keeps its raw
    spans across continued lines; [line_start, line_end) is the whole logical line (up to its final newline)."""

    section: str
    key: str
    value: Text
    line_start: int
    line_end: int


def _strip(text: Text) -> Text:
    value = text.value
    left = len(value) - len(value.lstrip(WHITESPACE))
    right = len(value.rstrip(WHITESPACE))
    return text[left:right] if right > left else Text()


def read_unit_file(text: str) -> list[UnitSetting]:
    """The settings of a unit file (or drop-in) in order, as systemd's configuration parser reads them."""
    settings: list[UnitSetting] = []
    section = ""
    continuation: _Builder | None = None
    continuation_start = 0
    offset = 0
    for raw_line in text.split("\n"):
        line_start = offset
        offset += len(raw_line) + 1
        line = raw_line[:-1] if raw_line.endswith("\r") else raw_line
        stripped = line.lstrip(WHITESPACE)
        if stripped[:1] and stripped[0] in COMMENTS:
            continue  # a comment line, also inside a continued line (the continued line goes on after it)
        joined = continuation or _Builder()
        if continuation is None:
            continuation_start = line_start
        for position, char in enumerate(line):
            joined.add(char, line_start + position, line_start + position + 1)
        escaped = False
        for char in joined.chars:
            escaped = (not escaped) and char == "\\"
        if escaped:
            joined.chars[-1] = " "  # the backslash becomes a space and the next line is joined on
            continuation = joined
            continue
        continuation = None
        logical = _strip(joined.build())
        line_end = min(offset - 1, len(text))
        if not logical.value or logical.value[0] in COMMENTS:
            continue
        if logical.value.startswith("[") and logical.value.endswith("]"):
            section = logical.value[1:-1]
            continue
        if "=" not in logical.value:
            continue  # systemd warns ("Missing '='") and skips the line
        cut = logical.value.index("=")
        settings.append(
            UnitSetting(section, _strip(logical[:cut]).value, _strip(logical[cut + 1 :]), continuation_start, line_end)
        )
    if continuation is not None and continuation.chars:
        logical = _strip(continuation.build())
        if "=" in logical.value and not logical.value.startswith("["):
            cut = logical.value.index("=")
            key, value = _strip(logical[:cut]).value, _strip(logical[cut + 1 :])
            settings.append(UnitSetting(section, key, value, continuation_start, len(text)))
    return settings


@dataclass(frozen=True)
class EnvDefinition:
    """A variable set by `Environment=` in a unit file: the word `NAME=value` spans [start, end) of the file."""

    name: str
    value: Text
    path: str
    start: int
    end: int
    word_quoted: bool


def environment_words(setting: UnitSetting, path: str, specifiers: dict[str, str]) -> list[EnvDefinition]:
    """The assignments of one `Environment=` line (systemd.exec(5): each word is `NAME=value`; quote a whole word
    that holds spaces; C escapes and specifiers are resolved; a word that is not an assignment is ignored; an invalid
    escape or unbalanced quote ends the line, the words before it count)."""
    words, _complete = extract_words(setting.value, cunescape=True)
    found: list[EnvDefinition] = []
    for word in words:
        resolved = resolve_specifiers(word.text, specifiers)
        name, sep, _rest = resolved.value.partition("=")
        if not sep or not env_name_is_valid(name):
            continue
        found.append(
            EnvDefinition(
                name=name,
                value=resolved[len(name) + 1 :],
                path=path,
                start=word.start,
                end=word.end,
                word_quoted=any(word.text.quoted),
            )
        )
    return found


def quote_unit_word(value: str) -> str:
    """A word written so that systemd reads it back exactly in a unit file (double-quoted, C-escaped, `%` doubled)."""
    escapes = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "%": "%%"}
    return '"' + "".join(escapes.get(c, c) for c in value) + '"'


# ---------------------------------------------------------------------------------------------------------------------
# A service's command line, and how it is expanded at start
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """ExecStart= as systemd keeps it: the words after prefixes and specifiers; `expand` false for the `:` prefix."""

    words: list[Word]
    path: str
    expand: bool
    setting: UnitSetting


def parse_exec(setting: UnitSetting, path: str, specifiers: dict[str, str]) -> Command:
    """One ExecStart= line (systemd.service(5), "Command lines"). Raises SyntaxProblem where systemd refuses it."""
    words, complete = extract_words(setting.value, cunescape=True, cunescape_relax=True)
    if not complete:
        raise SyntaxProblem(f"{path}: unbalanced quoting in ExecStart={setting.value.value}")
    if not words:
        raise SyntaxProblem(f"{path}: ExecStart= names no command")
    first = words[0]
    prefix = len(first.value) - len(first.value.lstrip("-@:+!"))
    flags = first.value[:prefix]
    words = [Word(first.text[prefix:], first.start, first.end), *words[1:]]
    if "@" in flags:
        words = words[1:]  # the next word is argv[0]; the path itself is not passed
    resolved = []
    for word in words:
        if word.value == ";":
            break  # a further command (only Type=oneshot allows several); the kubelet's is the first
        resolved.append(Word(resolve_specifiers(word.text, specifiers), word.start, word.end))
    return Command(words=resolved, path=path, expand=":" not in flags, setting=setting)


@dataclass(frozen=True)
class Arg:
    """One argument the service is started with, and where its text is written: `path` and the raw span
    [start, end) in it (None: it cannot be edited in place, e.g. it is built from ${NAME} inside a word).
    `source`: the variable it comes from (None: ExecStart itself)."""

    value: str
    path: str | None
    start: int
    end: int
    source: str | None


@dataclass
class Expansion:
    """The service's arguments after systemd expanded ExecStart= with its environment."""

    args: list[Arg] = field(default_factory=list)
    used: list[str] = field(default_factory=list)  # variables referenced as words of their own ($NAME), in order


@dataclass(frozen=True)
class Value:
    """A variable's value and where it is written (`path`: an environment file or a unit file)."""

    text: Text
    path: str


def split_value(value: Text) -> list[Word]:
    """A variable's value split as systemd splits `$NAME` in a command line (whitespace, quotes removed, a backslash
    takes the next character as it is; an unbalanced quote or trailing backslash ends the word)."""
    words, _complete = extract_words(value, cunescape=False, relax=True)
    return words


def _replace_env(word: Word, env: dict[str, Value]) -> str:
    """A word with ${NAME} replaced by the value as it is and `$$` by `$` (a braceless $NAME inside a word stays)."""
    text = word.value
    out: list[str] = []
    index = 0
    while index < len(text):
        if text.startswith("$$", index):
            out.append("$")
            index += 2
        elif text.startswith("${", index) and "}" in text[index + 2 :]:
            close = text.index("}", index + 2)
            found = env.get(text[index + 2 : close])
            out.append(found.text.value if found else "")
            index = close + 1
        else:
            out.append(text[index])
            index += 1
    return "".join(out)


def expand_command(command: Command, env: dict[str, Value]) -> Expansion:
    """The arguments systemd starts the service with (argv[0] included)."""
    expansion = Expansion()
    for word in command.words:
        text = word.value
        if command.expand and text.startswith("$") and text[1:2] not in ("{", "$"):
            name = text[1:]
            expansion.used.append(name)
            found = env.get(name) if env_name_is_valid(name) else None
            if found is None:
                continue  # an unset variable gives no argument at all
            for part in split_value(found.text):
                expansion.args.append(Arg(part.value, found.path, part.start, part.end, name))
            continue
        if command.expand and "$" in text:
            replaced = _replace_env(word, env)
            editable = replaced == text
            expansion.args.append(Arg(replaced, command.path if editable else None, word.start, word.end, None))
            continue
        expansion.args.append(Arg(text, command.path, word.start, word.end, None))
    return expansion


# ---------------------------------------------------------------------------------------------------------------------
# A service from its unit file and drop-ins
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class Service:
    """What the [Service] sections of a unit and its drop-ins (in systemd's order) add up to."""

    command: Command | None
    environment: list[EnvDefinition]  # in order; a later definition of a name wins
    exec_count: int = 0

    def env_values(self) -> dict[str, Value]:
        return {item.name: Value(item.value, item.path) for item in self.environment}


def read_service(files: list[tuple[str, str]], unit: str) -> Service:
    """ExecStart= and Environment= of a service, read from its files in the order systemd reads them (the unit
    file, then each drop-in): an empty assignment resets what came before, a later one wins."""
    specifiers = unit_specifiers(unit)
    commands: list[Command] = []
    environment: list[EnvDefinition] = []
    for path, text in files:
        for setting in read_unit_file(text):
            if setting.section != "Service":
                continue
            if setting.key == "ExecStart":
                if not setting.value.value:
                    commands = []
                else:
                    commands.append(parse_exec(setting, path, specifiers))
            elif setting.key == "Environment":
                if not setting.value.value:
                    environment = []
                else:
                    environment.extend(environment_words(setting, path, specifiers))
    return Service(command=commands[-1] if commands else None, environment=environment, exec_count=len(commands))


def show_properties(text: str) -> dict[str, str]:
    """`systemctl show UNIT --property=...` output (KEY=VALUE lines) as a mapping; other lines are ignored."""
    properties: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            properties[key.strip()] = value.strip()
    return properties
