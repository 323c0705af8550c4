"""stability in another repository: its settings table (``settings.py``) and the pytest plugin
(``pytest_plugin.py``, registered through the ``pytest11`` entry point) that runs the stress suites
(``stability.suites``) against the model the table names."""
