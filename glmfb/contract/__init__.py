"""The contract, glmfb's lowest layer: the verdict and its evidence, errors and exit codes,
units, options, the clock and the step. It knows no probe: it reads the evidence kinds it is
given. Everything else in glmfb may import it; it imports nothing of glmfb's above it."""
