"""The SQLAlchemy-backed store: engine setup, statements, schema checks, and the public classes."""
