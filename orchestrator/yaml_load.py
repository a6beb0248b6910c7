"""YAML loading that refuses what PyYAML silently accepts: duplicate keys (the last one would
win and an axis would vanish) and YAML 1.1's reading of ``1e-3`` as a string. Merge keys
(``<<``) work as YAML defines them: merged keys are defaults, written keys override them."""

from __future__ import annotations

import re
from typing import Any

import yaml


class DuplicateKeyError(yaml.YAMLError):
    def __init__(self, key: Any, mark: yaml.Mark | None, path: str):
        self.key, self.mark, self.path = key, mark, path
        super().__init__(f"duplicate key {key!r}")


class _StrictLoader(yaml.SafeLoader):
    pass


# YAML 1.1 requires a dot in floats, so `1e-3` would load as the string "1e-3".
_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_StrictLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:float"]
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
