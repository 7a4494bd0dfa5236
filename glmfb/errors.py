"""The public path of :mod:`glmfb.contract.errors`, for code outside glmfb (a probe or a rule in
another package): the same objects, re-exported."""

from glmfb.contract.errors import *  # noqa: F403
