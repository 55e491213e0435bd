"""gunicorn settings `provisiond serve` adds: the boot-step log line, written after the body.

Flask cannot see the end of a body gunicorn sends with sendfile, so the line is written from
gunicorn's post_request hook, with the size gunicorn sent.
"""

from provisiond.api.services import log_sent


def post_request(worker, req, environ, resp) -> None:
    if resp is None:
        return
    # gunicorn's sendfile path does not count into `sent`: then the length is what went out.
    log_sent(environ, resp.status_code, resp.sent or resp.response_length)
