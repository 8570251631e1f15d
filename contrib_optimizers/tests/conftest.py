"""The kit tzrec-run gives plugin authors: fresh plugin managers, config checks, tiny runs."""

pytest_plugins = ["tzrun.testing"]
