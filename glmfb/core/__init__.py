"""The probe API and the harness, the layer above the contract: the probe protocol and the
registry of probes, rules, targets, the host boundary, the supervised child process and its
tree, the run folder, suites' shards, the statistics every engine shares (``measure``) and
plotting. It imports the contract and itself, never an engine."""
