"""Sphinx configuration: the documentation site, MyST Markdown in the pydata theme.

Built in CI with warnings as errors (``.ci/docs``): a link to a page or heading that
does not exist fails the build.
"""

project = "jupyter-gpubroker"
author = "the jupyter-gpubroker developers"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "screenshot.py"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links, checked at build time
myst_enable_extensions = ["colon_fence"]
html_theme = "pydata_sphinx_theme"
html_title = "jupyter-gpubroker"
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2}
nitpicky = True
# The checks in CI cannot reach the web (only package registries are reachable there):
# the link check follows every link inside the site and skips the external ones.
linkcheck_ignore = [r"https?://(?!127\.0\.0\.1|localhost)"]
