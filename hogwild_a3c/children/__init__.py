"""The child processes and what links them to the main process: the worker, the evaluator, the
shared state (the only way children touch training state), messages and reports, process
hygiene, and the supervisor that starts, restarts and stops them."""
