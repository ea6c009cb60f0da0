"""Moved to ``jupyter_gpubroker.wire.errors``: these names stay here only for ``cli.py``
and ``usage_cli.py`` until the CLI's split into ``cli/`` (h-cli) imports the wire types;
remove this module then."""

from ..wire.errors import BrokerError as BrokerError
from ..wire.errors import InvalidRequest as InvalidRequest
