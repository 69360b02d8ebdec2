"""What the ``agents-memory`` command does, as plain async functions.

Two layers, as in Flask-Migrate: these functions take a :class:`Target` and
keyword options and return data (or raise a typed error that names the next
step); ``agents_memory._cli`` only parses arguments, calls them and renders
the results. Nothing here prints.
"""
