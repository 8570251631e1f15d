pytest_plugins = ["tzrun.testing"]
