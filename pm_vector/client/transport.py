"""The HTTP transport of :class:`~pm_vector.client.http.Client`: bodies in msgpack or JSON
(:mod:`pm_vector.protocol.codec`), answers read by their ``Content-Type``, refusals as
:class:`ServiceError`, and the bytes of every exchange as they travel (:func:`wire_bytes`)."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidInputError, PMVectorError
from ..protocol.codec import JSON, MSGPACK, decode, encode


class ServiceError(PMVectorError):
    """The service refused a request (4xx) or failed (5xx)."""

    def __init__(self, status: int, error: str, message: str):
        super().__init__(f"{status} {error}: {message}")
        self.status, self.error, self.message = status, error, message


def wire_bytes(r) -> tuple[int, int]:
    """``(sent, received)``: the bytes of an HTTP/1.1 exchange (an :class:`httpx.Response`, read)
    as they travel on the connection. Sent: the request line (``METHOD target HTTP/1.1``), every
    header line as sent (``Host``, ``Content-Length``, ``Authorization``, ``Accept`` ... each
    ``name: value`` + CRLF), the blank line and the body. Received: the status line, every header
    line as received, the blank line and the body's bytes as they arrived (before any
    content decoding). Not counted: TCP/IP and TLS framing, and chunk-size lines of a chunked
    answer (the service's answers carry a ``Content-Length``)."""
    req = r.request
    head = len(req.method) + 1 + len(req.url.raw_path) + len(" HTTP/1.1\r\n")
    head += sum(len(k) + 2 + len(v) + 2 for k, v in req.headers.raw) + 2
    sent = head + len(req.content)
    status = len(r.http_version) + 1 + len(str(r.status_code)) + 1 + len(r.reason_phrase.encode("latin-1")) + 2
    received = status + sum(len(k) + 2 + len(v) + 2 for k, v in r.headers.raw) + 2 + r.num_bytes_downloaded
    return sent, received


#: the ``wire`` option of :class:`Client`: the media type bodies are sent in and answers asked for
WIRES = {"msgpack": MSGPACK, "json": JSON}


class Transport:
    """The plumbing of a service client: ``self._http`` (an :class:`httpx.Client`) and
    ``self._media`` (the media type bodies are sent in) are set by the client's ``__init__``."""

    def close(self) -> None:
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, doc: Any = None) -> Any:
        """The answer of one request (``doc``: its body, a document sent in :attr:`wire`)."""
        return self._exchange(method, path, doc)[0]

    def _exchange(self, method: str, path: str, doc: Any = None) -> tuple[Any, int, int]:
        """``(answer, bytes_sent, bytes_received)`` of one request: see :func:`wire_bytes`."""
        kw: dict[str, Any] = {}
        if doc is not None:
            kw = {"content": encode(doc, self._media), "headers": {"Content-Type": self._media}}
        r = self._http.request(method, path, **kw)
        sent, received = wire_bytes(r)
        self.last_exchange = {"path": path, "bytes_sent": sent, "bytes_received": received}
        return self._answer(r), sent, received

    @staticmethod
    def _answer(r) -> Any:
        media = (r.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
        try:
            body = decode(r.content, MSGPACK if media == MSGPACK else JSON) if r.content else None
        except InvalidInputError as exc:
            if r.status_code >= 400:
                raise ServiceError(r.status_code, "error", r.text[:500]) from None
            raise InvalidInputError(f"the service's answer ({media or 'no Content-Type'}) cannot be read: "
                                    f"{exc}") from None
        if r.status_code >= 400:
            if not isinstance(body, dict):
                raise ServiceError(r.status_code, "error", r.text[:500])
            raise ServiceError(r.status_code, str(body.get("error", "error")), str(body.get("message", r.text[:500])))
        return body
