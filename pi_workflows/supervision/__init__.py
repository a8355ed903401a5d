"""Child-process supervision: spawning, start identities, signals, child channels."""

__all__: list[str] = []
