"""Exceptions shared by several components (kept here so that neither side imports the other for them)."""


class ModelLoadError(RuntimeError):
    """A model or tokenizer source could not be loaded (the message says why and what to do)."""
