"""The dashboard server's defaults that the command line shows: kept apart from the server
(:mod:`orchestrator.ui.app`), so that every ``orchestrator`` command, which builds the ``ui``
command's help, does not import the server, its analysis layer and pandas at start."""

DEFAULT_PORT = 8270  # next to Ray's dashboard (8265), not on it
# A request's database work is cancelled once it has run this long (a 503).
REQUEST_TIMEOUT_S = 30.0
