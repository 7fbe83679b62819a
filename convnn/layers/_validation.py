"""Argument checks shared by the layer constructors (STYLE §6: the message names the argument and the range)."""


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def check_ratio(name: str, value: float) -> None:
    """Raise ``ValueError`` unless ``0 ≤ value ≤ 1``."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
