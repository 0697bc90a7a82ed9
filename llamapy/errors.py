"""The base of llamapy's typed errors; each layer raises a subclass with a message that says what and where."""


class LlamapyError(Exception):
    """Base class of llamapy's own errors (the CLI prints them as one line)."""
