"""The rollout: plan, lock, batches of drain + apply + health/release gates, rollback, audit; start/stop of instances (lifecycle) and their first journal error."""
