"""Personal client state: the personalized process template and its store."""
