"""The job the ``schedule`` part registers: it does nothing, so what is measured is the scheduler."""


def noop(lease) -> None:
    return None
