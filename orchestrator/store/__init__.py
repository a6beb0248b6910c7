"""The result database: models, migrations runner, writers and read-only access."""
