"""The stability suites, installed as the package ``stability.suites``: run them from any repository
with ``pytest --pyargs stability.suites -m stress`` (here also ``pytest suites/``). Their options and
fixtures come from the stability pytest plugin (``stability.plugin.pytest_plugin``), configured by the
repository's ``[tool.stability]`` table."""
