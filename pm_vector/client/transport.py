"""The HTTP transport of :class:`~pm_vector.client.http.Client`: bodies in msgpack or JSON
(:mod:`pm_vector.protocol.codec`), answers read by their ``Content-Type``, refusals as
:class:`~pm_vector.errors.ServiceError`, and the bytes of every exchange as they travel
(:func:`wire_bytes`).

The server may be hostile, so nothing it sends is trusted before it is bounded:

* **bytes**: every answer is streamed and refused (:class:`~pm_vector.errors.MalformedAnswerError`)
  as soon as it passes its byte cap -- :func:`answer_cap` of the published shape for a resolve,
  :attr:`Transport.max_document_bytes` (default :data:`DEFAULT_MAX_DOCUMENT_BYTES`, 64 MiB, set it on
  a client to change it) for any other answer -- or declares a ``Content-Length`` above it;
* **encodings**: the client asks for ``Accept-Encoding: identity`` and refuses an answer in any
  other ``Content-Encoding`` (a 1 MB gzip body may expand to gigabytes);
* **objects**: the body is decoded by :func:`~pm_vector.protocol.codec.decode_bounded`, at most
  one list or map per :data:`BYTES_PER_CONTAINER` bytes of the cap (:func:`answer_bounds`);
* **time**: one deadline per exchange, the client's ``timeout`` from connecting to the last
  byte read, and the same ``timeout`` for all the exchanges of one query together (counted from
  its start): a server that trickles its answers byte by byte is cut off at the deadline
  (``httpx.ReadTimeout``), not per read;
* **status**: every non-2xx answer (a 3xx redirect too: it is not followed) is one
  :class:`~pm_vector.errors.ServiceError`; a 2xx answer that is not a map of the protocol a
  :class:`~pm_vector.errors.MalformedAnswerError`, and so is a raw ``KeyError``, ``IndexError``,
  ``TypeError`` ... raised while a query reads an answer (:meth:`Transport._query_scope`);
* **charges**: a query charged before its request leaves and failing with ``ConnectError``,
  ``ConnectTimeout`` or ``PoolTimeout`` while no byte of the request was written (the transport
  counts what it writes) is withdrawn from the ledger, and its draw is discarded with the
  request; any other failure keeps the charge (the ledger over-counts, never under-counts);
* **run**: inside one query every GET is asked once and its answer kept, so a server that
  reports another active run on every GET cannot make one query fetch the anchor document
  again (the run changing under a query is refused:
  :class:`~pm_vector.errors.ServiceError` ``run_changed``, by
  :meth:`~pm_vector.client.public_documents.PublicDocuments._check_run`).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx

from ..errors import InvalidInputError, MalformedAnswerError, PMVectorError, ServiceError
from ..protocol.codec import JSON, MSGPACK, TooLargeError, decode_bounded, encode
from ..protocol.location import payload_wire_bytes

__all__ = ["BYTES_PER_CONTAINER", "DEFAULT_MAX_DOCUMENT_BYTES", "PAYLOAD_ALLOWANCE", "ServiceError", "Transport",
           "WIRES", "answer_bounds", "answer_cap", "wire_bytes"]

#: the byte cap of an answer whose shape is not published (anchor documents, collections, jobs)
DEFAULT_MAX_DOCUMENT_BYTES = 64 << 20
#: an answer may hold one list or map per this many bytes of its cap (a legitimate answer's
#: containers are rows, candidates' payloads and JSON matrices' rows: far larger than this)
BYTES_PER_CONTAINER = 64
#: bytes a resolve answer may carry per candidate for its payload when the collection does not
#: publish its ``max_payload_bytes`` (16 x the default bound of 256, as escaped JSON at worst)
PAYLOAD_ALLOWANCE = 4096
#: bytes a resolve answer may carry per candidate besides its payload, codes and features
#: (id, external id, label, score, distance and their keys)
CANDIDATE_OVERHEAD = 512
#: bytes of a resolve answer besides its rows (run id, codes' digest, answer kind, ...)
ANSWER_OVERHEAD = 64 << 10


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


def answer_cap(request: dict, k: int, *, code_bytes: int | None = None, n_features: int | None = None,
               payload_bytes: int | None = None) -> int:
    """The most bytes a resolve answer to ``request`` (a request's dict) may have, from its public
    shape: every query row (``rows``, ``reports``, ``n_query_rows`` or ``query_labels``) answers at
    most ``k'`` candidates (its ``shortlist``, else ``k``), each with its ``code_bytes`` of codes,
    ``n_features`` raw features (8 bytes as msgpack floats, 32 as JSON text at most), its payload
    (``payload_bytes``: the collection's bound when it publishes one, as it may travel:
    :func:`~pm_vector.protocol.location.payload_wire_bytes` + 64; else
    :data:`PAYLOAD_ALLOWANCE`) and :data:`CANDIDATE_OVERHEAD`; plus :data:`ANSWER_OVERHEAD`."""
    if not isinstance(request, dict):
        raise InvalidInputError("answer_cap needs the request's dict (request.to_dict()).")
    rows = request.get("rows")
    n = len(rows) if isinstance(rows, list) else None
    if n is None:
        for key in ("reports", "query_labels"):
            if isinstance(request.get(key), list):
                n = len(request[key])
                break
    if n is None:
        n = int(request.get("n_query_rows") or 1)
    shortlist = int(request.get("shortlist") or request.get("candidates") or k)  # a location request names candidates
    code_bytes = code_bytes if code_bytes is not None else request.get("code_bytes")
    per = CANDIDATE_OVERHEAD + 2 * int(code_bytes or 0) + 32 * int(n_features or 0)
    per += payload_wire_bytes(int(payload_bytes)) + 64 if payload_bytes is not None else PAYLOAD_ALLOWANCE
    return ANSWER_OVERHEAD + max(1, n) * max(1, shortlist) * per


def answer_bounds(max_bytes: int) -> dict[str, int]:
    """The decoder's bounds (:func:`~pm_vector.protocol.codec.decode_bounded`) of an answer of at
    most ``max_bytes`` bytes: one list or map per :data:`BYTES_PER_CONTAINER` bytes (at least
    4,096), no list or map or array longer than the body's bytes."""
    return {"max_bytes": int(max_bytes), "max_containers": max(4096, int(max_bytes) // BYTES_PER_CONTAINER),
            "max_items": int(max_bytes), "max_elements": int(max_bytes)}


#: what reading a malformed document raises in Python (a missing key, a wrong type, a bad number)
RAW_ERRORS = (LookupError, TypeError, ValueError, ArithmeticError, AttributeError)


@contextmanager
def malformed_answer(what: str):
    """Inside: reading ``what`` (a server's document); a raw error (:data:`RAW_ERRORS`, not a
    :class:`~pm_vector.errors.PMVectorError`) becomes one :class:`MalformedAnswerError`."""
    try:
        yield
    except PMVectorError:
        raise
    except RAW_ERRORS as exc:
        raise MalformedAnswerError(f"{what} is malformed ({type(exc).__name__}: {_printable(exc, 200)}); nothing "
                                   "of it was used.") from exc


def _printable(text: str, limit: int = 500) -> str:
    """A server's text as a message may show it: printable characters only, at most ``limit``."""
    return "".join(ch if ch.isprintable() else " " for ch in str(text)[:limit])


# ----------------------------------------------------------------------------- one deadline per exchange

class _Clock(threading.local):
    """Per thread: the current exchange's deadline (``time.monotonic()``) and the bytes of it
    written so far."""

    deadline: float | None = None
    written: int = 0

    def clamp(self, timeout: float | None, exc: type[Exception]) -> float | None:
        if self.deadline is None:
            return timeout
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise exc("the exchange's deadline passed")
        return left if timeout is None else min(float(timeout), left)


def _deadline_transport(clock: _Clock):
    """An :class:`httpx.HTTPTransport` whose every connect, TLS handshake, read and write waits at
    most until ``clock``'s deadline, and that counts the bytes it writes."""
    class Stream(httpcore.NetworkStream):
        def __init__(self, inner):
            self._inner = inner

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self._inner.read(max_bytes, clock.clamp(timeout, httpcore.ReadTimeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            t = clock.clamp(timeout, httpcore.WriteTimeout)
            clock.written += len(buffer)  # counted before it may leave: "nothing written" is a proof
            self._inner.write(buffer, t)

        def close(self) -> None:
            self._inner.close()

        def start_tls(self, ssl_context, server_hostname=None, timeout=None):
            return Stream(self._inner.start_tls(ssl_context, server_hostname,
                                                clock.clamp(timeout, httpcore.ConnectTimeout)))

        def get_extra_info(self, info: str) -> Any:
            return self._inner.get_extra_info(info)

    class Backend(httpcore.NetworkBackend):
        def __init__(self):
            self._inner = httpcore.SyncBackend()

        def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
            return Stream(self._inner.connect_tcp(host, port, clock.clamp(timeout, httpcore.ConnectTimeout),
                                                  local_address=local_address, socket_options=socket_options))

        def connect_unix_socket(self, path, timeout=None, socket_options=None):
            return Stream(self._inner.connect_unix_socket(path, clock.clamp(timeout, httpcore.ConnectTimeout),
                                                          socket_options=socket_options))

        def sleep(self, seconds: float) -> None:
            self._inner.sleep(seconds)

    class DeadlineTransport(httpx.HTTPTransport):
        def __init__(self):
            super().__init__()
            limits = httpx.Limits()
            self._pool = httpcore.ConnectionPool(
                ssl_context=httpx.create_ssl_context(), max_connections=limits.max_connections,
                max_keepalive_connections=limits.max_keepalive_connections,
                keepalive_expiry=limits.keepalive_expiry, network_backend=Backend())

    return DeadlineTransport()


class Transport:
    """The plumbing of a service client: ``self._http`` (an :class:`httpx.Client`, made by
    :meth:`_http_client`) and ``self._media`` (the media type bodies are sent in) are set by the
    client's ``__init__``."""

    #: the byte cap of an answer whose shape is not published (module doc); set it on a client
    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES
    _clock: _Clock | None = None

    @property
    def _local(self) -> threading.local:
        tls = self.__dict__.get("_tls")
        if tls is None:
            tls = self.__dict__.setdefault("_tls", threading.local())
        return tls

    @property
    def _scope(self) -> dict | None:
        """This thread's current query (:meth:`_query_scope`), or None."""
        return getattr(self._local, "scope", None)

    @_scope.setter
    def _scope(self, value: dict | None) -> None:
        self._local.scope = value

    @property
    def _answers(self) -> int:
        """Answers this thread has received (a raw error after one is the answer's fault)."""
        return getattr(self._local, "answers", 0)

    @_answers.setter
    def _answers(self, value: int) -> None:
        self._local.answers = value

    def _http_client(self, base_url: str, headers: dict[str, str], timeout: float, transport=None):
        """The client's :class:`httpx.Client`: ``timeout`` is each exchange's one deadline (module
        doc; enforced inside every read and write unless a ``transport`` of the caller's is given,
        and then between the answer's chunks); answers asked for without a content encoding."""
        self._deadline_s = float(timeout)
        if transport is None:
            self._clock = _Clock()
            transport = _deadline_transport(self._clock)
        headers = {**headers, "Accept-Encoding": "identity"}
        return httpx.Client(base_url=base_url, headers=headers, timeout=timeout, transport=transport,
                            follow_redirects=False)

    def close(self) -> None:
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, doc: Any = None) -> Any:
        """The answer of one request (``doc``: its body, a document sent in :attr:`wire`). Inside a
        query (:meth:`_query_scope`) a GET is asked once and its answer kept."""
        scope = self._scope
        if scope is not None and method == "GET" and path in scope["gets"]:
            return scope["gets"][path]
        res = self._exchange(method, path, doc)[0]
        if scope is not None and method == "GET":
            scope["gets"][path] = res
        return res

    def _query_get(self, path: str) -> Any:
        """The answer the current query already has for ``GET path`` (None: none; nothing is asked)."""
        scope = self._scope
        return None if scope is None else scope["gets"].get(path)

    def _exchange(self, method: str, path: str, doc: Any = None, *,
                  max_bytes: int | None = None) -> tuple[Any, int, int]:
        """``(answer, bytes_sent, bytes_received)`` of one request (see :func:`wire_bytes`), the
        answer streamed up to ``max_bytes`` (None: :attr:`max_document_bytes`) within one deadline."""
        cap = int(self.max_document_bytes if max_bytes is None else max_bytes)
        kw: dict[str, Any] = {}
        if doc is not None:
            kw = {"content": encode(doc, self._media), "headers": {"Content-Type": self._media}}
        clock = self._clock
        deadline = time.monotonic() + getattr(self, "_deadline_s", 60.0)
        scope = self._scope
        if scope is not None:  # one query: all its exchanges within one timeout
            deadline = min(deadline, scope["deadline"])
        if clock is not None:
            clock.deadline, clock.written = deadline, 0
        try:
            with self._http.stream(method, path, **kw) as r:
                body = self._read(r, cap, deadline)
                r._content = body  # the bytes read stay readable on the response (event hooks)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            if clock is None or clock.written == 0:
                self._withdraw_unsent(exc)
            self._settle()
            raise
        except BaseException:
            self._settle()
            raise
        finally:
            if clock is not None:
                clock.deadline = None
        self._settle()
        sent, received = wire_bytes(r)
        self.last_exchange = {"path": path, "bytes_sent": sent, "bytes_received": received}
        self._answers += 1
        return self._answer(r, body, cap), sent, received

    @staticmethod
    def _read(r, cap: int, deadline: float) -> bytes:
        """The answer's body as it arrived, refused past ``cap`` bytes, in a content encoding, or
        after ``deadline``."""
        enc = (r.headers.get("content-encoding") or "identity").strip().lower()
        if enc != "identity":
            raise MalformedAnswerError(f"the answer came in Content-Encoding {_printable(enc, 40)!r}; this client asks "
                                       "for identity and reads nothing else (an encoded body may expand past any "
                                       "bound).", r.status_code)
        declared = r.headers.get("content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > cap:
            raise MalformedAnswerError(f"the answer declares {int(declared):,} bytes; at most {cap:,} are read here.",
                                       r.status_code, "too_large")
        buf = bytearray()
        for chunk in r.iter_raw():
            buf += chunk
            if len(buf) > cap:
                raise MalformedAnswerError(f"the answer passed {cap:,} bytes; refused before more was read.",
                                           r.status_code, "too_large")
            if time.monotonic() > deadline:
                raise httpx.ReadTimeout("the exchange's deadline passed while its answer was still arriving",
                                        request=r.request)
        return bytes(buf)

    @staticmethod
    def _answer(r, body: bytes, cap: int) -> Any:
        """The document of a 2xx answer (a map), or the :class:`ServiceError` of any other."""
        media = (r.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
        media = MSGPACK if media == MSGPACK else JSON
        status = r.status_code
        if not 200 <= status < 300:
            if 300 <= status < 400:
                where = _printable(r.headers.get("location") or "elsewhere", 200)
                raise ServiceError(status, "redirect", f"the service answered {status} (to {where}); a client sends "
                                   "its request to the server it was given and nowhere else: give the service's "
                                   "own URL.")
            try:
                doc = decode_bounded(body, media, **answer_bounds(min(cap, 1 << 20))) if body else None
            except InvalidInputError:
                doc = None
            if isinstance(doc, dict):
                raise ServiceError(status, _printable(doc.get("error", "error"), 80),
                                   _printable(doc.get("message", body[:500].decode("utf-8", "replace"))))
            raise ServiceError(status, "error", _printable(body[:500].decode("utf-8", "replace")) or
                               f"the service answered {status} without a message.")
        if not body:
            raise MalformedAnswerError("the answer is empty; a document was expected.", status)
        try:
            doc = decode_bounded(body, media, **answer_bounds(cap))
        except TooLargeError as exc:
            raise MalformedAnswerError(f"the answer ({media}) is over this client's bounds: {exc}", status,
                                       "too_large") from None
        except InvalidInputError as exc:
            raise MalformedAnswerError(f"the answer ({media}) cannot be read: {exc}", status) from None
        if not isinstance(doc, dict):
            raise MalformedAnswerError(f"the answer is a {type(doc).__name__}, not a map of the protocol.", status)
        return doc

    # ------------------------------------------------------------------ one query
    @contextmanager
    def _query_scope(self, *, discard: bool = True):
        """One query: its GETs asked once each (:meth:`_call`), a raw error while its answers are
        read becomes a :class:`MalformedAnswerError`, and (``discard``) a charge made inside it is
        withdrawn when its request provably never left (module doc)."""
        if self._scope is not None:  # nested: the outer query's scope
            yield
            return
        budget = getattr(self, "budget", None)
        recording = budget.recording() if discard and hasattr(budget, "recording") else None
        spends = recording.__enter__() if recording is not None else None
        self._scope = {"gets": {}, "spends": spends,
                       "deadline": time.monotonic() + getattr(self, "_deadline_s", 60.0)}
        answers = self._answers
        try:
            yield
        except RAW_ERRORS as exc:
            if self._answers == answers or isinstance(exc, PMVectorError):
                raise
            with malformed_answer("an answer of the service"):
                raise
        finally:
            self._scope = None
            if recording is not None:
                recording.__exit__(None, None, None)

    def _withdraw_unsent(self, exc: BaseException) -> None:
        """Withdraw the current query's charges: its request provably never left."""
        scope = self._scope
        spends = None if scope is None else scope.get("spends")
        if spends:
            self.budget.withdraw(list(spends))
            spends.clear()
            exc.add_note("nothing of the request was written: its charge was withdrawn and its draw discarded.")

    def _settle(self) -> None:
        """Bytes may have left: the current query's charges so far are final."""
        scope = self._scope
        if scope is not None and scope.get("spends"):
            scope["spends"].clear()
