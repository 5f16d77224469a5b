"""What a run writes and reads: atomic writes and how a write fails (`atomic`), the run
directory, checkpoints, meta.json, the CSV logs (`logs.load_run`) and the writers behind them."""
