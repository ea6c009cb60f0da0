"""What the fronts share with the core, and nothing else of it: sizes and the bounds of
every amount (``sizes``), the API's errors with their codes and statuses (``errors``),
the words people read (``text``), the API's instants as ISO 8601 text (``times``) and
the MIG profiles a size may name (``profiles``); ``traits`` holds the settings' number
traits to the same check (it imports traitlets, so only the fronts and the runtime import
it, never the core).

The core imports these, and so do the fronts (the kernel's ``%gpu``, the client, the
CLI, the hub's spawner and pages), which import no module of ``broker`` (DESIGN: "a
front imports no core module"); nothing here imports anything of the package outside it.
"""
