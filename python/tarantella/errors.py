"""The error Tarantella raises for a misuse (a module of its own, so that
every module can raise it without importing the runtime)."""


class TarantellaError(RuntimeError):
    """A misuse of Tarantella: the message says what to change."""
