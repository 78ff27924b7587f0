"""The client side: building PrivateMail requests and keeping the client's secret."""

from .privatemail import PrivateMail, PublicAnchor, frame_params, paper_protocol_guarantee
from .request import ClientSecret, PrivateMailRequest

__all__ = ["ClientSecret", "PrivateMail", "PrivateMailRequest", "PublicAnchor", "frame_params", "paper_protocol_guarantee"]
