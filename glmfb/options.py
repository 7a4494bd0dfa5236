"""The public path of :mod:`glmfb.contract.options`, for code outside glmfb (a probe or a rule in
another package): the same objects, re-exported."""

from glmfb.contract.options import *  # noqa: F403
