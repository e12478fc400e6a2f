"""Alembic's entry point: migrate on the connection flctl.migrations hands over (no URL of its own)."""

from alembic import context

from flctl.migrations import VERSION_TABLE

connection = context.config.attributes["connection"]
context.configure(connection=connection, version_table=VERSION_TABLE,
                  render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
