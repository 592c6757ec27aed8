"""A local HTTP server on a free port that hands every POST to one function: what the tests'
receivers (a webhook destination, a job's notify_url) are built on."""

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def serve_posts(handle: Callable[[BaseHTTPRequestHandler], None]) -> ThreadingHTTPServer:
    """Started in a daemon thread; `shutdown()` and `server_close()` it when done."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            handle(self)

        def log_message(self, format, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server
