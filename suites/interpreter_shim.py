"""Placeholder: the Triton-interpreter shim is being written (see the foundation issue, item 5)."""


def install() -> None:
    pass
