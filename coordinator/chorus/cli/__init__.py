"""The ``chorus`` command line."""
