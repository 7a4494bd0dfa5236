"""The public path of :mod:`glmfb.core.targets`, for code outside glmfb (a probe or a rule in
another package): the same objects, re-exported."""

from glmfb.core.targets import *  # noqa: F403
