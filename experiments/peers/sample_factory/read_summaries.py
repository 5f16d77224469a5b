"""Print, as JSON, Sample Factory's last whole-game training mean and its frames, from its
TensorBoard summaries: `policy_stats/avg_RecordEpisodeStatistics_reward` (the mean of the last
--stats_avg games, as the env's RecordEpisodeStatistics saw them: raw scores, every life). Its
stdout's `Avg episode reward` is another figure in games with lives: the clipped reward of each
life, since its example's EpisodicLifeEnv ends an episode at every lost life."""
import json
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TAG = "policy_stats/avg_RecordEpisodeStatistics_reward"

mean, frames = None, 0
for events in sorted(Path(sys.argv[1]).rglob("events.out.tfevents.*")):
    accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
    accumulator.Reload()
    if TAG in accumulator.Tags()["scalars"]:
        last = accumulator.Scalars(TAG)[-1]
        if last.step >= frames:
            mean, frames = last.value, last.step
print(json.dumps({"mean": mean, "frames": frames}))
