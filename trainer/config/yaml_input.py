"""Reading config text: a config file (a regular file of at most MAX_CONFIG_BYTES of UTF-8), its YAML through a
strict loader (no key twice, at most MAX_YAML_VALUES values with aliases expanded, at most MAX_DEPTH levels, plain
data only), and the checks on values no config may hold (`check_plain`). Every refusal names the file or key."""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Mapping
from typing import Any

import yaml

from rwcore.trainer.config.coercion import key_label, show_value

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "MAX_KEY_PARTS",
    "MAX_YAML_VALUES",
    "check_plain",
    "load_yaml",
    "parse_config_text",
    "read_config_text",
    "read_yaml_file",
]


# Bounds on config input (a real config is a few KiB, nests 4 levels and has 19-digit integers at most): past
# them a careless or hostile input would fill memory, hang, or exhaust Python's recursion limit far from the key.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
"""The largest config file `load_config` reads, and the longest override (4 MiB)."""


MAX_DEPTH = 64
"""How many levels lists and mappings may nest (in a file from its top, in a value from its key)."""


MAX_KEY_PARTS = 32
"""The most parts a dotted override key may have (`env.options.a.b` has 4)."""


MAX_INT_DIGITS = 100
"""The longest integer (in digits) read as a number; longer ones are refused as out of range, naming the key."""


class _Refused:
    """A YAML value that is no config value, kept where the value was so that the key holding it can be named:
    a tag other than plain scalars, lists and mappings (!!set, !!binary, !!python/..., a local !tag), a timestamp,
    a scalar that is not what its explicit tag says (!!int abc), an integer of more than MAX_INT_DIGITS digits."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"<{self.reason}>"


_INT_BITS = math.ceil(MAX_INT_DIGITS * math.log2(10))  # the bit length of a MAX_INT_DIGITS-digit integer


def check_plain(key: str, value: Any) -> None:
    """Refuses, naming the key path, what no config value may hold: a value the YAML loader refused (`_Refused`),
    an integer of more than MAX_INT_DIGITS digits (which int64 checks, float() and even str() would choke on), and
    lists or mappings nested more than MAX_DEPTH levels (walked without recursion: a value nested thousands deep
    must be refused, not exhaust Python's stack)."""
    stack = [(key, value, 0)]
    while stack:
        path, item, depth = stack.pop()
        if isinstance(item, _Refused):
            raise ValueError(f"config key {path!r}: {item.reason}")
        if isinstance(item, int) and not isinstance(item, bool) and item.bit_length() > _INT_BITS:
            raise ValueError(
                f"config key {path!r}: an integer of more than {MAX_INT_DIGITS} digits does not fit a 64-bit integer"
            )
        if isinstance(item, Mapping):
            children = [(f"{path}.{key_label(k)}" if path else key_label(k), k, v) for k, v in item.items()]
        elif isinstance(item, (list, tuple)):
            children = [(f"{path}[{i}]", None, v) for i, v in enumerate(item)]
        else:
            continue
        if depth >= MAX_DEPTH:
            raise ValueError(f"config key {path!r}: lists and mappings nest deeper than {MAX_DEPTH} levels")
        for child_path, child_key, child in reversed(children):
            if isinstance(child_key, _Refused):
                raise ValueError(f"config key {child_path!r}: {child_key.reason} (as a key)")
            stack.append((child_path, child, depth + 1))


MAX_YAML_VALUES = 100_000
"""The most values a config text may hold, or stand for once its aliases are expanded (a real config has a few
hundred)."""


_YAML = "tag:yaml.org,2002:"


def _tag_name(tag: str | None) -> str:
    """`tag:yaml.org,2002:set` as `!!set`; a local tag as written."""
    tag = tag or "?"
    return "!!" + tag[len(_YAML) :] if tag.startswith(_YAML) else tag


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML would keep the last silently), a document of
    more than MAX_YAML_VALUES values or whose aliases expand past that (a few hundred bytes can stand for billions),
    and lists and mappings nested more than MAX_DEPTH levels (PyYAML composes them recursively). A value that is no
    config value (see `_Refused`) is loaded as a `_Refused`, refused where its key is known."""

    def __init__(self, stream, prefix: str = "") -> None:
        super().__init__(stream)
        self._prefix = prefix  # the key the document is the value of (an override's), for messages
        self._labels: list[str] = []
        self._depth = 0
        self._nodes = 0

    def _path(self) -> str:
        path = self._prefix
        shown = self._labels[:12]
        for label in shown:
            path = path + label if label.startswith("[") or not path else f"{path}.{label}"
        return path + ("..." if len(self._labels) > len(shown) else "")

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            return super().compose_node(parent, index)
        if parent is None:
            label = None
        elif isinstance(parent, yaml.SequenceNode):
            label = f"[{index}]"
        else:
            label = key_label(index.value) if isinstance(index, yaml.ScalarNode) else "?"
        if label is not None:
            self._labels.append(label)
        collection = self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent)
        try:
            self._nodes += 1
            if self._nodes > MAX_YAML_VALUES:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"it holds more than {MAX_YAML_VALUES} values (a config has a few hundred)",
                    self.peek_event().start_mark,
                )
            if collection:
                self._depth += 1
                if self._depth > MAX_DEPTH:
                    raise yaml.composer.ComposerError(
                        None,
                        None,
                        f"lists and mappings nest deeper than {MAX_DEPTH} levels at {self._path()!r}",
                        self.peek_event().start_mark,
                    )
            return super().compose_node(parent, index)
        finally:
            if collection:
                self._depth -= 1
            if label is not None:
                self._labels.pop()

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # the base class reports an unhashable key
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {show_value(key)} is given twice in one mapping (lines {seen[key] + 1} and "
                    f"{key_node.start_mark.line + 1}); YAML would keep the last silently",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node


def _check_expansion(root) -> None:
    """Counts the values `root` stands for with every alias expanded (each distinct node once, memoized),
    refusing a recursive alias or more than MAX_YAML_VALUES."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[key] = 1
            continue
        children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else list(node.value)
        if children_done:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[key] > MAX_YAML_VALUES:
                raise yaml.composer.ComposerError(
                    None, None, f"its aliases expand to more than {MAX_YAML_VALUES} values", node.start_mark
                )
            continue
        if key in open_nodes:
            raise yaml.composer.ComposerError(None, None, "a recursive alias", node.start_mark)
        open_nodes.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in open_nodes:
                raise yaml.composer.ComposerError(None, None, "a recursive alias", child.start_mark)
            if id(child) not in sizes:
                stack.append((child, False))


def _refuse_tag(loader: yaml.SafeLoader, node: yaml.Node) -> _Refused:
    return _Refused(
        f"the YAML tag {_tag_name(node.tag)} is not allowed (a config holds numbers, strings, booleans, null, lists "
        "and mappings; quote text that starts with '!')"
    )


def _refuse_timestamp(loader: yaml.SafeLoader, node: yaml.Node) -> _Refused:
    return _Refused(
        f"{show_value(node.value)} reads as a YAML timestamp, which a config does not hold (quote it for text)"
    )


def _construct_int(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    digits = sum(ch.isalnum() for ch in str(node.value))
    if digits > MAX_INT_DIGITS:  # before int(): Python refuses over 4300 digits itself, naming nothing
        return _Refused(f"an integer of {digits} digits does not fit a 64-bit integer")
    try:
        return yaml.SafeLoader.construct_yaml_int(loader, node)
    except ValueError:
        return _Refused(f"{show_value(node.value)} is not an integer ({_tag_name(node.tag)})")


def _construct_float(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    try:
        return yaml.SafeLoader.construct_yaml_float(loader, node)
    except ValueError:
        return _Refused(f"{show_value(node.value)} is not a number ({_tag_name(node.tag)})")


def _construct_bool(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    try:
        return yaml.SafeLoader.construct_yaml_bool(loader, node)
    except KeyError:
        return _Refused(f"{show_value(node.value)} is not a boolean ({_tag_name(node.tag)})")


for _tag in ("set", "binary", "omap", "pairs"):
    _StrictLoader.add_constructor(_YAML + _tag, _refuse_tag)
_StrictLoader.add_constructor(None, _refuse_tag)  # every tag SafeLoader has no constructor for (!!python/..., !local)
_StrictLoader.add_constructor(_YAML + "timestamp", _refuse_timestamp)
_StrictLoader.add_constructor(_YAML + "int", _construct_int)
_StrictLoader.add_constructor(_YAML + "float", _construct_float)
_StrictLoader.add_constructor(_YAML + "bool", _construct_bool)


def load_yaml(text: str, prefix: str = "") -> Any:
    """`yaml.safe_load` with the checks of _StrictLoader (`prefix`: the key the text is the value of)."""
    return _load_document(text, prefix)[0]


_TYPED_TAGS = {_YAML + "int", _YAML + "float", _YAML + "bool"}


def _load_document(text: str, prefix: str = "") -> tuple[Any, dict[tuple[Any, Any], str]]:
    """The document of `text` (see `load_yaml`) and the text as typed of every number and boolean at its second
    level, {(section, key): text}: YAML 1.1 reads `0.5_20` as 0.52 and `3.10` as 3.1, and a string field keeps
    what the user typed."""
    loader = _StrictLoader(text, prefix)
    try:
        root = loader.get_single_node()
        texts: dict[tuple[Any, Any], str] = {}
        if isinstance(root, yaml.MappingNode):
            for section, values in root.value:
                if not (isinstance(section, yaml.ScalarNode) and isinstance(values, yaml.MappingNode)):
                    continue
                for key, value in values.value:
                    if isinstance(key, yaml.ScalarNode) and isinstance(value, yaml.ScalarNode):
                        if value.tag in _TYPED_TAGS:
                            texts[(section.value, key.value)] = value.value
        return (loader.construct_document(root) if root is not None else None), texts
    finally:
        loader.dispose()


def read_config_text(path: str | os.PathLike, name: str | None = None) -> str:
    """The text of the config file at `path`: a regular file (or a symlink to one) of at most MAX_CONFIG_BYTES of
    UTF-8. Anything else raises ValueError naming `name` (default "config file 'PATH'"): a FIFO, a device or a
    folder is refused without reading from it, and a larger file from its size."""
    name = name or f"config file {str(path)!r}"
    try:
        # O_NONBLOCK: opening a FIFO would otherwise wait for a writer; fstat then refuses it
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise ValueError(f"{name}: cannot read ({error.strerror or error})") from None
    except ValueError as error:  # a NUL in the path
        raise ValueError(f"{name}: cannot read ({error})") from None
    try:
        info = os.fstat(fd)
        mode = info.st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a folder"
                if stat.S_ISDIR(mode)
                else "a FIFO"
                if stat.S_ISFIFO(mode)
                else "a device"
                if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket or other special file"
            )
            raise ValueError(f"{name}: not a regular file ({kind})")
        if info.st_size > MAX_CONFIG_BYTES:
            raise ValueError(f"{name}: {info.st_size} bytes; a config file holds at most 4 MiB")
        chunks: list[bytes] = []
        size = 0
        # Up to one byte past the bound, not up to st_size: the file may grow while it is read.
        while size <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_CONFIG_BYTES:
            raise ValueError(f"{name}: more than 4 MiB; a config file holds at most 4 MiB")
    except OSError as error:
        raise ValueError(f"{name}: cannot read ({error.strerror or error})") from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{name}: not UTF-8 text (byte {error.start} is {error.object[error.start]:#04x})") from None


_OWN_PROBLEMS = ("given twice", "alias", " values", "nest deeper")


def _yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML error as one line with its line number (PyYAML's own text spans several, quoting the input)."""
    problem = getattr(error, "problem", None)
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f" at line {mark.line + 1}" if mark is not None else ""
    if problem and any(own in problem for own in _OWN_PROBLEMS):
        return f"{problem}{where}"
    what = "; ".join(part for part in (getattr(error, "context", None), problem) if part)
    column = f", column {mark.column + 1}" if mark is not None else ""
    return f"not valid YAML: {what or ' '.join(str(error).split())}{where}{column}"


def parse_config_text(text: str, name: str) -> tuple[Any, dict[tuple[Any, Any], str]]:
    try:
        return _load_document(text)
    except yaml.YAMLError as error:
        raise ValueError(f"{name}: {_yaml_problem(error)}") from None


def read_yaml_file(path: str | os.PathLike, name: str | None = None) -> Any:
    """The YAML document of a config-like file (a run's config.yaml), read and checked as `load_config` reads a
    config file: regular, at most MAX_CONFIG_BYTES, keys once, MAX_YAML_VALUES values, MAX_DEPTH levels, plain
    data only. ValueError names `name` (default "config file 'PATH'") and, where one is at fault, the key."""
    name = name or f"config file {str(path)!r}"
    data, _ = parse_config_text(read_config_text(path, name), name)
    try:
        check_plain("", data)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None
    return data
