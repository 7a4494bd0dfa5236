"""The public path of :mod:`glmfb.contract.step`, for code outside glmfb (a probe or a rule in
another package): the same objects, re-exported."""

from glmfb.contract.step import *  # noqa: F403
