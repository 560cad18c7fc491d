"""torch.profiler captures of flagged steps, linked from the step spans they explain.

`config` says what to capture, `capture` is the model of one output file and its summary,
`torch_driver` starts and stops torch.profiler from the ledger's step hooks.
"""
