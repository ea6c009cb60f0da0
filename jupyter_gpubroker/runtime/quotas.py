"""``c.GPUBroker.quotas_file``: shares and quotas an admin keeps in a file, applied at
every start (the entities it names are reset to it)."""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path

import yaml

from ..broker.budgets import Quota
from ..broker.core import Broker
from ..broker.models import check_name
from ..wire.errors import InvalidRequest


def apply_quotas_file(core: Broker, path: Path) -> None:
    """Set every quota ``path`` names; a file that does not read as one says where."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise InvalidRequest(f"cannot read quotas file {path}: {e}") from None
    if not isinstance(data, dict) or set(data) - {"users", "groups"}:
        raise InvalidRequest(f"quotas file {path}: top-level keys are 'users' and 'groups'")
    for section, kind in (("users", "user"), ("groups", "group")):
        entries = data.get(section) or {}
        if not isinstance(entries, dict):
            raise InvalidRequest(f"quotas file {path}: '{section}' needs a mapping of names")
        for name, values in entries.items():
            check_name(str(name), kind)
            if not isinstance(values, dict):
                raise InvalidRequest(f"quotas file {path}: {kind} {name!r} needs a mapping")
            if unknown := sorted(set(map(str, values)) - SETTINGS):
                raise InvalidRequest(
                    f"quotas file {path}: {kind} {name!r}: {_unknown(unknown)}; "
                    f"a quota's settings are {', '.join(sorted(SETTINGS))}"
                )
            core.set_quota(kind, str(name), Quota(**values))


SETTINGS = {f.name for f in dataclasses.fields(Quota)}


def _unknown(names: list[str]) -> str:
    """The unknown settings in words, with the known one each may be a typo of."""
    said = []
    for name in names:
        close = difflib.get_close_matches(name, SETTINGS, n=1)
        said.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    return f"no setting {' or '.join(said)}"
