"""The public path of :mod:`glmfb.core.probe`, for code outside glmfb (a probe or a rule in
another package): the same objects, re-exported."""

from glmfb.core.probe import *  # noqa: F403
