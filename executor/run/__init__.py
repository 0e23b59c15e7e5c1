"""A run: the engine and its pieces (run options, run folder, scheduler, attempts), resume, and what a run
keeps in its folder (state, audit log, seal, events and their models, the emitter).
"""
