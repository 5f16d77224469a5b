"""What learns: the A3C maths (`algo`), the actor-critic (`model`, `encoders`), the action
distributions, the rollout a worker collects, the learner that turns it into an update, the
optimizers and the learn step's precision."""
