"""Streams: a WebSocket per session (``/v1/models/{name}/stream``), one step per message, on the act use case."""
