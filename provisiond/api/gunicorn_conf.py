"""gunicorn settings `provisiond serve` adds: the boot-step log line and the request's
metrics, written after the body, and gunicorn's own lines in provisiond's log format.

Flask cannot see the end of a body gunicorn sends with sendfile, so both are written from
gunicorn's post_request hook, with the size gunicorn sent.
"""

from gunicorn.glogging import Logger

from provisiond.api.metrics import observe_request
from provisiond.api.services import log_sent
from provisiond.boot.logs import flush_logs, setup_logging_from_env


class ProvisiondLogger(Logger):
    """gunicorn's logger with its lines ("Booting worker", errors) sent through provisiond's
    handler: one line each, with the level, as text or JSON like every other line."""

    def setup(self, cfg) -> None:
        super().setup(cfg)
        setup_logging_from_env()


logger_class = ProvisiondLogger


def pre_fork(server, worker) -> None:
    # A worker inherits the arbiter's log buffer: written now, it is not written twice.
    flush_logs()


def post_request(worker, req, environ, resp) -> None:
    if resp is None:
        return
    # gunicorn's sendfile path does not count into `sent`: then the length is what went out.
    sent = resp.sent or resp.response_length
    log_sent(environ, resp.status_code, sent)
    observe_request(environ, resp.status_code, sent)
