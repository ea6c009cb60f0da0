"""The broker core: every decision about who gets which GPU, and when.

Imports nothing from Jupyter, tornado, JupyterHub or NVML; time and hardware
are injected (see DESIGN.md, "One core").
"""
