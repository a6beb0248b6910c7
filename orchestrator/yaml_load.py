"""YAML loading that refuses what PyYAML silently accepts: duplicate keys (the last one would
win and an axis would vanish), YAML 1.1's reading of ``1e-3`` as a string, and explicit tags
(``!!binary``, ``!!set``, ``!!str 3``, ``!custom``: a spec is plain values, lists and mappings,
so a tag can only change what a value silently becomes). An untagged date (``2026-01-01``) is
a string, as in JSON, so the usual type checks see what was written. Merge keys (``<<``) work
as YAML defines them: merged keys are defaults, written keys override them."""

from __future__ import annotations

import re
from typing import Any

import yaml


class DuplicateKeyError(yaml.YAMLError):
    def __init__(self, key: Any, mark: yaml.Mark | None, path: str):
        self.key, self.mark, self.path = key, mark, path
        super().__init__(f"duplicate key {key!r}")


class TagError(yaml.YAMLError):
    """An explicit YAML tag (``!!set``, ``!foo``, ``!``) on a node."""

    def __init__(self, tag: str, mark: yaml.Mark | None):
        self.tag, self.mark = tag, mark
        super().__init__(f"YAML tag {tag!r}")

    @property
    def shown(self) -> str:
        """The tag as it was written (``!!binary``, not ``tag:yaml.org,2002:binary``)."""
        return "!!" + self.tag.removeprefix(_CORE) if self.tag.startswith(_CORE) else self.tag


_CORE = "tag:yaml.org,2002:"


class _StrictLoader(yaml.SafeLoader):
    def compose_node(self, parent, index):
        # Refused before the node is built: an explicit tag picks the constructor (a set, a
        # binary blob, an ordered list of pairs, a Python object) where plain YAML would not.
        event = self.peek_event()
        tag = None if isinstance(event, yaml.AliasEvent) else getattr(event, "tag", None)
        if tag is not None:
            raise TagError(tag, event.start_mark)
        return super().compose_node(parent, index)


# YAML 1.1 requires a dot in floats, so `1e-3` would load as the string "1e-3".
_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
# Dates stay strings (dropped with the float resolver, which is replaced just below).
_StrictLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag not in ("tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp")]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    # Only keys written in this mapping can be duplicates: keys a merge (`<<: *base`) brings
    # in are defaults that a written key overrides, as YAML defines merge keys.
    written = [k for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"]
    seen: set[Any] = set()
    for key_node in written:
        key = loader.construct_object(key_node, deep=deep)
        try:
            if key in seen:
                raise DuplicateKeyError(key, key_node.start_mark, "")
            seen.add(key)
        except TypeError:  # an unhashable key (a list or mapping): the constructor says so
            break
    loader.flatten_mapping(node)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_strict(text: str) -> Any:
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - SafeLoader subclass


class TooLargeError(yaml.YAMLError):
    """YAML whose text, values (aliases counted every time they are used) or nesting pass
    :func:`load_capped`'s caps."""


MAX_CHARS = 8 * 1024 * 1024
MAX_NODES = 1_000_000  # values after alias expansion ("billion laughs" stops here)
MAX_DEPTH = 64


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _measure(root: yaml.Node, max_nodes: int, max_depth: int) -> None:
    """Refuse a node graph whose expansion (an alias counted at every use) has more than
    ``max_nodes`` values or ``max_depth`` levels; the graph is walked once per distinct node
    (sizes memoized), so a bomb costs what its text costs."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        k = id(node)
        if done:
            open_.discard(k)
            kids = _children(node)
            size[k] = 1 + sum(size[id(c)] for c in kids)
            depth[k] = 1 + max((depth[id(c)] for c in kids), default=0)
            if size[k] > max_nodes:
                raise TooLargeError(f"more than {max_nodes:,} values (an alias expanding too far?)")
            if depth[k] > max_depth:
                raise TooLargeError(f"nested deeper than {max_depth} levels")
            continue
        if k in size:
            continue
        open_.add(k)
        stack.append((node, True))
        for c in _children(node):
            if id(c) in open_:
                raise TooLargeError("an alias refers to a value that contains it")
            if id(c) not in size:
                stack.append((c, False))


def load_capped(
    text: str, *, max_chars: int = MAX_CHARS, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH
) -> Any:
    """:func:`load_strict` that also refuses (:class:`TooLargeError`) text longer than
    ``max_chars``, more than ``max_nodes`` values once aliases are expanded, or more than
    ``max_depth`` levels, before anything is built: for YAML read back from storage, which
    may hold what no spec check ever saw."""
    if len(text) > max_chars:
        raise TooLargeError(f"{len(text):,} characters, more than {max_chars:,}")
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _measure(node, max_nodes, max_depth)
        return loader.construct_document(node)
    except RecursionError:
        raise TooLargeError("nested too deep to read") from None
    finally:
        loader.dispose()
