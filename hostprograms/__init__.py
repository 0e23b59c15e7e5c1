"""Programs that run ON THE HOST, one module each, sharing `kit` (stdlib only).

They are not step kinds: `executor.stepkind.step_kinds()` never imports them. A kind ships one with
`executor.hostprogram.host_program()`, which bundles the program, the kit and a `__main__` into one zip
and runs it with the host's interpreter; see `kit` for the contract both sides keep.
"""
