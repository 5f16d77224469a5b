"""The exit statuses of the trainer and the tools, defined once.

A module of its own with no imports: `train.py` needs them before torch loads (see its
docstring), which `stop_rules.py` cannot offer.
"""

EXIT_OK = 0  # a budget or the target reached; a tool that did its job
EXIT_FAILED = 1  # a failure during the run (see stop_rules.py)
EXIT_USAGE = 2  # bad input, or a request this install cannot carry out (a missing extra): nothing done
EXIT_SIGINT = 130  # 128 + SIGINT, as a shell reports it
EXIT_SIGTERM = 143  # 128 + SIGTERM
