"""The public path of :mod:`glmfb.core.plotting`, for code outside glmfb (a probe or a rule in
another package): the same objects, re-exported."""

from glmfb.core.plotting import *  # noqa: F403
