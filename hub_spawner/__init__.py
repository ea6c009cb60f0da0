"""JupyterHub integration for jupyter-gpubroker.

``service``: the broker as a hub-managed service (``jupyter gpubroker service``), one
broker for every user of the hub, serving the broker API through HubAuth and the
``custom:gpubroker:*`` scopes. ``spawner``: the GPU spawner (``GPUBrokerSpawnerMixin``,
``GPUBrokerSpawner``), a GPU or MIG slice for a user's whole server from that service,
with ``options`` (what a user may ask for, the options form) and ``culling`` (idle GPU
servers' warnings and stops on the hub's pages). ``pages``: the service's "My GPUs" and
admin pages. ``hubauth``: the scopes and the hub identity they share. ``configure(c, ...)``
(``hubconfig``): all of it in a hub's config in one call.
"""

from hub_spawner.hubconfig import configure

__all__ = ["configure"]
