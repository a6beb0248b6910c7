"""``orchestrator ui``: a read-only web dashboard served straight off the result database.

``db`` holds the queries (read-only engines, the incremental trace cursor), ``app`` the
Starlette routes and pages, ``live`` the terminal view shared by ``submit``/``resume`` and
``status --watch``.
"""
