"""The public path of :mod:`glmfb.contract.verdict`, for code outside glmfb (a probe or a rule in
another package): the same objects, re-exported."""

from glmfb.contract.verdict import *  # noqa: F403
