"""The training loop's components: distributed setup, schedule, checkpoints, metrics."""
