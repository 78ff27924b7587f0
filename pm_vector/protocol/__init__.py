"""The wire protocol, below both the client and the server: how documents travel (:mod:`.codec`)."""

from .codec import JSON, MSGPACK, MEDIA_TYPES, decode, encode

__all__ = ["JSON", "MSGPACK", "MEDIA_TYPES", "decode", "encode"]
