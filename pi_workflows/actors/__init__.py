"""The server's pykka actors, one module each (workflow-server.md § Process model)."""

__all__: list[str] = []
