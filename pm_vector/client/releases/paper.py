"""The client plan of the paper's protocol (``protocol="privatemail_paper"``,
:class:`~pm_vector.client.privatemail.PrivateMail`): the request on the collection's verified
anchor frame, the answer one list per row (raw features when the collection allows them and the
query re-ranks), the real row re-ranked by them. Its rows are the server's post-processing: the
answer is read as it comes (no ``k'`` bound of the pm_vector protocol)."""

from __future__ import annotations

import numpy as np

from ...errors import InvalidInputError
from ..privatemail import PrivateMail
from .class_rows import RowsQuery


class PaperQuery(RowsQuery):
    """One query of the paper's protocol."""

    release = "privatemail_paper"
    protocol = "privatemail_paper"
    takes_options = True
    truncate = False

    def _answer_shape(self) -> dict:
        allow_raw = bool(self.docs.collection(self.q.name).get("allow_raw_features"))
        return {"include_features": bool(self.q.rerank and allow_raw)}

    def build(self, features, label=None, rng=None):
        q = self.q
        if label is None:
            raise InvalidInputError("the paper's protocol needs the query's label.")
        frame, anchor, _ = self.docs.frame(q.name)
        pm = PrivateMail(frame, epsilon=q.epsilon, delta=q.delta, accountant=None if rng is not None else self.account,
                         _rng=rng, **q.options)
        return pm.request(np.asarray(features, dtype=np.float64), int(label), anchor, collection=q.name)

    def check(self, res: dict, req):
        return res.get("rows")
