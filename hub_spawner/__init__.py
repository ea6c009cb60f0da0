"""JupyterHub integration for jupyter-gpubroker.

``service``: the broker as a hub-managed service (``jupyter gpubroker service``), one
broker for every user of the hub, serving the broker API through HubAuth and the
``custom:gpubroker:*`` scopes. The GPU spawner mixins and the hub pages come next.
"""
