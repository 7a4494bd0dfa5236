"""The public path of :mod:`glmfb.core.rules`, for code outside glmfb (a probe or a rule in
another package): the same objects, re-exported."""

from glmfb.core.rules import *  # noqa: F403
