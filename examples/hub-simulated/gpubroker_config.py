"""DEMO: the GPU broker service's configuration (c.GPUBroker.*), read with --config."""

c = get_config()  # noqa: F821 - defined by the config loader

c.GPUBroker.simulate = "dgx-h100-mig"  # eight simulated H100s, each in seven 1g.10gb slices
c.GPUBroker.lease_ttl = 120
