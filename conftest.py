"""Root conftest: loads deepgemm's pytest plugins (options: see `pytest --help`, group deepgemm)."""
pytest_plugins = ["deepgemm.testing.plugin", "deepgemm.testing.benchplugin"]
