"""Serving one model to other processes on the same host, zero-copy (docs/serving.md).

`omrt serve MODEL.om --socket PATH` (or `Server`, `serve_in_background`) answers clients on a
Unix-domain socket; `Client` sends its memory once as fds and its requests by reference.
Sits over `runtime/`: nothing below imports it.
"""

from .client import Client
from .server import Options, Server, serve_in_background

__all__ = ["Client", "Options", "Server", "serve_in_background"]
