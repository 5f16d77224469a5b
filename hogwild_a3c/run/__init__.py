"""The main process: preparing a run (`prepare`), the session, the run loop that hands events to
observers, user callbacks, the stop rules (budgets, signals, exit codes), the recorder, presets."""
