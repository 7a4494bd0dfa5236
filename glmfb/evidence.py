"""The public path of :mod:`glmfb.contract.evidence`, for code outside glmfb (a probe or a rule in
another package): the same objects, re-exported."""

from glmfb.contract.evidence import *  # noqa: F403
