"""Environments: making any Gymnasium env (`make`), the Atari frames and protocol (`atari`), and
observations of any kind packed into one vector (`observations`)."""
