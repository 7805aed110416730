"""mediaserver: a self-hosted realtime speech inference server."""

__version__ = "0.1.0"
