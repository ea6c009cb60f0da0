"""Moved to ``jupyter_gpubroker.wire.text``: ``memory`` stays here only for ``cli.py``
until the CLI's split into ``cli/`` (h-cli) imports the wire types; remove this module
then."""

from ..wire.text import memory as memory
